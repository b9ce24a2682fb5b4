import { appendFile, mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { crc32 } from "node:zlib";
import { afterAll, describe, expect, it } from "vitest";
import { type SmallFs, smallFs } from "../../deploy/small-fs.ts";
import { freePort } from "../ports.ts";
import { continuum, type ServeProcess, serveExpectingExit, startServe } from "./serve-process.ts";

/**
 * Start-up of the real `continuum serve` process on a data dir in each state
 * that used to wedge it or break it for good: another process owning it, a
 * model change, a full disk, a catalog log two writers interleaved, an
 * unreachable S3. Each either starts (degraded: one log line, a metric) or
 * fails fast with the cause in its message.
 */

/** A fail-fast bound: start-up of the tiny model takes ~3 s here; a wedge waited 30 s. */
const FAIL_FAST_MS = 20_000;

const dirs: string[] = [];
const servers: ServeProcess[] = [];
afterAll(async () => {
  for (const s of servers) await s.stop();
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

async function freshDir(tag: string): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), `continuum-startup-${tag}-`));
  dirs.push(d);
  return d;
}

async function serve(env: Record<string, string>): Promise<ServeProcess> {
  const s = await startServe({ CONTINUUM_PAGES_PHYSICAL_PAGES: "64", ...env });
  servers.push(s);
  return s;
}

async function stop(s: ServeProcess): Promise<void> {
  servers.splice(servers.indexOf(s), 1);
  await s.stop();
}

/** 300 prompt tokens: one whole 256-token chunk (checkpointed) plus a tail. */
const PROMPT = Array.from({ length: 300 }, (_, i) => ((i * 7) % 500) + 1);

async function complete(s: ServeProcess, model = "tiny"): Promise<{ cached: number; text: string }> {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt: PROMPT, max_tokens: 4, temperature: 0 }),
  });
  expect(r.status).toBe(200);
  const body = (await r.json()) as {
    choices: { text: string }[];
    usage: { prompt_tokens_details: { cached_tokens: number } };
  };
  return { cached: body.usage.prompt_tokens_details.cached_tokens, text: body.choices[0]!.text };
}

async function query(s: ServeProcess, q: string): Promise<unknown> {
  const r = await fetch(`${s.url}/v1/catalog/query`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ query: q }),
  });
  expect(r.status).toBe(200);
  return ((await r.json()) as { result: unknown }).result;
}

