import { hash } from "node:crypto";
import {
  ATTRIBUTES,
  type Attr,
  type AttrSpec,
  type CatalogOp,
  type ChunkPublishedOp,
  type Datom,
  DECISION_SOURCES,
  type DecisionMeasuredOp,
  type DecisionRecordedOp,
  type DemandObservedOp,
  type LeaseAcquireOp,
  type LeaseReleaseOp,
  MAX_OPS_PER_PROPOSAL,
  type ModelRegisteredOp,
  type PlacementSetOp,
  type Proposal,
  type ReplicaChangedOp,
  TIERS,
  type WorkerRegisteredOp,
} from "../schema/catalog.ts";
import { CATALOG_NODE_TAG } from "../schema/identity.ts";
import { isHex64, MAX_EID, type Value } from "./entity-store.ts";

/**
 * The rules a proposal must pass: `resolveProposal` checks each op against
 * the db (shapes, references, uniqueness, immutability, lease and placement
 * fencing) and turns an accepted proposal into datoms with entity ids
 * assigned. Pure: it reads the db through RulesDb and changes nothing; the
 * store that holds the state, and applies the datoms, is catalog/db.ts.
 */

/** What the rules read of the db (catalog/db.ts CatalogDb provides it). */
export interface RulesDb {
  get(e: number, a: Attr): Value | undefined;
  /** The entity holding a unique value. */
  eidOf(a: Attr, v: Value): number | undefined;
  /** eidOf for a unique hex attribute and a value the caller has checked is 64 lowercase hex. */
  eidOfHex(a: Attr, v: string): number | undefined;
  /** The chunk entity of a model entity's prefix hash (checked 64 lowercase hex), if published. */
  chunkOfHex(model: number, prefix: string): number | undefined;
  /** The replica / placement entity of (chunk, worker, tier), if any. */
  replicaKey(chunk: number, worker: number, tier: string): number | undefined;
  placementKey(chunk: number, worker: number, tier: string): number | undefined;
  readonly highestEid: number;
  hasProposal(id: string): boolean;
}

const NAME = /^[\x21-\x7e]{1,128}$/;
const MAX_TEXT = 256;
const MAX_CANDIDATES_TEXT = 64 * 1024;
/** A lease lasts at most an hour without renewal. */
export const MAX_LEASE_TTL_MS = 3_600_000;

/** A rejection inside `resolve`; becomes `{ ok: false, reason }`. */
class Reject extends Error {}

function hex(what: string, s: string): void {
  if (!isHex64(s))
    throw new Reject(`${what} must be 64 lowercase hex digits, got ${JSON.stringify(s.slice(0, 80))}`);
}
function name(what: string, s: string): void {
  if (!NAME.test(s))
    throw new Reject(
      `${what} must be 1-128 printable ASCII characters, got ${JSON.stringify(s.slice(0, 80))}`,
    );
}
function text(what: string, s: string, max = MAX_TEXT): void {
  if (s.length === 0 || s.length > max)
    throw new Reject(`${what} must be 1-${max} characters, got ${s.length}`);
}
function int(what: string, n: number, min: number, max = Number.MAX_SAFE_INTEGER): void {
  if (!Number.isSafeInteger(n) || n < min || n > max)
    throw new Reject(`${what} must be an integer in [${min}, ${max}], got ${n}`);
}
function nonNeg(what: string, n: number): void {
  if (!Number.isFinite(n) || n < 0) throw new Reject(`${what} must be a finite number ≥ 0, got ${n}`);
}
function oneOf(what: string, s: string, values: readonly string[]): void {
  if (!values.includes(s))
    throw new Reject(`${what} must be one of ${values.join("|")}, got ${JSON.stringify(s)}`);
}

const UNIQUE_ATTRS: ReadonlySet<string> = new Set(
  (Object.entries(ATTRIBUTES) as [string, AttrSpec][]).filter(([, spec]) => spec.unique).map(([a]) => a),
);

