import { createHash, hash } from "node:crypto";
import datascript, { type DB, type TxItem } from "datascript";
import { Packr } from "msgpackr";
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
  datascriptSchema,
  type LeaseAcquireOp,
  type LeaseReleaseOp,
  MAX_OPS_PER_PROPOSAL,
  type ModelRegisteredOp,
  type PlacementSetOp,
  type Proposal,
  type ReplicaChangedOp,
  TIERS,
  type TxRecord,
  type WorkerRegisteredOp,
} from "../schema/catalog.ts";
import { CATALOG_NODE_TAG } from "../schema/identity.ts";
import { ChunkLinks } from "./chunk-links.ts";
import { attrInfo, EntityStore, isHex64, MAX_EID, ownString, type Value } from "./entity-store.ts";
import { HexIndex } from "./hex-index.ts";

/**
 * The catalog database: the state every replica (and the writer) holds, and
 * the rules a proposal must pass.
 *
 * Two representations of one state:
 * - the entity store (catalog/entity-store.ts: one table of typed columns per
 *   namespace) with the unique indexes and the hot-path indexes below. It is
 *   authoritative: `resolve` validates against it, `apply` updates it, `dbHash`
 *   and `serialize` read it. Applying a datom costs a few array writes, so a
 *   replica keeps up with the log far above DataScript's transact rate
 *   (measured ~45,000 datoms/s here), and a chunk with its replica fact adds
 *   no object to the JS heap (V8's collections of a growing heap set the
 *   apply-lag tail).
 * - the DataScript db for Datalog (`datalog()`), materialized from the same
 *   datoms: folded in with `db_with` when few are pending, rebuilt in bulk with
 *   `init_db` (~10× faster per datom) when many are. Its content (e, a, v)
 *   always equals the entity store's at the moment it is returned; DataScript's
 *   own tx ids are not meaningful (the log's txNo is).
 *
 * Invariants: txs apply in txNo order 1, 2, 3… with no gap; every attribute is
 * cardinality one; a unique value is held by at most one entity; an entity
 * holds attributes of one namespace; entity ids are assigned by `resolve`
 * (max + 1, …), so every replica assigns none and a tx never skips an id.
 */

export type { Value } from "./entity-store.ts";

/** A proposal id is remembered for this many later proposals (the duplicate-detection window). */
export const PROPOSAL_WINDOW = 1 << 20;
/** Pending datoms past which the Datalog view is dropped and rebuilt in bulk when next needed. */
const MAX_PENDING_DATOMS = 1 << 21;

const NAME = /^[\x21-\x7e]{1,128}$/;
const MAX_TEXT = 256;
const MAX_CANDIDATES_TEXT = 64 * 1024;
/** A lease lasts at most an hour without renewal. */
export const MAX_LEASE_TTL_MS = 3_600_000;

export class CatalogApplyError extends Error {
  override readonly name = "CatalogApplyError";
}

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

const ATTR_SPECS: Record<string, AttrSpec> = ATTRIBUTES;

