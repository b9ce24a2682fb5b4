import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConsoleError } from "../../catalog/console.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { CatalogQueryEngine, QueryBoundError, type QueryLimits } from "../../catalog/query-engine.ts";
import { Replica } from "../../catalog/replica.ts";
import type { CatalogOp, Proposal } from "../../schema/catalog.ts";
import { ProposalMsg } from "../../schema/catalog.ts";
import { catalogNodeId, prefixChain } from "../../schema/identity.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { fingerprintOf, LAYOUT } from "./gen.ts";
import { startWriter } from "./log-helpers.ts";

/**
 * User Datalog off the event loop, bounded: a query thread over a copy of a
 * real replica (an embedded log, its writer, a Replica), with a time budget,
 * result caps and a heap cap; and scoped to the caller's tenant.
 *
 * The catalog: one model, two workers (with peer addresses), two tenants
 * whose salted chains hold 105 published chunks each (210 in all, the size a
 * probe's cartesian join ran out of heap on), every chunk with a ready RAM
 * replica, each tenant's demand for its own nodes, and one routing decision
 * per tenant.
 */

const FP = fingerprintOf(0);
const CHUNK = 4;
const TENANTS = ["t-a", "t-b"] as const;
const PER_TENANT = 105;

const limits: QueryLimits = {
  timeoutMs: 1_500,
  maxResultRows: 2_000,
  maxResultBytes: 32 * 1024,
  maxHeapMb: 192,
  maxQueued: 2,
};

let log: EmbeddedLog;
let stopWriter: () => Promise<void>;
let replica: Replica;
let engine: CatalogQueryEngine;
let proposals = 0;
let catalogReads = 0;

function proposal(ops: CatalogOp[]): Proposal {
  return { id: `q-${proposals++}`, clientId: "query-test", ops };
}

async function propose(ps: Proposal[]): Promise<void> {
  for (const p of ps) await log.propose(encodeMessage(ProposalMsg, p));
  const end = await log.endOffset();
  await replica.waitFor(end, 20_000);
}

function chainOps(tenant: string, n: number, worker: string): CatalogOp[] {
  const tokens = Array.from({ length: n * CHUNK }, (_, i) => (i * 7919 + tenant.length) % 50_000);
  const chain = prefixChain(tokens, CHUNK, tenant);
  const ops: CatalogOp[] = [];
  for (const c of chain) {
    const node = catalogNodeId(FP, c.hash);
    ops.push(
      {
        op: "chunk.published",
        node,
        prefix: c.hash,
        parent: c.parent,
        model: FP,
        start: c.start,
        tokens: CHUNK,
        content: createHash("sha256").update(node).digest("hex"),
        bytes: 4096,
        layout: LAYOUT,
        created: 1_700_000_000_000,
      },
      { op: "replica.ready", node, worker, tier: "ram", verifiedAt: 1_700_000_000_000 },
      { op: "demand.observed", node, model: FP, tenant, time: 1_700_000_000_000, count: 3 },
    );
  }
  return ops;
}

beforeAll(async () => {
  log = await EmbeddedLog.open();
  ({ stop: stopWriter } = startWriter(log));
  replica = await Replica.start({ log });
  const setup = proposal([
    { op: "model.registered", fingerprint: FP, name: "m0", layout: LAYOUT, chunkTokens: CHUNK },
    { op: "worker.registered", worker: "w0", model: FP, address: "10.0.0.1:8090" },
    { op: "worker.registered", worker: "w1", model: FP, address: "10.0.0.2:8091" },
  ]);
  const chains = TENANTS.flatMap((t, i) => {
    const ops = chainOps(t, PER_TENANT, `w${i}`);
    const out: Proposal[] = [];
    for (let k = 0; k < ops.length; k += 90) out.push(proposal(ops.slice(k, k + 90)));
    return out;
  });
  const decisions = TENANTS.map((tenant, i) =>
    proposal([
      {
        op: "decision.recorded",
        request: `cmpl-${tenant}`,
        attempt: 1,
        tenant,
        model: FP,
        time: 1_700_000_000_000,
        candidates: JSON.stringify({ ranked: [{ workerId: `w${i}` }], dropped: [], omitted: 0 }),
        worker: `w${i}`,
        source: "ram",
        cachedTokens: 8,
        predictedTtftMs: 12,
      },
    ]),
  );
  await propose([setup, ...chains, ...decisions]);
  // Counts the engine's reads of the replica's catalog: each is a serialization on the event loop.
  const source = {
    get catalog() {
      catalogReads++;
      return replica.catalog;
    },
    listen: replica.listen.bind(replica),
  };
  engine = new CatalogQueryEngine(source, limits);
}, 120_000);