/**
 * schema/identity.ts catalogNodeId, for the writer's hot path: one
 * preallocated buffer (tag ‖ fingerprint ‖ prefix) and a one-shot sha256
 * instead of a streaming Hash object and two byte copies per call
 * (bench/catalog.md). Both arguments must already be 64 lowercase hex digits; the result
 * equals catalogNodeId bit for bit (test/catalog/rules.test.ts).
 */
const NODE_TAG_BYTES = Buffer.from(CATALOG_NODE_TAG, "utf8");
const nodeIdInput = Buffer.alloc(NODE_TAG_BYTES.length + 64);
NODE_TAG_BYTES.copy(nodeIdInput);
export function fastCatalogNodeId(fingerprintHex: string, prefixHex: string): string {
  nodeIdInput.write(fingerprintHex, NODE_TAG_BYTES.length, 32, "hex");
  nodeIdInput.write(prefixHex, NODE_TAG_BYTES.length + 32, 32, "hex");
  return hash("sha256", nodeIdInput, "hex");
}

export type ResolveResult =
  | { readonly ok: true; readonly datoms: Datom[] }
  | { readonly ok: false; readonly reason: string; readonly duplicate?: boolean };

/**
 * Validates a proposal against `db` and returns its datoms (nothing is
 * applied). `now` is the writer's clock (ms since the epoch): leases expire
 * by it, so the one writer is the only clock lease rules read.
 */
export function resolveProposal(db: RulesDb, p: Proposal, now: number): ResolveResult {
  if (db.hasProposal(p.id))
    return { ok: false, duplicate: true, reason: `proposal ${JSON.stringify(p.id)} was already applied` };
  try {
    name("proposal id", p.id);
    name("client id", p.clientId);
    if (p.ops.length === 0) throw new Reject("a proposal needs at least one op");
    if (p.ops.length > MAX_OPS_PER_PROPOSAL)
      throw new Reject(`a proposal holds at most ${MAX_OPS_PER_PROPOSAL} ops, got ${p.ops.length}`);
  } catch (err) {
    if (err instanceof Reject) return { ok: false, reason: err.message };
    throw err;
  }
  const draft = new Draft(db, now);
  for (let i = 0; i < p.ops.length; i++) {
    const op = p.ops[i]!;
    try {
      draft.op(op);
    } catch (err) {
      if (err instanceof Reject) return { ok: false, reason: `op ${i} (${op.op}): ${err.message}` };
      throw err;
    }
  }
  return { ok: true, datoms: draft.datoms };
}

/**
 * One proposal being resolved: an overlay of new entities and changed values
 * on top of the db, so later ops of the same proposal see earlier ones, and
 * nothing touches the db itself.
 */
class Draft {
  readonly datoms: Datom[] = [];
  private nextEid: number;
  private readonly overlay = new Map<number, Map<Attr, Value | undefined>>();
  // Created on first use: most proposals create no unique value another op of
  // theirs looks up, and a lookup of an absent map builds no key string.
  /** unique attribute → value → entity, for values this draft set. */
  private newUniq: Map<Attr, Map<Value, number>> | undefined;
  /** `r|chunk|worker|tier` / `p|…` → replica / placement entity created by this draft. */
  private newKeys: Map<string, number> | undefined;
  /** `model|prefix` → chunk entity created by this draft (the db's prefix index does not hold them yet). */
  private newPrefixes: Map<string, number> | undefined;

  /** Entities from here up are created by this draft: the db holds nothing of them. */
  private readonly firstNew: number;

  constructor(
    private readonly db: RulesDb,
    /** The writer's clock, ms since the epoch. */
    private readonly now: number,
  ) {
    this.nextEid = db.highestEid + 1;
    this.firstNew = this.nextEid;
  }

