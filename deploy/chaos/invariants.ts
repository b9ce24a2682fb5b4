import { openTxSource } from "../../catalog/console.ts";
import type { CatalogDb } from "../../catalog/db.ts";
import { Replica } from "../../catalog/replica.ts";
import { TxMsg, type TxRecord } from "../../schema/catalog.ts";
import type { Config } from "../../schema/config.ts";
import type { ContentId } from "../../schema/ids.ts";
import { decodeMessage } from "../../schema/wire.ts";
import { FileTier } from "../../worker/store/file.ts";
import { S3Tier } from "../../worker/store/s3.ts";
import { logEvents } from "../cluster.ts";
import { call } from "./client.ts";
import type { WorkloadFigures } from "./workload.ts";

/**
 * The invariants a chaos run ends on, each a named verdict with what it
 * found (a run prints them all, then fails on any that does not hold).
 */
export interface Verdict {
  readonly name: string;
  readonly ok: boolean;
  readonly detail: string;
}

const verdict = (name: string, ok: boolean, detail: string): Verdict => ({ name, ok, detail });

/**
 * Every request completed or failed with a reason (none hung, none an
 * unhandled exception or a bare status); malformed input got a clear 4xx.
 */
export function requestVerdicts(f: WorkloadFigures): Verdict[] {
  const internal = (failed: Record<string, number>) =>
    Object.entries(failed)
      .filter(([r]) => r.includes("(internal error)") || r.includes("(no error body)"))
      .reduce((n, [, c]) => n + c, 0);
  return [
    verdict(
      "no request hung",
      f.good.hung + f.malformed.hung + f.slow.hung === 0,
      `hung: ${f.good.hung} good, ${f.malformed.hung} malformed, ${f.slow.hung} slow`,
    ),
    verdict(
      "every failure has a reason, none an unhandled exception",
      internal(f.good.failed) + internal(f.slow.failed) === 0,
      `failures by reason: ${JSON.stringify({ ...f.good.failed })}; slow: ${JSON.stringify(f.slow.failed)}`,
    ),
    verdict(
      "malformed requests get a clear 4xx",
      Object.keys(f.malformed.wrong).length === 0,
      `${f.malformed.rejected} of ${f.malformed.count} refused clearly${Object.keys(f.malformed.wrong).length ? `; otherwise: ${JSON.stringify(f.malformed.wrong)}` : ""}`,
    ),
    verdict("good requests were served", f.good.ok > 0, `${f.good.ok} of ${f.good.count} completed`),
  ];
}

/** The catalog as its tx log holds it: every tx, and a replica db at the end. */
export async function readCatalog(
  cfg: Config,
  source: { readonly brokers?: readonly string[]; readonly logPath: string },
): Promise<{ txs: TxRecord[]; db: CatalogDb }> {
  const src = await openTxSource({ ...source, cfg });
  try {
    const end = await src.log.endOffset();
    const txs: TxRecord[] = [];
    if (end > 0) {
      let done: () => void = () => {};
      const all = new Promise<void>((r) => {
        done = r;
      });
      const sub = await src.log.subscribe(0, async (records) => {
        for (const r of records) if (r.offset < end) txs.push(decodeMessage(TxMsg, r.bytes));
        if (txs.length >= end) done();
      });
      await all;
      await sub.stop();
    }
    const replica = await Replica.start({ log: src.log, warn: () => undefined });
    await replica.waitFor(end, 60_000);
    const db = replica.catalog;
    await replica.stop();
    return { txs, db };
  } finally {
    await src.close();
  }
}

/** Nodes whose publication a worker's propose() acknowledged (its `checkpoint.published` log lines). */
export function acknowledgedNodes(logFiles: readonly string[]): Set<string> {
  const out = new Set<string>();
  for (const f of logFiles)
    for (const l of logEvents(f))
      if (l.event === "checkpoint.published" && typeof l.node === "string") out.add(l.node);
  return out;
}

/** The acknowledged chunk nodes the catalog does not hold. */
export function missingPublications(db: CatalogDb, acknowledged: ReadonlySet<string>): string[] {
  return [...acknowledged].filter((n) => db.eidOf("chunk/node", n) === undefined);
}

