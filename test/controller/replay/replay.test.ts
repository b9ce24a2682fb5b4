import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Replica } from "../../../catalog/replica.ts";
import { readDecisions } from "../../../controller/replay/records.ts";
import { replay } from "../../../controller/replay/replay.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { promptOf } from "../../worker/restore/harness.ts";
import { tinyModel } from "../../worker/runtime/fixture.ts";
import { type InProcessFleet, startFleet } from "../fleet-harness.ts";

/**
 * Replay of a seeded run: an in-process fleet (two workers, real runtimes,
 * durable caches and agents, the embedded catalog on disk) serves a seeded
 * sequence of requests over three shared prefixes; its decision records are
 * read back from the catalog and replayed through the simulator.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
let fleet: InProcessFleet;

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
  fleet = await startFleet(model, { workers: 2 });
  // Three shared 400-token prefixes, each request adding its own 20 tokens; two at a time.
  const prefixes = [1, 2, 3].map((s) => promptOf(400, 100 + s));
  let x = 12345;
  const order = Array.from({ length: 12 }, () => {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    return x % 3;
  });
  for (let i = 0; i < order.length; i += 2) {
    await Promise.all(
      order
        .slice(i, i + 2)
        .map((p, j) => fleet.generate([...prefixes[p]!, ...promptOf(20, 1000 + i + j)], 3)),
    );
  }
  await fleet.recorder.flush();
  // The writer applies the last proposals after they are appended: wait until the controller's replica has them.
  const deadline = Date.now() + 30_000;
  while (readDecisions(fleet.replica.catalog).decisions.filter((d) => d.attempt === 1).length < 12) {
    if (Date.now() > deadline) throw new Error("the decision records were not applied in 30 s");
    await new Promise((r) => setTimeout(r, 20));
  }
}, 300_000);

afterAll(async () => {
  await fleet?.close();
  await cleanupModel?.();
});

async function recorded() {
  const replica = await Replica.start({ log: fleet.log });
  try {
    await replica.catchUp(30_000);
    return readDecisions(replica.catalog);
  } finally {
    await replica.stop();
  }
}

const run = promisify(execFile);
const BIN = new URL("../../../bin/continuum.mjs", import.meta.url).pathname;

describe("continuum replay", () => {
  it("records every decision with the router's inputs and the measured split", async () => {
    const { decisions, withoutInputs } = await recorded();
    expect(withoutInputs).toBe(0);
    expect(decisions.filter((d) => d.attempt === 1)).toHaveLength(12);
    for (const d of decisions) {
      expect(d.text.context!.workers.map((w) => w.id).sort()).toEqual(["fw-0", "fw-1"]);
      expect(d.text.context!.chain.length).toBe(3);
      expect(d.text.measured!.ttftMs).toBeGreaterThan(0);
      const t = d.text.measured!.terms!;
      expect(t.queueMs + t.fetchMs + t.prefillMs).toBeGreaterThan(0);
    }
  });

  it("replays the recorded decisions to the same predictions, and a changed weight changes them", async () => {
    const a = replay((await recorded()).decisions, { seed: 7 });
    const b = replay((await recorded()).decisions, { seed: 7 });
    expect(a).not.toBeNull();
    expect(b).toEqual(a);
    expect(a!.requests).toBe(12);
    expect(Object.keys(a!.variants).sort()).toEqual(["live", "prefix", "round_robin"]);
    for (const v of Object.values(a!.variants)) expect(v.completed).toBe(12);
    expect(a!.error.measured).toBeGreaterThanOrEqual(12);
    expect(a!.error.terms.prefill.n).toBeGreaterThan(0);

    // The weighted variant runs on the same world with the changed weights; the live one is untouched.
    const w = replay((await recorded()).decisions, { seed: 7, weights: { prefill: 0 } })!;
    expect(w.variants.live).toEqual(a!.variants.live);
    expect(w.variants.weighted!.weights).toEqual({ ...a!.variants.live!.weights, prefill: 0 });
    expect(w.variants.weighted!.completed).toBe(12);
  });

  it("is the command's report: continuum replay --log FILE --json", async () => {
    const lib = replay((await recorded()).decisions, { seed: 7, weights: { fetch: 2 } });
    const { stdout } = await run(
      process.execPath,
      [BIN, "replay", "--log", fleet.logPath, "--seed", "7", "--weight", "fetch=2", "--json"],
      { timeout: 120_000 },
    );
    expect(JSON.parse(stdout.trim().split("\n").at(-1)!)).toEqual({ ...lib, withoutInputs: 0 });
    await expect(
      run(process.execPath, [BIN, "replay", "--log", fleet.logPath, "--weight", "speed=2"]),
    ).rejects.toThrow(/unknown term 'speed'/);
  });
});