  private get(e: number, a: Attr): Value | undefined {
    const o = this.overlay.get(e);
    if (o?.has(a)) return o.get(a);
    return e >= this.firstNew ? undefined : this.db.get(e, a);
  }
  private lookup(a: Attr, v: Value): number | undefined {
    return this.newUniq?.get(a)?.get(v) ?? this.db.eidOf(a, v);
  }
  /** lookup of a hex value this draft has already checked (hex()): the db skips the format check. */
  private lookupHex(a: Attr, v: string): number | undefined {
    return this.newUniq?.get(a)?.get(v) ?? this.db.eidOfHex(a, v);
  }
  private create(): number {
    if (this.nextEid > MAX_EID) throw new Reject("the catalog is out of entity ids");
    return this.nextEid++;
  }
  /** Sets a cardinality-one value: retracts a different old value first; equal values emit nothing. */
  private set(e: number, a: Attr, v: Value): void {
    const old = this.get(e, a);
    if (old === v) return;
    if (old !== undefined) this.datoms.push([e, a, old, false]);
    this.datoms.push([e, a, v, true]);
    let o = this.overlay.get(e);
    if (o === undefined) {
      o = new Map();
      this.overlay.set(e, o);
    }
    o.set(a, v);
    if (UNIQUE_ATTRS.has(a)) {
      this.newUniq ??= new Map();
      let byValue = this.newUniq.get(a);
      if (byValue === undefined) {
        byValue = new Map();
        this.newUniq.set(a, byValue);
      }
      byValue.set(v, e);
    }
  }
  private chunkOfPrefix(model: number, prefix: string): number | undefined {
    return this.newPrefixes?.get(`${model}|${prefix}`) ?? this.db.chunkOfHex(model, prefix);
  }
  private keyed(kind: "r" | "p", chunk: number, worker: number, tier: string): number | undefined {
    const found = this.newKeys?.get(`${kind}|${chunk}|${worker}|${tier}`);
    if (found !== undefined) return found;
    return kind === "r" ? this.db.replicaKey(chunk, worker, tier) : this.db.placementKey(chunk, worker, tier);
  }

  // A registered fingerprint, worker id or node id passed its format check
  // when it entered the db, so the lookup comes first and the format is
  // checked only to say why an unknown value is refused (same reasons as
  // checking first).
  private model(fp: string): number {
    const m = this.lookup("model/fingerprint", fp);
    if (m !== undefined) return m;
    hex("model fingerprint", fp);
    throw new Reject(`model ${fp.slice(0, 12)}… is not registered`);
  }
  private worker(id: string): number {
    const w = this.lookup("worker/id", id);
    if (w !== undefined) return w;
    name("worker id", id);
    throw new Reject(`worker ${id} is not registered`);
  }
  private chunk(node: string): number {
    const c = this.lookup("chunk/node", node);
    if (c !== undefined) return c;
    hex("node id", node);
    throw new Reject(`chunk ${node.slice(0, 12)}… is not published`);
  }

  op(op: CatalogOp): void {
    switch (op.op) {
      case "model.registered":
        this.modelRegistered(op);
        return;
      case "worker.registered":
        this.workerRegistered(op);
        return;
      case "chunk.published":
        this.chunkPublished(op);
        return;
      case "replica.ready":
      case "replica.bad":
      case "replica.removed":
        this.replicaChanged(op);
        return;
      case "demand.observed":
        this.demandObserved(op);
        return;
      case "lease.acquire":
        this.leaseAcquire(op);
        return;
      case "lease.release":
        this.leaseRelease(op);
        return;
      case "placement.set":
        this.placementSet(op);
        return;
      case "decision.recorded":
        this.decisionRecorded(op);
        return;
      case "decision.measured":
        this.decisionMeasured(op);
        return;
    }
  }

