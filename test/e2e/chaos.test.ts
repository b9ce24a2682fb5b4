import { randomInt } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { EmbeddedTarget } from "../../deploy/chaos/embedded.ts";
import { FleetTarget } from "../../deploy/chaos/fleet.ts";
import { type ChaosReport, formatReport, runChaos } from "../../deploy/chaos/run.ts";
import type { ChaosTarget } from "../../deploy/chaos/target.ts";
import { tail } from "../../deploy/cluster.ts";
import { freePort, freePortPair } from "../ports.ts";

/**
 * The chaos suite: real processes under a seeded plan of faults while a
 * steady workload runs (kill -9 of each role, a second process on a data
 * dir, the disk filled and freed, S3 paused and resumed; malformed, slow and
 * idle clients throughout), then the invariants (deploy/chaos/run.ts). The
 * seed is printed first; CONTINUUM_CHAOS_SEED=N runs the same plan again.
 * Bounded: 30 s of faults on the embedded default and 45 s on the fleet,
 * plus start-up and the checks (about three minutes in all on 2 cores).
 */

const SEED = process.env.CONTINUUM_CHAOS_SEED
  ? Number(process.env.CONTINUUM_CHAOS_SEED)
  : randomInt(1, 2 ** 31);
process.stderr.write(`chaos suite: seed ${SEED} (CONTINUUM_CHAOS_SEED=${SEED} to reproduce)\n`);

const dirs: string[] = [];
const targets: ChaosTarget[] = [];
afterAll(async () => {
  for (const t of targets) await t.close();
  if (!process.env.CONTINUUM_KEEP_CHAOS_LOGS)
    for (const d of dirs) await rm(d, { recursive: true, force: true });
}, 120_000);

function printed(r: ChaosReport, t: ChaosTarget): ChaosReport {
  process.stderr.write(`${formatReport(r)}\n${JSON.stringify(r)}\n`);
  if (!r.ok) for (const log of t.logs()) process.stderr.write(`== ${log}\n${tail(log, 25)}\n`);
  return r;
}

describe("chaos (real processes, seeded)", () => {
  it("the embedded default (`continuum serve`): every invariant holds after kill -9s, a second owner, a full disk and a paused S3", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-chaos-embedded-"));
    dirs.push(dir);
    const t = await EmbeddedTarget.start({
      dir,
      port: await freePort(),
      ...(process.env.CONTINUUM_S3_ENDPOINT ? { s3Endpoint: process.env.CONTINUUM_S3_ENDPOINT } : {}),
      bucket: `chaos-${SEED}`,
      progress: (l) => process.stderr.write(`chaos: ${l}\n`),
    });
    targets.push(t);
    const r = printed(
      await runChaos(t, {
        seed: SEED,
        durationMs: 30_000,
        faults: 6,
        clients: 3,
        progress: (l) => process.stderr.write(`chaos: ${l}\n`),
      }),
      t,
    );
    expect(r.verdicts.filter((v) => !v.ok)).toEqual([]);
    expect(r.kills.serve).toBeGreaterThanOrEqual(1);
    expect(r.requests.good.ok).toBeGreaterThan(0);
  }, 300_000);

  it("the local fleet (`cluster up`): every invariant holds after kill -9 of each role, a second worker on a data dir, a full disk and a paused S3", async () => {
    const brokers = process.env.CONTINUUM_KAFKA_BROKERS;
    const s3 = process.env.CONTINUUM_S3_ENDPOINT;
    if (!brokers || !s3) throw new Error("the fleet case needs the broker and S3 server test/setup/ starts");
    const dir = await mkdtemp(join(tmpdir(), "continuum-chaos-fleet-"));
    dirs.push(dir);
    const progress = (l: string) => process.stderr.write(`chaos: ${l}\n`);
    const t = await FleetTarget.start({
      dir,
      brokers: brokers.split(",")[0]!,
      s3Endpoint: s3,
      ports: { http: await freePort(), workerSocket: await freePort(), peerBase: await freePortPair() },
      progress,
    });
    targets.push(t);
    // Eight faults cover the five roles' kills and the three other kinds.
    const r = printed(
      await runChaos(t, { seed: SEED, durationMs: 45_000, faults: 8, clients: 3, progress }),
      t,
    );
    expect(r.verdicts.filter((v) => !v.ok)).toEqual([]);
    expect(Object.keys(r.kills).sort()).toEqual([...t.roles].sort());
  }, 420_000);
});