/** Every acknowledged catalog fact present exactly once: txs dense, each proposal applied once, each acknowledged chunk published. */
export function catalogVerdicts(
  txs: readonly TxRecord[],
  db: CatalogDb,
  acknowledged: ReadonlySet<string>,
): Verdict[] {
  const dense = txs.every((t, i) => t.txNo === i + 1);
  const ids = new Map<string, number>();
  for (const t of txs) ids.set(t.proposalId, (ids.get(t.proposalId) ?? 0) + 1);
  const twice = [...ids].filter(([, n]) => n > 1).map(([id]) => id);
  const missing = missingPublications(db, acknowledged);
  return [
    verdict(
      "the tx log is one dense history, each proposal applied once",
      dense && twice.length === 0,
      `${txs.length} txs${dense ? "" : ", numbering has gaps"}${twice.length ? `; applied twice: ${twice.slice(0, 5).join(", ")}` : ""}`,
    ),
    verdict(
      "every acknowledged chunk publication is in the catalog",
      missing.length === 0,
      `${acknowledged.size} acknowledged, ${missing.length} missing${missing.length ? `: ${missing.slice(0, 3).join(", ")}` : ""}`,
    ),
  ];
}

/** Where a worker's chunk files are, for the replica check. */
export type StoreDirOf = (worker: string) => string | undefined;

/**
 * Every ready SSD and S3 replica's object exists and verifies (content hash
 * and framing, as every read does). RAM replicas live in a process's memory
 * and are withdrawn when it restarts; they are not checked from outside.
 */
export async function replicaVerdicts(
  db: CatalogDb,
  storeDirOf: StoreDirOf,
  s3: Config["store"]["s3"] | undefined,
  endpoint: string | undefined,
): Promise<Verdict[]> {
  const ready: { worker: string; tier: string; content: ContentId }[] = [];
  for (const r of db.holders("replica/worker")) {
    if (db.get(r, "replica/state") !== "ready") continue;
    const tier = db.get(r, "replica/tier") as string;
    if (tier !== "ssd" && tier !== "s3") continue;
    const worker = db.get(db.get(r, "replica/worker") as number, "worker/id") as string;
    const content = db.get(db.get(r, "replica/chunk") as number, "chunk/content") as ContentId;
    ready.push({ worker, tier, content });
  }
  const bad: string[] = [];
  const files = new Map<string, FileTier>();
  let s3Tier: S3Tier | undefined;
  try {
    for (const r of ready) {
      try {
        if (r.tier === "ssd") {
          const dir = storeDirOf(r.worker);
          if (dir === undefined) throw new Error(`no store dir known for ${r.worker}`);
          let tier = files.get(dir);
          if (tier === undefined) {
            tier = await FileTier.open({
              dir,
              maxObjectBytes: 256 << 20,
              maxBytes: 1 << 30,
              report: () => undefined,
            });
            files.set(dir, tier);
          }
          if ((await tier.get(r.content)) === undefined) throw new Error("absent");
        } else {
          if (s3 === undefined || endpoint === undefined) throw new Error("no S3 configured");
          s3Tier ??= await S3Tier.open({
            ...s3,
            endpoint,
            createBucket: false,
            maxObjectBytes: 256 << 20,
            report: () => undefined,
          });
          if ((await s3Tier.get(r.content)) === undefined) throw new Error("absent");
        }
      } catch (err) {
        bad.push(`${r.worker}/${r.tier} ${r.content.slice(0, 12)}…: ${(err as Error).message}`);
      }
    }
  } finally {
    for (const t of files.values()) await t.close();
    await s3Tier?.close();
  }
  const by = (tier: string) => ready.filter((r) => r.tier === tier).length;
  return [
    verdict(
      "every ready replica's object exists and verifies",
      bad.length === 0,
      `${by("ssd")} SSD and ${by("s3")} S3 replicas checked${bad.length ? `; bad: ${bad.slice(0, 3).join("; ")}` : ""}`,
    ),
  ];
}

/**
 * A request of 2,040 prompt tokens (128 pages of 16, the tiny model's
 * context nearly full) through the front door: admitted and completed only
 * if no page leaked from a pool sized a little above it.
 */
export async function fullPoolRequest(
  url: string,
  model: string,
  pages: number,
): Promise<{ ok: boolean; detail: string }> {
  const prompt = Array.from({ length: 2040 }, (_, i) => ((i * 13) % 500) + 1);
  const r = await call({
    url,
    method: "POST",
    path: "/v1/completions",
    body: JSON.stringify({ model, prompt, max_tokens: 4, temperature: 0 }),
    deadlineMs: 120_000,
  });
  const what = `a request needing 128 of ${pages} pages`;
  return {
    ok: r.kind === "ok",
    detail: r.kind === "ok" ? `${what} completed` : `${what}: ${r.kind === "failed" ? r.reason : "hung"}`,
  };
}

/** Greedy output of the probe set equals the clean run's. */
export function probeVerdict(clean: readonly string[], after: readonly string[]): Verdict {
  const diff = clean.map((c, i) => (c === after[i] ? -1 : i)).filter((i) => i >= 0);
  return verdict(
    "greedy output of the probe set equals the clean run's",
    diff.length === 0 && after.length === clean.length,
    diff.length === 0 ? `${clean.length} probes identical` : `probes ${diff.join(", ")} differ`,
  );
}