afterAll(async () => {
  await engine?.close();
  await replica?.stop();
  await stopWriter?.();
  await log?.close();
});

const all = { kind: "all" } as const;
const tenant = (t: string) => ({ kind: "tenant", tenant: t }) as const;
const rows = async (query: string, scope: Parameters<CatalogQueryEngine["query"]>[0]["scope"] = all) =>
  JSON.parse((await engine.query({ query, scope })).json) as unknown;

/** Rejects with the QueryBoundError the query hit (fails the test when it completes). */
async function boundOf(p: Promise<unknown>): Promise<QueryBoundError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(QueryBoundError);
    return err as QueryBoundError;
  }
  throw new Error("the query completed instead of hitting a bound");
}

/** Counts event-loop turns (10 ms timer ticks) while `p` runs. */
async function ticksDuring<T>(
  p: Promise<T>,
): Promise<{ ticks: number; ms: number; result: PromiseSettledResult<T> }> {
  let ticks = 0;
  const t0 = performance.now();
  const timer = setInterval(() => ticks++, 10);
  const [result] = await Promise.allSettled([p]);
  clearInterval(timer);
  return { ticks, ms: performance.now() - t0, result: result! };
}

describe("bounded catalog queries", () => {
  it("answers a query from the replica's copy and sees transactions applied later", async () => {
    expect(await rows("[:find (count ?c) . :where [?c :chunk/node]]")).toBe(2 * PER_TENANT);
    await propose([proposal(chainOps("t-c", 1, "w0"))]);
    expect(await rows("[:find (count ?c) . :where [?c :chunk/node]]")).toBe(2 * PER_TENANT + 1);
  });

  it("cancels a recursive rule at the time budget while the event loop keeps turning", async () => {
    const q = engine.query({
      query: "[:find ?x ?z :in $ % :where (r ?x ?z)]",
      rules: "[[(r ?x ?z) (r ?x ?y) (r ?y ?z)]]",
      scope: all,
    });
    const { ticks, ms, result } = await ticksDuring(q);
    expect(result.status).toBe("rejected");
    const err = (result as PromiseRejectedResult).reason as QueryBoundError;
    expect(err).toBeInstanceOf(QueryBoundError);
    expect(err.bound).toBe("time");
    expect(err.message).toMatch(/1500 ms/);
    // The main thread ran its timers throughout (a blocked loop would give ~0 ticks).
    expect(ticks).toBeGreaterThan(ms / 10 / 4);
    // A transaction applied while the replacement thread is seeded reaches it too.
    const before = (await rows("[:find (count ?c) . :where [?c :chunk/node]]")) as number;
    const again = engine.query({
      query: "[:find ?x ?z :in $ % :where (r ?x ?z)]",
      rules: "[[(r ?x ?z) (r ?x ?y) (r ?y ?z)]]",
      scope: all,
    });
    expect((await boundOf(again)).bound).toBe("time");
    await propose([proposal(chainOps("t-d", 1, "w1"))]);
    expect(await rows("[:find (count ?c) . :where [?c :chunk/node]]")).toBe(before + 1);
    expect(await rows("[:find (count ?w) . :where [?w :worker/id]]")).toBe(2);
    // The replacements were seeded by the keeper: the event loop serialized the catalog once, for the first query.
    expect(catalogReads).toBe(1);
  }, 60_000);

  it("cancels a three-way cartesian join over the chunks at the time or heap bound", async () => {
    const err = await boundOf(
      engine.query({
        query: "[:find ?a ?b ?c :where [?a :chunk/node] [?b :chunk/node] [?c :chunk/node]]",
        scope: all,
      }),
    );
    expect(["time", "memory"]).toContain(err.bound);
    expect(await rows("[:find (count ?c) . :where [?c :chunk/node]]")).toBeGreaterThan(0);
  });

  it("refuses a result over the row cap or the byte cap, naming it", async () => {
    const byRows = await boundOf(engine.query({ query: "[:find ?e ?a ?v :where [?e ?a ?v]]", scope: all }));
    expect(byRows.bound).toBe("rows");
    expect(byRows.message).toMatch(/2000 rows/);
    const byBytes = await boundOf(
      engine.query({
        query: "[:find ?c ?n ?p ?s :where [?c :chunk/node ?n] [?c :chunk/prefix ?p] [?c :chunk/content ?s]]",
        scope: all,
      }),
    );
    expect(byBytes.bound).toBe("bytes");
    expect(byBytes.message).toMatch(/32768 bytes/);
  });

  it("bounds the queue: a query past maxQueued waiting ones is refused at once", async () => {
    const runaway = {
      query: "[:find ?x ?z :in $ % :where (r ?x ?z)]",
      rules: "[[(r ?x ?z) (r ?x ?y) (r ?y ?z)]]",
      scope: all,
    };
    const running = engine.query(runaway);
    const waiting = [engine.query(runaway), engine.query(runaway)];
    const refused = await boundOf(engine.query(runaway));
    expect(refused.bound).toBe("queue");
    for (const p of [running, ...waiting]) expect((await boundOf(p)).bound).toBe("time");
  }, 30_000);

  it("reports a malformed query as a query error, not a bound", async () => {
    await expect(
      engine.query({ query: "[:find ?n :where [?c :chunk/nod ?n]]", scope: all }),
    ).rejects.toBeInstanceOf(ConsoleError);
    await expect(engine.query({ query: "[:find ?n :where", scope: all })).rejects.toThrow(/parse error/);
  });
});