/** Waits (bounded) until the catalog holds a ready replica in `tier`. */
async function replicaIn(s: ServeProcess, tier: string): Promise<void> {
  const q = `[:find (count ?r) . :where [?r :replica/tier "${tier}"] [?r :replica/state "ready"]]`;
  const deadline = Date.now() + 30_000;
  while (Number((await query(s, q)) ?? 0) < 1) {
    if (Date.now() > deadline) throw new Error(`no ready ${tier} replica after 30 s`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** One embedded-log frame (catalog/embedded-file.ts's format, written out here on purpose). */
function logFrame(type: number, payload: Buffer): Buffer {
  const out = Buffer.alloc(9 + payload.length);
  out.writeUInt32LE(payload.length, 0);
  out.writeUInt8(type, 8);
  payload.copy(out, 9);
  out.writeUInt32LE(crc32(out.subarray(8)), 4);
  return out;
}

describe("serve start-up on a troubled data dir (real processes)", () => {
  it("a second serve on the same data dir is refused at once, naming the owner's pid; the owner keeps serving and restarts cleanly", async () => {
    const dataDir = await freshDir("second");
    const first = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
    await complete(first);
    await replicaIn(first, "ssd");
    const log = join(dataDir, "catalog", "embedded.log");
    const before = (await stat(log)).size;
    // The case: the same data dir and the same port.
    const second = await serveExpectingExit({ CONTINUUM_STORE_DATA_DIR: dataDir }, FAIL_FAST_MS, first.port);
    expect(second.code).toBe(1);
    expect(second.output).toMatch(new RegExp(`data dir .* is in use by pid ${first.child.pid}\\b`));
    expect(second.output).not.toMatch(/EADDRINUSE/);
    expect((await stat(log)).size).toBe(before);
    // The owner still serves and writes its catalog.
    expect((await complete(first)).cached).toBeGreaterThanOrEqual(256);
    await stop(first);
    const again = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
    expect((await complete(again)).cached).toBe(256);
    await stop(again);
  });

  it("a model change on the same data dir starts at once and serves the new model", async () => {
    const dataDir = await freshDir("model");
    const first = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
    await complete(first);
    await replicaIn(first, "ram");
    await stop(first);
    const other = join(await freshDir("model-b"), "tiny-b");
    const init = await continuum(["model", "init", "--preset", "tiny", "--seed", "2", "--out", other]);
    expect(init.code, init.stderr).toBe(0);
    const t0 = performance.now();
    const changed = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir, CONTINUUM_MODEL_DIR: other });
    expect(performance.now() - t0).toBeLessThan(FAIL_FAST_MS);
    const models = (await (await fetch(`${changed.url}/v1/models`)).json()) as { data: { id: string }[] };
    const r = await complete(changed, models.data[0]!.id);
    // Nothing of the old model is reused, and its RAM replicas are withdrawn.
    expect(r.cached).toBe(0);
    const ram = await query(
      changed,
      '[:find (count ?r) . :where [?r :replica/tier "ram"] [?r :replica/state "ready"] [?r :replica/chunk ?c] [?c :chunk/model ?m] [?m :model/name "tiny"]]',
    );
    expect(ram ?? 0).toBe(0);
    await stop(changed);
  });

  const fs = smallFs(16 << 20);
  const noFs = "unavailable" in fs ? fs.unavailable : undefined;
  if (noFs) console.warn(`serve-startup: full-disk case skipped: ${noFs}`);
  afterAll(() => {
    if (!noFs) (fs as SmallFs).unmount();
  });

  it.skipIf(noFs !== undefined)(
    "a full disk fails start-up fast, naming the full file system and the data dir; once space is freed it starts",
    async () => {
      const small = fs as SmallFs;
      const dataDir = join(small.dir, "data");
      const first = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
      await complete(first);
      // The checkpoint is written in the background: stopping before it is ready raced it.
      await replicaIn(first, "ssd");
      await stop(first);
      small.fill();
      const full = await serveExpectingExit({ CONTINUUM_STORE_DATA_DIR: dataDir }, FAIL_FAST_MS);
      expect(full.code).toBe(1);
      expect(full.output).toMatch(/no space left/i);
      expect(full.output).toContain(dataDir);
      expect(full.output).not.toMatch(/not registered within|MaxListenersExceeded/);
      small.free();
      const again = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
      expect((await complete(again)).cached).toBe(256);
      const metrics = await (await fetch(`${again.url}/metrics`)).text();
      expect(metrics).toMatch(/^continuum_degraded\{reason="disk_full"\} 0$/m);
      await stop(again);
    },
  );

  it("a catalog log two writers interleaved fails fast naming the repair; `continuum catalog repair` mends it and it starts", async () => {
    const dataDir = await freshDir("broken");
    const first = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
    await complete(first);
    await replicaIn(first, "ssd");
    await stop(first);
    // What a second writer leaves: a proposal, then a commit at a stale proposal offset (consumed 0).
    const commit = Buffer.alloc(16);
    commit.writeDoubleLE(0, 0);
    const log = join(dataDir, "catalog", "embedded.log");
    await appendFile(log, Buffer.concat([logFrame(1, Buffer.from("stray")), logFrame(2, commit)]));
    const broken = await serveExpectingExit({ CONTINUUM_STORE_DATA_DIR: dataDir }, FAIL_FAST_MS);
    expect(broken.code).toBe(1);
    expect(broken.output).toMatch(/second process appended/);
    expect(broken.output).toContain(`continuum catalog repair --dir ${dataDir}`);
    const repair = await continuum(["catalog", "repair", "--dir", dataDir]);
    expect(repair.code, repair.stderr).toBe(0);
    expect(repair.stdout).toMatch(/dropped 1 commit/);
    expect(repair.stdout).toMatch(/before-repair/);
    const again = await serve({ CONTINUUM_STORE_DATA_DIR: dataDir });
    expect((await complete(again)).cached).toBe(256);
    // The repair refuses a data dir in use.
    const busy = await continuum(["catalog", "repair", "--dir", dataDir]);
    expect(busy.code).toBe(1);
    expect(busy.stderr).toMatch(new RegExp(`in use by pid ${again.child.pid}\\b`));
    await stop(again);
  });

  it("an unreachable S3 starts degraded: one log line naming it, a metric, and requests served", async () => {
    const dataDir = await freshDir("s3");
    const s = await serve({
      CONTINUUM_STORE_DATA_DIR: dataDir,
      CONTINUUM_STORE_S3_ENABLED: "true",
      CONTINUUM_STORE_S3_ENDPOINT: `http://127.0.0.1:${await freePort()}`,
      CONTINUUM_STORE_S3_CREATE_BUCKET: "true",
    });
    await complete(s);
    const lines = s.logs
      .join("")
      .split("\n")
      .filter((l) => l.includes('"store.s3_unavailable"'));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/ECONNREFUSED/);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/^continuum_degraded\{reason="s3_unavailable"\} 1$/m);
    await stop(s);
  });
});
