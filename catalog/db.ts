import { createHash } from "node:crypto";
import datascript, { type DB, type TxItem } from "datascript";
import { Packr } from "msgpackr";
import {
  ATTRIBUTES,
  type Attr,
  type Datom,
  datascriptSchema,
  type Proposal,
  type TxRecord,
} from "../schema/catalog.ts";
import { ChunkLinks } from "./chunk-links.ts";
import { attrInfo, EntityStore, MAX_EID, ownString, type Value } from "./entity-store.ts";
import { HexIndex } from "./hex-index.ts";
import { type ResolveResult, type RulesDb, resolveProposal } from "./rules.ts";

/**
 * The catalog database: the state every replica (and the writer) holds.
 * The rules a proposal must pass are catalog/rules.ts; `resolve` runs them
 * against this db.
 *
 * Two representations of one state:
 * - the entity store (catalog/entity-store.ts: one table of typed columns per
 *   namespace) with the unique indexes and the hot-path indexes below. It is
 *   authoritative: `resolve` validates against it, `apply` updates it, `dbHash`
 *   and `serialize` read it. Applying a datom costs a few array writes, so a
 *   replica keeps up with the log far above DataScript's transact rate
 *   (bench/catalog.md), and a chunk with its replica fact adds
 *   no object to the JS heap (V8's collections of a growing heap set the
 *   apply-lag tail).
 * - the DataScript db for Datalog (`datalog()`), materialized from the same
 *   datoms: folded in with `db_with` when few are pending, rebuilt in bulk with
 *   `init_db` (much faster per datom) when many are. Its content (e, a, v)
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

export class CatalogApplyError extends Error {
  override readonly name = "CatalogApplyError";
}

export class CatalogDb implements RulesDb {
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
  eidOfHex(a: Attr, v: string): number | undefined {
    return this.hexUnique.get(a)?.findHex(v);
  }
  chunkOfHex(model: number, prefix: string): number | undefined {
    return this.prefixes.findHex(prefix, model);
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
   * Checks `p` against this db (catalog/rules.ts); changes nothing. `now` is
   * the writer's clock (ms since the epoch): leases expire by it.
   */
  resolve(p: Proposal, now: number): ResolveResult {
    return resolveProposal(this, p, now);
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
        // refusal() checked a hex value's digits.
        const hex = this.hexUnique.get(info.attr);
        const holder = hex !== undefined ? hex.findHex(v as string) : this.strUnique.get(info.attr)!.get(v);
        if (holder !== undefined && holder !== e)
          throw new CatalogApplyError(`${a} ${String(v)} already held by ${holder}`);
      }
      if (this.store.put(e, info, v)) this.datomTotal++;
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