/**
 * schema/identity.ts catalogNodeId, for the writer's hot path: one
 * preallocated buffer (tag ‖ fingerprint ‖ prefix) and a one-shot sha256,
 * ~3 µs instead of ~7 µs (a streaming Hash object and two byte copies per
 * call). Both arguments must already be 64 lowercase hex digits; the result
 * equals catalogNodeId bit for bit (test/catalog/db.test.ts).
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

export class CatalogDb {
  private readonly store = new EntityStore();
  /** Unique 64-hex attributes (model fingerprint, chunk node) → their index. */
  private readonly hexUnique = new Map<Attr, HexIndex>();
  /** Other unique attributes (worker id, lease key, decision key) → value → entity id. */
  private readonly strUnique = new Map<Attr, Map<Value, number>>();
  /** Hot path: (model entity, prefix hash) → chunk entity (node id = H(fingerprint, prefix), so this is the node index without hashing). */
  private readonly prefixes = new HexIndex(this.store, CHUNK_PREFIX, CHUNK_MODEL);
  /** Hot path: chunk entity → its replica entities (every state), and its placements. */
  private readonly replicas = new ChunkLinks();
  private readonly placements = new ChunkLinks();
  private readonly proposals = new Set<string>();
  private readonly proposalOrder: string[] = [];
  private proposalHead = 0;
  private maxEid = 0;
  private lastTx = 0;
  private datomTotal = 0;
  /** Datalog view: `view` holds everything but `pending`; null when it must be rebuilt. */
  private view: DB | null = null;
  private pending: TxItem[] = [];

  private constructor() {
    for (const a of Object.keys(ATTRIBUTES) as Attr[]) {
      const info = attrInfo(a)!;
      if (!info.unique) continue;
      if (info.repr === "hex") this.hexUnique.set(a, new HexIndex(this.store, info));
      else this.strUnique.set(a, new Map());
    }
  }

  static empty(): CatalogDb {
    return new CatalogDb();
  }

  /** Number of txs applied; the next tx must carry txNo = lastTxNo + 1. */
  get lastTxNo(): number {
    return this.lastTx;
  }
  get nextTxNo(): number {
    return this.lastTx + 1;
  }
  /** Current (asserted) datoms. */
  get datomCount(): number {
    return this.datomTotal;
  }
  get entityCount(): number {
    return this.store.size;
  }

  // ------------------------------------------------------------ reads

  get(e: number, a: Attr): Value | undefined {
    const info = attrInfo(a);
    return info === undefined ? undefined : this.store.get(e, info);
  }
  /** The entity holding a unique value, e.g. eidOf("chunk/node", id). */
  eidOf(a: Attr, v: Value): number | undefined {
    const hex = this.hexUnique.get(a);
    if (hex !== undefined) return typeof v === "string" ? hex.find(v) : undefined;
    return this.strUnique.get(a)?.get(v);
  }
  /** The chunk entity of a model entity's prefix hash, if published. */
  chunkOf(model: number, prefix: string): number | undefined {
    return this.prefixes.find(prefix, model);
  }
  /** Replica entities of a chunk entity, in every state, oldest first. */
  replicasOf(chunk: number): readonly number[] {
    return this.replicas.members(chunk);
  }
  hasProposal(id: string): boolean {
    return this.proposals.has(id);
  }
  /** Every entity with its values, in ascending id order (a fresh map each: a slow path for scans and tests). */
  *entities(): IterableIterator<[number, ReadonlyMap<Attr, Value>]> {
    for (let e = 1; e <= this.maxEid; e++)
      if (this.store.has(e)) yield [e, new Map(this.store.attributes(e))];
  }
  /** Entities that hold a value of `a`, in the order they were created. */
  holders(a: Attr): IterableIterator<number> {
    return this.store.holders(attrInfo(a)!);
  }

  // ------------------------------------------------------------ resolve

  /**
   * Validates a proposal against this db and returns its datoms (nothing is
   * applied). `now` is the writer's clock (ms since the epoch): leases expire
   * by it, so the one writer is the only clock lease rules read.
   */
  resolve(p: Proposal, now: number): ResolveResult {
    if (this.proposals.has(p.id))
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
    const draft = new Draft(this, now);
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

  // ------------------------------------------------------------ apply

  apply(tx: TxRecord): void {
    if (tx.txNo !== this.lastTx + 1)
      throw new CatalogApplyError(`tx ${tx.txNo} out of order: the db has applied ${this.lastTx}`);
    const touched = new Set<number>();
    for (const d of tx.datoms) this.applyDatom(d, touched, false);
    for (const e of touched) this.reindex(e);
    this.remember(tx.proposalId);
    this.lastTx = tx.txNo;
    if (this.view !== null) {
      for (const [e, a, v, added] of tx.datoms)
        this.pending.push([added ? ":db/add" : ":db/retract", e, a, v]);
      if (this.pending.length > MAX_PENDING_DATOMS) {
        this.view = null;
        this.pending = [];
      }
    }
  }

  /**
   * One datom into the store and the unique indexes. In a tx (not a snapshot)
   * a new entity's id is at most the highest so far + 1: the writer assigns
   * ids in order, so a gap means a tx this db did not come from.
   */
  private applyDatom(d: Datom, touched: Set<number>, fromSnapshot: boolean): void {
    const [e, a, v, added] = d;
    const info = attrInfo(a);
    if (info === undefined) throw new CatalogApplyError(`unknown attribute ${a}`);
    if (!Number.isSafeInteger(e) || e <= 0 || e > MAX_EID) throw new CatalogApplyError(`bad entity id ${e}`);
    if (!fromSnapshot && e > this.maxEid + 1)
      throw new CatalogApplyError(`entity id ${e} skips ids: the highest so far is ${this.maxEid}`);
    const old = this.store.get(e, info);
    if (added) {
      const why = this.store.refusal(e, info, v);
      if (why !== undefined) throw new CatalogApplyError(why);
      if (info.unique) {
        const holder = this.eidOf(info.attr, v);
        if (holder !== undefined && holder !== e)
          throw new CatalogApplyError(`${a} ${String(v)} already held by ${holder}`);
      }
      if (this.store.set(e, info, v)) this.datomTotal++;
      if (info.unique) {
        const hex = this.hexUnique.get(info.attr);
        if (hex !== undefined) hex.add(e);
        else {
          const byValue = this.strUnique.get(info.attr)!;
          if (old !== undefined) byValue.delete(old);
          // The stored copy, not `v`: see ownString.
          byValue.set(this.store.get(e, info)!, e);
        }
      }
      if (e > this.maxEid) this.maxEid = e;
    } else {
      if (old !== v)
        throw new CatalogApplyError(`retract of ${e} ${a} ${String(v)}: current value is ${String(old)}`);
      this.store.delete(e, info);
      // A hex index needs no removal: its slot stops matching (catalog/hex-index.ts).
      this.strUnique.get(info.attr)?.delete(v);
      this.datomTotal--;
    }
    touched.add(e);
  }

  /** Keeps the derived indexes current for an entity a tx touched. */
  private reindex(e: number): void {
    const s = this.store;
    if (s.holds(e, CHUNK_PREFIX)) {
      // Chunks are immutable: indexed once, when created (adding again is a no-op).
      if (s.holds(e, CHUNK_MODEL)) this.prefixes.add(e);
      return;
    }
    const chunk = s.get(e, REPLICA_CHUNK) as number | undefined;
    if (chunk !== undefined) {
      const worker = s.get(e, REPLICA_WORKER) as number;
      const tier = s.get(e, REPLICA_TIER) as string;
      if (!this.replicas.isLinked(e) && this.replicaKey(chunk, worker, tier) === undefined)
        this.replicas.link(chunk, e);
      return;
    }
    const pchunk = s.get(e, PLACEMENT_CHUNK) as number | undefined;
    if (pchunk !== undefined) {
      const worker = s.get(e, PLACEMENT_WORKER) as number;
      const tier = s.get(e, PLACEMENT_TIER) as string;
      if (!this.placements.isLinked(e) && this.placementKey(pchunk, worker, tier) === undefined)
        this.placements.link(pchunk, e);
    }
  }

  private remember(decoded: string): void {
    const id = ownString(decoded);
    this.proposals.add(id);
    if (this.proposalOrder.length < PROPOSAL_WINDOW) {
      this.proposalOrder.push(id);
      return;
    }
    // Ring buffer: forget the oldest id as the newest arrives.
    const oldest = this.proposalOrder[this.proposalHead]!;
    this.proposals.delete(oldest);
    this.proposalOrder[this.proposalHead] = id;
    this.proposalHead = (this.proposalHead + 1) % PROPOSAL_WINDOW;
  }

  /** The replica entity of (chunk, worker, tier), if any; the draft's lookup. */
  replicaKey(chunk: number, worker: number, tier: string): number | undefined {
    const s = this.store;
    return this.replicas.find(
      chunk,
      (r) => s.get(r, REPLICA_WORKER) === worker && s.get(r, REPLICA_TIER) === tier,
    );
  }
  /** The placement entity of (chunk, worker, tier), if any. */
  placementKey(chunk: number, worker: number, tier: string): number | undefined {
    const s = this.store;
    return this.placements.find(
      chunk,
      (p) => s.get(p, PLACEMENT_WORKER) === worker && s.get(p, PLACEMENT_TIER) === tier,
    );
  }
  get highestEid(): number {
    return this.maxEid;
  }

  // ------------------------------------------------------------ Datalog view

  /** The DataScript db equal to this state now (see the class comment for how it is kept). */
  datalog(): DB {
    if (this.view === null || this.pending.length > this.datomTotal / 8) {
      this.view = datascript.init_db(this.currentDatoms(), datascriptSchema());
    } else if (this.pending.length > 0) {
      this.view = datascript.db_with(this.view, this.pending);
    }
    this.pending = [];
    return this.view;
  }

  private currentDatoms(): [number, string, unknown][] {
    const out: [number, string, unknown][] = [];
    for (let e = 1; e <= this.maxEid; e++) for (const [a, v] of this.store.attributes(e)) out.push([e, a, v]);
    return out;
  }

  // ------------------------------------------------------------ hash, snapshots

  /** sha256 over the tx count, the highest entity id and every datom in (e, a) order; equal dbs, equal hash. */
  dbHash(): string {
    const h = createHash("sha256");
    h.update(`continuum/catalog-db/v1\n${this.lastTx}\n${this.maxEid}\n`);
    for (let e = 1; e <= this.maxEid; e++) {
      if (!this.store.has(e)) continue;
      const values = [...this.store.attributes(e)].sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0));
      let line = `${e}`;
      for (const [a, v] of values) line += `\t${a}=${typeof v === "string" ? JSON.stringify(v) : String(v)}`;
      h.update(`${line}\n`);
    }
    return h.digest("hex");
  }

  serialize(): Uint8Array {
    const ents: unknown[] = [];
    for (let e = 1; e <= this.maxEid; e++) {
      if (!this.store.has(e)) continue;
      const at = ents.length;
      ents.push(e, 0);
      let n = 0;
      for (const [a, v] of this.store.attributes(e)) {
        ents.push(a, v);
        n++;
      }
      ents[at + 1] = n;
    }
    const proposals = [
      ...this.proposalOrder.slice(this.proposalHead),
      ...this.proposalOrder.slice(0, this.proposalHead),
    ];
    return packr.pack({ format: SNAPSHOT_FORMAT, lastTx: this.lastTx, maxEid: this.maxEid, proposals, ents });
  }

  static deserialize(bytes: Uint8Array): CatalogDb {
    let raw: unknown;
    try {
      raw = packr.unpack(bytes);
    } catch (err) {
      throw new CatalogApplyError(`catalog snapshot is not msgpack: ${(err as Error).message}`);
    }
    const s = raw as {
      format?: unknown;
      lastTx?: unknown;
      maxEid?: unknown;
      proposals?: unknown;
      ents?: unknown;
    };
    if (s === null || typeof s !== "object" || s.format !== SNAPSHOT_FORMAT)
      throw new CatalogApplyError(`not a catalog snapshot (format ${JSON.stringify(s?.format)})`);
    if (
      typeof s.lastTx !== "number" ||
      typeof s.maxEid !== "number" ||
      !Array.isArray(s.proposals) ||
      !Array.isArray(s.ents)
    )
      throw new CatalogApplyError("catalog snapshot is missing lastTx, maxEid, proposals or ents");
    if (!Number.isSafeInteger(s.maxEid) || s.maxEid < 0 || s.maxEid > MAX_EID)
      throw new CatalogApplyError(`catalog snapshot's maxEid ${s.maxEid} is not in [0, ${MAX_EID}]`);
    const db = new CatalogDb();
    const ents = s.ents as unknown[];
    const touched = new Set<number>();
    for (let i = 0; i < ents.length; ) {
      const e = ents[i++] as number;
      const n = ents[i++] as number;
      if (e > s.maxEid) throw new CatalogApplyError(`catalog snapshot's entity ${e} is above its maxEid`);
      for (let k = 0; k < n; k++) {
        const a = ents[i++] as string;
        const v = ents[i++] as Value;
        db.applyDatom([e, a, v, true], touched, true);
      }
    }
    for (const e of touched) db.reindex(e);
    for (const id of s.proposals as string[]) db.remember(id);
    db.lastTx = s.lastTx;
    db.maxEid = s.maxEid;
    return db;
  }
}