describe("tenant scope", () => {
  it("shows a tenant its own demand and decisions only", async () => {
    for (const t of TENANTS) {
      expect(await rows("[:find [?t ...] :where [?d :demand/tenant ?t]]", tenant(t))).toEqual([t]);
      expect(await rows("[:find [?r ...] :where [?d :decision/request ?r]]", tenant(t))).toEqual([
        `cmpl-${t}`,
      ]);
    }
    // An admin sees every tenant's demand.
    expect(await rows("[:find [?t ...] :where [?d :demand/tenant ?t]]", all)).toEqual(
      expect.arrayContaining([...TENANTS]),
    );
  });

  it("shows a tenant the chunks its demand names, without store metadata", async () => {
    expect(await rows("[:find (count ?c) . :where [?c :chunk/node]]", tenant("t-a"))).toBe(PER_TENANT);
    const mine = (await rows(
      "[:find [?n ...] :where [?d :demand/node ?n] [?c :chunk/node ?n]]",
      tenant("t-a"),
    )) as string[];
    expect(mine).toHaveLength(PER_TENANT);
    expect(await rows("[:find (count ?c) . :where [?c :chunk/content]]", tenant("t-a"))).toBe(null);
    expect(await rows("[:find (count ?c) . :where [?c :chunk/bytes]]", tenant("t-a"))).toBe(null);
  });

  it("hides workers, peer addresses, replicas, placements and decision internals from a tenant", async () => {
    for (const q of [
      "[:find ?a :where [?w :worker/address ?a]]",
      "[:find ?w :where [?w :worker/id]]",
      "[:find ?r :where [?r :replica/state]]",
      "[:find ?d :where [?d :decision/candidates]]",
      "[:find ?d :where [?d :decision/worker]]",
      '[:find ?e ?a ?v :where [?e ?a ?v] [(str ?v) ?s] [(clojure.string/includes? ?s "10.0.0")]]',
    ])
      expect(await rows(q, tenant("t-a")), q).toEqual([]);
    expect(await rows("[:find [?a ...] :where [?w :worker/address ?a]]", all)).toHaveLength(2);
  });
});