  private modelRegistered(op: ModelRegisteredOp): void {
    hex("model fingerprint", op.fingerprint);
    text("model name", op.name);
    text("layout", op.layout);
    int("chunk tokens", op.chunkTokens, 1, 65536);
    const existing = this.lookup("model/fingerprint", op.fingerprint);
    if (existing !== undefined) {
      // A fingerprint names one manifest: re-registering must agree with it.
      if (
        this.get(existing, "model/layout") !== op.layout ||
        this.get(existing, "model/chunk-tokens") !== op.chunkTokens
      )
        throw new Reject(
          `model ${op.fingerprint.slice(0, 12)}… is registered with another layout or chunk size`,
        );
      this.set(existing, "model/name", op.name);
      return;
    }
    const e = this.create();
    this.set(e, "model/fingerprint", op.fingerprint);
    this.set(e, "model/name", op.name);
    this.set(e, "model/layout", op.layout);
    this.set(e, "model/chunk-tokens", op.chunkTokens);
  }

  private workerRegistered(op: WorkerRegisteredOp): void {
    name("worker id", op.worker);
    const m = this.model(op.model);
    text("worker address", op.address);
    const e = this.lookup("worker/id", op.worker) ?? this.create();
    this.set(e, "worker/id", op.worker);
    this.set(e, "worker/model", m);
    this.set(e, "worker/address", op.address);
  }

  private chunkPublished(op: ChunkPublishedOp): void {
    hex("node id", op.node);
    hex("prefix hash", op.prefix);
    hex("parent prefix hash", op.parent);
    const m = this.model(op.model);
    int("token start", op.start, 0);
    int("token count", op.tokens, 1, 1 << 20);
    hex("content id", op.content);
    int("byte size", op.bytes, 0);
    text("layout", op.layout);
    nonNeg("created", op.created);
    const expected = fastCatalogNodeId(op.model, op.prefix);
    if (op.node !== expected)
      throw new Reject(
        `node id ${op.node.slice(0, 12)}… is not H(model, prefix) = ${expected.slice(0, 12)}…`,
      );
    if (op.layout !== this.get(m, "model/layout"))
      throw new Reject(`layout ${op.layout} differs from the model's ${String(this.get(m, "model/layout"))}`);
    const existing = this.lookupHex("chunk/node", op.node);
    if (existing !== undefined) {
      // Chunks are immutable: a second publication of the same bytes is a no-op.
      const content = this.get(existing, "chunk/content");
      if (content !== op.content)
        throw new Reject(
          `chunk ${op.node.slice(0, 12)}… is published with content ${String(content).slice(0, 12)}…, not ${op.content.slice(0, 12)}…`,
        );
      return;
    }
    let parent: number | undefined;
    if (op.start > 0) {
      // The parent is the chunk of H(model, parent prefix): found through the
      // model's prefix index (every chunk's node id was checked against its
      // prefix on publication), so no hash unless it is missing.
      parent = this.chunkOfPrefix(m, op.parent);
      if (parent === undefined)
        throw new Reject(
          `parent chunk ${fastCatalogNodeId(op.model, op.parent).slice(0, 12)}… is not published`,
        );
      const pend = (this.get(parent, "chunk/start") as number) + (this.get(parent, "chunk/tokens") as number);
      if (pend !== op.start)
        throw new Reject(`parent chunk ends at token ${pend}, this chunk starts at ${op.start}`);
    }
    const e = this.create();
    this.newPrefixes ??= new Map();
    this.newPrefixes.set(`${m}|${op.prefix}`, e);
    this.set(e, "chunk/node", op.node);
    this.set(e, "chunk/prefix", op.prefix);
    if (parent !== undefined) this.set(e, "chunk/parent", parent);
    this.set(e, "chunk/model", m);
    this.set(e, "chunk/start", op.start);
    this.set(e, "chunk/tokens", op.tokens);
    this.set(e, "chunk/content", op.content);
    this.set(e, "chunk/bytes", op.bytes);
    this.set(e, "chunk/layout", op.layout);
    this.set(e, "chunk/created", op.created);
  }