const CHUNK_PREFIX = attrInfo("chunk/prefix")!;
const CHUNK_MODEL = attrInfo("chunk/model")!;
const REPLICA_CHUNK = attrInfo("replica/chunk")!;
const REPLICA_WORKER = attrInfo("replica/worker")!;
const REPLICA_TIER = attrInfo("replica/tier")!;
const PLACEMENT_CHUNK = attrInfo("placement/chunk")!;
const PLACEMENT_WORKER = attrInfo("placement/worker")!;
const PLACEMENT_TIER = attrInfo("placement/tier")!;

const SNAPSHOT_FORMAT = "continuum.catalog-db/1";
const packr = new Packr({ useRecords: false, moreTypes: false, mapsAsObjects: true, variableMapSize: true });

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

  constructor(
    private readonly db: CatalogDb,
    /** The writer's clock, ms since the epoch. */
    private readonly now: number,
  ) {
    this.nextEid = db.highestEid + 1;
  }

  private get(e: number, a: Attr): Value | undefined {
    const o = this.overlay.get(e);
    if (o?.has(a)) return o.get(a);
    return this.db.get(e, a);
  }
  private lookup(a: Attr, v: Value): number | undefined {
    return this.newUniq?.get(a)?.get(v) ?? this.db.eidOf(a, v);
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
    if (ATTR_SPECS[a]!.unique) {
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
    return this.newPrefixes?.get(`${model}|${prefix}`) ?? this.db.chunkOf(model, prefix);
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
    const existing = this.lookup("chunk/node", op.node);
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
