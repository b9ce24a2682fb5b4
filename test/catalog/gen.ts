import { createHash } from "node:crypto";
import { CatalogDb } from "../../catalog/db.ts";
import type { CatalogOp, Proposal, Tier } from "../../schema/catalog.ts";
import { catalogNodeId, modelFingerprint, prefixChain } from "../../schema/identity.ts";
import type { ModelFingerprint, NodeId, PrefixHash } from "../../schema/ids.ts";

/** mulberry32: a small seeded PRNG, so every random catalog is reproducible from its seed. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export const LAYOUT = "kv-test/v1";
export const CHUNK_TOKENS = 4;
const TIERS: Tier[] = ["ram", "ssd", "s3", "peer"];

export function fingerprintOf(i: number): ModelFingerprint {
  return modelFingerprint({
    weightsDigest: `w${i}`,
    architecture: { i },
    kvDtype: "f16",
    layout: LAYOUT,
    variant: "test",
  });
}

interface Doc {
  readonly model: number;
  readonly tenant: string;
  readonly tokens: readonly number[];
  readonly nodes: { node: NodeId; prefix: string; parent: string; start: number }[];
  /** Nodes the generator believes published (a prefix of `nodes`). */
  published: number;
}

/**
 * Random proposals over a small world (models, workers, tenants, documents
 * sharing prefixes). Mostly valid, some not on purpose (a chunk past its
 * unpublished parent, stale lease epochs, fenced placements, unknown workers,
 * re-sent proposal ids), so the writer's rejections are exercised too.
 */
export class CatalogGen {
  private readonly r: () => number;
  readonly models: ModelFingerprint[];
  readonly workers: { id: string; model: number }[];
  readonly tenants = ["t-a", "t-b", "t-c"];
  private readonly docs: Doc[] = [];
  private seq = 0;
  private readonly sent: Proposal[] = [];
  private leaseEpoch = 0;
  private time = 1_700_000_000_000;

  constructor(
    seed: number,
    readonly clientId = "gen",
    nModels = 2,
    nWorkers = 4,
  ) {
    this.r = rng(seed);
    this.models = Array.from({ length: nModels }, (_, i) => fingerprintOf(i));
    this.workers = Array.from({ length: nWorkers }, (_, i) => ({ id: `w${i}`, model: i % nModels }));
  }