  private replicaChanged(op: ReplicaChangedOp): void {
    const c = this.chunk(op.node);
    const w = this.worker(op.worker);
    oneOf("tier", op.tier, TIERS);
    nonNeg("verified-at", op.verifiedAt);
    const cm = this.get(c, "chunk/model");
    if (this.get(w, "worker/model") !== cm)
      throw new Reject(`worker ${op.worker} serves another model than chunk ${op.node.slice(0, 12)}…`);
    let e = this.keyed("r", c, w, op.tier);
    if (e === undefined) {
      if (op.op !== "replica.ready")
        throw new Reject(`no replica of chunk ${op.node.slice(0, 12)}… on ${op.worker}/${op.tier}`);
      e = this.create();
      this.newKeys ??= new Map();
      this.newKeys.set(`r|${c}|${w}|${op.tier}`, e);
      this.set(e, "replica/chunk", c);
      this.set(e, "replica/worker", w);
      this.set(e, "replica/tier", op.tier);
    }
    this.set(
      e,
      "replica/state",
      op.op === "replica.ready" ? "ready" : op.op === "replica.bad" ? "bad" : "removed",
    );
    this.set(e, "replica/verified-at", op.verifiedAt);
  }

  private demandObserved(op: DemandObservedOp): void {
    hex("node id", op.node);
    const m = this.model(op.model);
    name("tenant id", op.tenant);
    nonNeg("time", op.time);
    int("count", op.count, 1);
    const e = this.create();
    this.set(e, "demand/node", op.node);
    this.set(e, "demand/model", m);
    this.set(e, "demand/tenant", op.tenant);
    this.set(e, "demand/time", op.time);
    this.set(e, "demand/count", op.count);
  }

  /**
   * Lease rules. A lease is held until `expires` (the writer's clock). An
   * acquire is a renewal (the holder at its epoch: expiry moves on), a new
   * key, a released or expired lease taken at a higher epoch, or the same
   * holder at a higher epoch (a restarted holder fences its old self). Another
   * holder's acquire of a lease held and unexpired is refused, whatever its
   * epoch: takeover waits for the lapse.
   */
  private leaseAcquire(op: LeaseAcquireOp): void {
    text("lease key", op.key);
    name("lease holder", op.holder);
    int("lease epoch", op.epoch, 1);
    int("lease ttl", op.ttlMs, 1, MAX_LEASE_TTL_MS);
    const e = this.lookup("lease/key", op.key);
    if (e !== undefined) {
      const epoch = this.get(e, "lease/epoch") as number;
      const holder = this.get(e, "lease/holder");
      const expires = (this.get(e, "lease/expires") as number | undefined) ?? 0;
      const held = this.get(e, "lease/state") === "held" && this.now < expires;
      const renew = held && holder === op.holder && epoch === op.epoch;
      if (!renew && op.epoch <= epoch)
        throw new Reject(
          `lease ${op.key} is ${held ? `held by ${String(holder)}` : "free"} at epoch ${epoch}; acquiring needs an epoch > ${epoch}, got ${op.epoch}`,
        );
      if (!renew && held && holder !== op.holder)
        throw new Reject(
          `lease ${op.key} is held by ${String(holder)} at epoch ${epoch} for ${expires - this.now} ms more`,
        );
    }
    const id = e ?? this.create();
    this.set(id, "lease/key", op.key);
    this.set(id, "lease/holder", op.holder);
    this.set(id, "lease/epoch", op.epoch);
    this.set(id, "lease/state", "held");
    this.set(id, "lease/expires", this.now + op.ttlMs);
  }