  private pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.r() * xs.length)]!;
  }
  private int(n: number): number {
    return Math.floor(this.r() * n);
  }

  /** Every document's chain of node ids (root first), with its model. */
  chains(): { model: ModelFingerprint; nodes: NodeId[]; prefixes: PrefixHash[] }[] {
    return this.docs.map((d) => ({
      model: this.models[d.model]!,
      nodes: d.nodes.map((n) => n.node),
      prefixes: d.nodes.map((n) => n.prefix as PrefixHash),
    }));
  }

  /** Registers every model and worker. */
  setup(): Proposal {
    const ops: CatalogOp[] = [];
    this.models.forEach((fp, i) => {
      ops.push({
        op: "model.registered",
        fingerprint: fp,
        name: `m${i}`,
        layout: LAYOUT,
        chunkTokens: CHUNK_TOKENS,
      });
    });
    for (const w of this.workers)
      ops.push({
        op: "worker.registered",
        worker: w.id,
        model: this.models[w.model]!,
        address: `127.0.0.1:${9000 + w.model}`,
      });
    return this.proposal(ops);
  }

  private proposal(ops: CatalogOp[]): Proposal {
    const p = { id: `${this.clientId}-${this.seq++}`, clientId: this.clientId, ops };
    this.sent.push(p);
    return p;
  }

  private newDoc(): Doc {
    const model = this.int(this.models.length);
    const tenant = this.pick(this.tenants);
    // Half the documents extend a prefix of an earlier one of the same model and tenant.
    const base = this.docs.filter((d) => d.model === model && d.tenant === tenant);
    let tokens: number[] = [];
    if (base.length > 0 && this.r() < 0.5) {
      const b = this.pick(base);
      const keep = this.int(b.nodes.length + 1) * CHUNK_TOKENS;
      tokens = b.tokens.slice(0, keep);
    }
    while (tokens.length < 16 * CHUNK_TOKENS) tokens.push(this.int(50_000));
    const chain = prefixChain(tokens, CHUNK_TOKENS, tenant);
    const doc: Doc = {
      model,
      tenant,
      tokens,
      published: 0,
      nodes: chain.map((c) => ({
        node: catalogNodeId(this.models[model]!, c.hash),
        prefix: c.hash as string,
        parent: c.parent as string,
        start: c.start,
      })),
    };
    this.docs.push(doc);
    return doc;
  }

  private publishOp(d: Doc, i: number): CatalogOp {
    const n = d.nodes[i]!;
    return {
      op: "chunk.published",
      node: n.node,
      prefix: n.prefix,
      parent: n.parent,
      model: this.models[d.model]!,
      start: n.start,
      tokens: CHUNK_TOKENS,
      content: createHash("sha256").update(n.node).digest("hex"),
      bytes: 4096,
      layout: LAYOUT,
      created: this.time,
    };
  }

  private workerFor(model: number): string {
    const ws = this.workers.filter((w) => w.model === model);
    return this.pick(ws).id;
  }

  /** The next random proposal. */
  next(): Proposal {
    this.time += this.int(5_000);
    const x = this.r();
    if (x < 0.02 && this.sent.length > 0) {
      // A client retry: the same id and ops again.
      const again = this.pick(this.sent);
      return again;
    }
    if (this.docs.length === 0 || x < 0.08) this.newDoc();
    const d = this.pick(this.docs);
    const fp = this.models[d.model]!;
    if (x < 0.55) {
      // Publish the next chunk (sometimes one too deep: its parent is missing) with a ready replica.
      const i = Math.min(d.nodes.length - 1, d.published + (this.r() < 0.05 ? 2 : 0));
      if (i === d.published && d.published < d.nodes.length) d.published++;
      return this.proposal([
        this.publishOp(d, i),
        {
          op: "replica.ready",
          node: d.nodes[i]!.node,
          worker: this.workerFor(d.model),
          tier: this.pick(TIERS),
          verifiedAt: this.time,
        },
      ]);
    }
    const node = d.nodes[this.int(Math.max(1, d.published))]!.node;
    if (x < 0.68) {
      const op = this.pick(["replica.ready", "replica.bad", "replica.removed"] as const);
      const worker = this.r() < 0.03 ? "w-unknown" : this.workerFor(d.model);
      return this.proposal([{ op, node, worker, tier: this.pick(TIERS), verifiedAt: this.time }]);
    }
    if (x < 0.78) {
      return this.proposal([
        {
          op: "demand.observed",
          node,
          model: fp,
          tenant: d.tenant,
          time: this.time,
          count: 1 + this.int(20),
        },
      ]);
    }
    if (x < 0.86) {
      // Lease churn: takeovers with a higher epoch, renewals, stale acquires and releases.
      const y = this.r();
      if (y < 0.4) this.leaseEpoch++;
      const epoch = y < 0.1 ? Math.max(1, this.leaseEpoch - 1) : Math.max(1, this.leaseEpoch);
      const holder = `ctl-${epoch % 3}`;
      if (y > 0.85) return this.proposal([{ op: "lease.release", key: "placement", holder, epoch }]);
      return this.proposal([
        { op: "lease.acquire", key: "placement", holder, epoch, ttlMs: 1 + this.int(10_000) },
      ]);
    }
    if (x < 0.93) {
      const epoch = Math.max(1, this.leaseEpoch - (this.r() < 0.2 ? 1 : 0));
      return this.proposal([
        {
          op: "placement.set",
          node,
          worker: this.workerFor(d.model),
          tier: this.pick(TIERS),
          desired: this.r() < 0.7,
          lease: "placement",
          epoch,
        },
      ]);
    }
    const request = `req-${this.int(200)}`;
    const attempt = this.int(3);
    if (x < 0.97) {
      const source = this.pick(["resident", "ram", "ssd", "s3", "peer", "recompute"] as const);
      return this.proposal([
        {
          op: "decision.recorded",
          request,
          attempt,
          tenant: d.tenant,
          model: fp,
          time: this.time,
          candidates: JSON.stringify([{ worker: this.workerFor(d.model), ttft: this.int(900) }]),
          worker: this.workerFor(d.model),
          source,
          cachedTokens: source === "recompute" ? 0 : CHUNK_TOKENS * (1 + this.int(16)),
          predictedTtftMs: this.int(1000),
        },
      ]);
    }
    return this.proposal([{ op: "decision.measured", request, attempt, measuredTtftMs: this.int(1500) }]);
  }
}

/** Writer-side helper for pure tests: resolve and apply in order; returns the accepted count. */
export function applyAll(db: CatalogDb, proposals: readonly Proposal[], time = 1): number {
  let accepted = 0;
  for (const p of proposals) {
    const r = db.resolve(p, time);
    if (!r.ok) continue;
    db.apply({ txNo: db.nextTxNo, proposalId: p.id, clientId: p.clientId, time, datoms: r.datoms });
    accepted++;
  }
  return accepted;
}

/** A random catalog built directly (no log). */
export function randomCatalog(seed: number, proposals: number): { db: CatalogDb; gen: CatalogGen } {
  const gen = new CatalogGen(seed);
  const db = CatalogDb.empty();
  applyAll(db, [gen.setup()]);
  const ps: Proposal[] = [];
  for (let i = 0; i < proposals; i++) ps.push(gen.next());
  applyAll(db, ps);
  return { db, gen };
}