  private leaseRelease(op: LeaseReleaseOp): void {
    text("lease key", op.key);
    name("lease holder", op.holder);
    int("lease epoch", op.epoch, 1);
    const e = this.lookup("lease/key", op.key);
    if (e === undefined) throw new Reject(`lease ${op.key} does not exist`);
    const epoch = this.get(e, "lease/epoch");
    const holder = this.get(e, "lease/holder");
    if (this.get(e, "lease/state") !== "held" || holder !== op.holder || epoch !== op.epoch)
      throw new Reject(
        `fenced: lease ${op.key} is ${String(this.get(e, "lease/state"))} by ${String(holder)} at epoch ${String(epoch)}; release came from ${op.holder} at epoch ${op.epoch}`,
      );
    this.set(e, "lease/state", "released");
  }

  private placementSet(op: PlacementSetOp): void {
    text("lease key", op.lease);
    int("placement epoch", op.epoch, 1);
    const l = this.lookup("lease/key", op.lease);
    if (l === undefined) throw new Reject(`fenced: lease ${op.lease} does not exist`);
    const epoch = this.get(l, "lease/epoch");
    if (this.get(l, "lease/state") !== "held" || epoch !== op.epoch)
      throw new Reject(
        `fenced: lease ${op.lease} is ${String(this.get(l, "lease/state"))} at epoch ${String(epoch)}; the placement carries epoch ${op.epoch}`,
      );
    const expires = (this.get(l, "lease/expires") as number | undefined) ?? 0;
    if (this.now >= expires)
      throw new Reject(
        `fenced: lease ${op.lease} at epoch ${String(epoch)} expired ${this.now - expires} ms ago`,
      );
    const c = this.chunk(op.node);
    const w = this.worker(op.worker);
    oneOf("tier", op.tier, TIERS);
    let e = this.keyed("p", c, w, op.tier);
    if (e === undefined) {
      e = this.create();
      this.newKeys ??= new Map();
      this.newKeys.set(`p|${c}|${w}|${op.tier}`, e);
      this.set(e, "placement/chunk", c);
      this.set(e, "placement/worker", w);
      this.set(e, "placement/tier", op.tier);
    }
    this.set(e, "placement/desired", op.desired);
    this.set(e, "placement/lease", l);
    this.set(e, "placement/epoch", op.epoch);
  }

  private decisionRecorded(op: DecisionRecordedOp): void {
    name("request id", op.request);
    int("attempt", op.attempt, 0);
    name("tenant id", op.tenant);
    const m = this.model(op.model);
    nonNeg("time", op.time);
    text("candidates", op.candidates, MAX_CANDIDATES_TEXT);
    try {
      JSON.parse(op.candidates);
    } catch {
      throw new Reject("candidates must be JSON text");
    }
    const w = this.worker(op.worker);
    oneOf("source", op.source, DECISION_SOURCES);
    int("cached tokens", op.cachedTokens, 0);
    nonNeg("predicted TTFT", op.predictedTtftMs);
    const key = `${op.request}#${op.attempt}`;
    if (this.lookup("decision/key", key) !== undefined)
      throw new Reject(`decision for request ${op.request} attempt ${op.attempt} is already recorded`);
    const e = this.create();
    this.set(e, "decision/key", key);
    this.set(e, "decision/request", op.request);
    this.set(e, "decision/attempt", op.attempt);
    this.set(e, "decision/tenant", op.tenant);
    this.set(e, "decision/model", m);
    this.set(e, "decision/time", op.time);
    this.set(e, "decision/candidates", op.candidates);
    this.set(e, "decision/worker", w);
    this.set(e, "decision/source", op.source);
    this.set(e, "decision/cached-tokens", op.cachedTokens);
    this.set(e, "decision/predicted-ttft-ms", op.predictedTtftMs);
  }

  private decisionMeasured(op: DecisionMeasuredOp): void {
    name("request id", op.request);
    int("attempt", op.attempt, 0);
    nonNeg("measured TTFT", op.measuredTtftMs);
    const e = this.lookup("decision/key", `${op.request}#${op.attempt}`);
    if (e === undefined) throw new Reject(`no decision for request ${op.request} attempt ${op.attempt}`);
    this.set(e, "decision/measured-ttft-ms", op.measuredTtftMs);
  }
}
