import { Schema } from "effect";
import { defineMessage, type MessageKind, messageBody } from "./wire.ts";

/**
 * The catalog's vocabulary: the DataScript schema (attributes, value types,
 * which are unique and which are indexed), the operations anyone may propose,
 * and the three messages of the catalog topics.
 *
 * Flow: a client sends a `catalog.proposal` (an idempotency key, its client id
 * and a list of operations) to `catalog.proposals`; the single writer checks it
 * against its db and appends either a `catalog.tx` (numbered, with the resolved
 * datoms) to `catalog.tx` or a `catalog.rejection` (with a reason) to
 * `catalog.rejections`. Replicas apply the datoms as they are: entity ids are
 * assigned once, by the writer. catalog/WIRE.md documents the bytes.
 *
 * Every attribute is cardinality one. Ids travel as 64-hex strings (node,
 * prefix, fingerprint, content) or printable names (worker, tenant, request);
 * catalog/rules.ts checks their shape when it resolves a proposal.
 */

/** Value type of an attribute; `ref` holds another entity's id. */
export type AttrType = "string" | "number" | "boolean" | "ref";

export interface AttrSpec {
  readonly type: AttrType;
  /** Unique identity: at most one entity holds a value (writer-enforced; DataScript `:db.unique/identity`). */
  readonly unique?: true;
  /** In DataScript's AVET index (needed by lookups on the value). */
  readonly index?: true;
  readonly doc: string;
}

/**
 * Every attribute of the catalog. Lean on purpose: a chunk publication is 10
 * datoms and its replica fact 5; only identities and refs that queries walk
 * backwards are indexed.
 */
export const ATTRIBUTES = {
  // model: what makes attention state interchangeable
  "model/fingerprint": { type: "string", unique: true, doc: "model fingerprint (64 hex)" },
  "model/name": { type: "string", doc: "human name of the model" },
  "model/layout": { type: "string", doc: "attention-state layout, e.g. kv-gqa/v2" },
  "model/chunk-tokens": { type: "number", doc: "tokens per durable chunk" },

  // worker: an inference process that may hold replicas
  "worker/id": { type: "string", unique: true, doc: "worker id" },
  "worker/model": { type: "ref", doc: "the model the worker serves" },
  "worker/address": { type: "string", doc: "peer transfer address host:port" },

  // chunk: an immutable, published range of attention state
  "chunk/node": { type: "string", unique: true, doc: "catalog node id = H(fingerprint, prefix)" },
  "chunk/prefix": { type: "string", doc: "prefix-chain hash" },
  "chunk/parent": { type: "ref", doc: "the parent chunk (absent at the root of a chain)" },
  "chunk/model": { type: "ref", doc: "the model whose state this is" },
  "chunk/start": { type: "number", doc: "first token row" },
  "chunk/tokens": { type: "number", doc: "token rows in the chunk" },
  "chunk/content": { type: "string", doc: "content id: the store key" },
  "chunk/bytes": { type: "number", doc: "stored size in bytes" },
  "chunk/layout": { type: "string", doc: "attention-state layout of the bytes" },
  "chunk/created": { type: "number", doc: "ms since the epoch, by the publisher" },

  // replica: one copy of a chunk on one worker's tier
  "replica/chunk": { type: "ref", index: true, doc: "the chunk copied" },
  "replica/worker": { type: "ref", doc: "the worker holding it" },
  "replica/tier": { type: "string", doc: "ram | ssd | s3 | peer" },
  "replica/state": { type: "string", doc: "ready | bad | removed" },
  "replica/verified-at": { type: "number", doc: "ms since the epoch of the last verified read or write" },

  // demand: an aggregated observation of requests wanting a node
  "demand/node": { type: "string", doc: "catalog node id wanted (published or not)" },
  "demand/model": { type: "ref", doc: "the model" },
  "demand/tenant": { type: "string", doc: "tenant id" },
  "demand/time": { type: "number", doc: "ms since the epoch: end of the observation window" },
  "demand/count": { type: "number", doc: "requests in the window whose chain contains the node" },

  // lease: an epoch-fenced claim on a key (e.g. a placement authority)
  "lease/key": { type: "string", unique: true, doc: "what is leased" },
  "lease/holder": { type: "string", doc: "who holds it" },
  "lease/epoch": { type: "number", doc: "fencing epoch: strictly increases on each new holder" },
  "lease/state": { type: "string", doc: "held | released" },
  "lease/expires": {
    type: "number",
    doc: "ms since the epoch, by the writer's clock: the holder's claim ends here unless renewed",
  },

  // placement: where a node is desired to be, issued under a lease
  "placement/chunk": { type: "ref", index: true, doc: "the chunk to place" },
  "placement/worker": { type: "ref", doc: "the target worker" },
  "placement/tier": { type: "string", doc: "target tier" },
  "placement/desired": { type: "boolean", doc: "true: keep a copy there; false: the copy may go" },
  "placement/lease": { type: "ref", doc: "the lease it was issued under" },
  "placement/epoch": { type: "number", doc: "the lease epoch it was issued at" },

  // decision: one routing/admission decision, its inputs, prediction and outcome
  "decision/key": { type: "string", unique: true, doc: "request id + '#' + attempt" },
  "decision/request": { type: "string", doc: "request id" },
  "decision/attempt": { type: "number", doc: "assignment attempt" },
  "decision/tenant": { type: "string", doc: "tenant id" },
  "decision/model": { type: "ref", doc: "the model" },
  "decision/time": { type: "number", doc: "ms since the epoch" },
  "decision/candidates": { type: "string", doc: "the ranked candidates, as JSON" },
  "decision/worker": { type: "ref", doc: "the chosen worker" },
  "decision/source": { type: "string", doc: "resident | ram | ssd | s3 | peer | recompute" },
  "decision/cached-tokens": { type: "number", doc: "tokens reused by the choice" },
  "decision/predicted-ttft-ms": { type: "number", doc: "predicted time to first token" },
  "decision/measured-ttft-ms": { type: "number", doc: "measured time to first token, once known" },
} as const satisfies Record<string, AttrSpec>;

export type Attr = keyof typeof ATTRIBUTES;

export const TIERS = ["ram", "ssd", "s3", "peer"] as const;
export type Tier = (typeof TIERS)[number];
export const REPLICA_STATES = ["ready", "bad", "removed"] as const;
export type ReplicaState = (typeof REPLICA_STATES)[number];
export const DECISION_SOURCES = ["resident", "ram", "ssd", "s3", "peer", "recompute"] as const;
export type DecisionSource = (typeof DECISION_SOURCES)[number];

/** The schema object DataScript's `empty_db`/`init_db` take. */
export function datascriptSchema(): Record<string, Record<string, string | boolean>> {
  const out: Record<string, Record<string, string | boolean>> = {};
  for (const [name, spec] of Object.entries(ATTRIBUTES) as [Attr, AttrSpec][]) {
    const s: Record<string, string | boolean> = {};
    if (spec.type === "ref") s[":db/valueType"] = ":db.type/ref";
    if (spec.unique) s[":db/unique"] = ":db.unique/identity";
    if (spec.index) s[":db/index"] = true;
    out[name] = s;
  }
  return out;
}

// ---------------------------------------------------------------- operations

const Str = Schema.String;
const Num = Schema.Number;

export const ModelRegistered = Schema.Struct({
  op: Schema.Literal("model.registered"),
  fingerprint: Str,
  name: Str,
  layout: Str,
  chunkTokens: Num,
});
export const WorkerRegistered = Schema.Struct({
  op: Schema.Literal("worker.registered"),
  worker: Str,
  model: Str,
  address: Str,
});
export const ChunkPublished = Schema.Struct({
  op: Schema.Literal("chunk.published"),
  node: Str,
  prefix: Str,
  /** Prefix hash of the parent; its node must be published unless start is 0. */
  parent: Str,
  model: Str,
  start: Num,
  tokens: Num,
  content: Str,
  bytes: Num,
  layout: Str,
  created: Num,
});
/** A replica's state change: ready (verified copy present), bad (failed verification), removed. */
export const ReplicaChanged = Schema.Struct({
  op: Schema.Literals(["replica.ready", "replica.bad", "replica.removed"]),
  node: Str,
  worker: Str,
  tier: Str,
  verifiedAt: Num,
});
export const DemandObserved = Schema.Struct({
  op: Schema.Literal("demand.observed"),
  node: Str,
  model: Str,
  tenant: Str,
  time: Num,
  count: Num,
});
/**
 * Acquire: a new or released key, a renewal (same holder at the same epoch),
 * or a strictly higher epoch — by another holder only once the lease has
 * expired. Either way it holds for `ttlMs` from the writer's clock.
 */
export const LeaseAcquire = Schema.Struct({
  op: Schema.Literal("lease.acquire"),
  key: Str,
  holder: Str,
  epoch: Num,
  ttlMs: Num,
});
/** Release: only by the current holder at the current epoch. */
export const LeaseRelease = Schema.Struct({
  op: Schema.Literal("lease.release"),
  key: Str,
  holder: Str,
  epoch: Num,
});
/** Placement, fenced: the lease must be held now (not expired, by the writer's clock) at exactly `epoch`. */
export const PlacementSet = Schema.Struct({
  op: Schema.Literal("placement.set"),
  node: Str,
  worker: Str,
  tier: Str,
  desired: Schema.Boolean,
  lease: Str,
  epoch: Num,
});
export const DecisionRecorded = Schema.Struct({
  op: Schema.Literal("decision.recorded"),
  request: Str,
  attempt: Num,
  tenant: Str,
  model: Str,
  time: Num,
  /** The ranked candidates with their predictions, as JSON text. */
  candidates: Str,
  worker: Str,
  source: Str,
  cachedTokens: Num,
  predictedTtftMs: Num,
});
export const DecisionMeasured = Schema.Struct({
  op: Schema.Literal("decision.measured"),
  request: Str,
  attempt: Num,
  measuredTtftMs: Num,
});

export const CatalogOp = Schema.Union([
  ModelRegistered,
  WorkerRegistered,
  ChunkPublished,
  ReplicaChanged,
  DemandObserved,
  LeaseAcquire,
  LeaseRelease,
  PlacementSet,
  DecisionRecorded,
  DecisionMeasured,
]);
export type CatalogOp = typeof CatalogOp.Type;
export type ModelRegisteredOp = typeof ModelRegistered.Type;
export type WorkerRegisteredOp = typeof WorkerRegistered.Type;
export type ChunkPublishedOp = typeof ChunkPublished.Type;
export type ReplicaChangedOp = typeof ReplicaChanged.Type;
export type DemandObservedOp = typeof DemandObserved.Type;
export type LeaseAcquireOp = typeof LeaseAcquire.Type;
export type LeaseReleaseOp = typeof LeaseRelease.Type;
export type PlacementSetOp = typeof PlacementSet.Type;
export type DecisionRecordedOp = typeof DecisionRecorded.Type;
export type DecisionMeasuredOp = typeof DecisionMeasured.Type;

/** Upper bound on operations in one proposal (one tx). */
export const MAX_OPS_PER_PROPOSAL = 4096;

// ------------------------------------------------------------------ messages

export const ProposalBody = Schema.Struct({
  /** Idempotency key: a proposal id applied once is never applied again. */
  id: Str,
  clientId: Str,
  ops: Schema.Array(CatalogOp),
});
export type Proposal = { readonly id: string; readonly clientId: string; readonly ops: readonly CatalogOp[] };

/** One datom: entity id, attribute, value, added (false: retraction). */
export type Datom = readonly [e: number, a: string, v: string | number | boolean, added: boolean];

export interface TxRecord {
  /** 1, 2, 3…: the total order; the db before tx n has applied exactly n − 1 txs. */
  readonly txNo: number;
  readonly proposalId: string;
  readonly clientId: string;
  /** Writer's clock when accepted, ms since the epoch. */
  readonly time: number;
  readonly datoms: readonly Datom[];
}

const ATTRIBUTE_NAMES: ReadonlySet<string> = new Set(Object.keys(ATTRIBUTES));

/**
 * Hand-written guard: a tx carries thousands of datoms, so this is the hot
 * decode path. Indexed reads and a Set of names, not destructuring and `in`
 * on the attribute object (which cost over twice as much; bench/catalog.md).
 */
function isDatoms(u: unknown): u is Datom[] {
  if (!Array.isArray(u)) return false;
  for (let i = 0; i < u.length; i++) {
    const d: unknown = u[i];
    if (!Array.isArray(d) || d.length !== 4) return false;
    const e: unknown = d[0];
    const a: unknown = d[1];
    const v: unknown = d[2];
    const added: unknown = d[3];
    if (typeof e !== "number" || !Number.isSafeInteger(e) || e <= 0) return false;
    if (typeof a !== "string" || !ATTRIBUTE_NAMES.has(a)) return false;
    const t = typeof v;
    if (t !== "string" && t !== "number" && t !== "boolean") return false;
    if (typeof added !== "boolean") return false;
  }
  return true;
}

/**
 * The tx body. Replicas decode every tx, so its check is one hand-written
 * guard (an Effect Struct around it cost more than the msgpack decode).
 */
function isTxBody(u: unknown): u is TxRecord {
  if (typeof u !== "object" || u === null) return false;
  const t = u as Record<string, unknown>;
  return (
    typeof t.txNo === "number" &&
    Number.isSafeInteger(t.txNo) &&
    t.txNo >= 1 &&
    typeof t.proposalId === "string" &&
    typeof t.clientId === "string" &&
    typeof t.time === "number" &&
    isDatoms(t.datoms)
  );
}

export const TxBody = Schema.declare<TxRecord>(isTxBody, {
  expected:
    "{txNo: integer ≥ 1, proposalId: string, clientId: string, time: number, datoms: [entity id > 0, known attribute, string|number|boolean, added boolean][]}",
});

export interface Rejection {
  /** The proposal's id, or null when the bytes did not decode as a proposal. */
  readonly proposalId: string | null;
  readonly clientId: string | null;
  readonly reason: string;
  /** Offset of the rejected message on the proposals topic. */
  readonly proposalOffset: number;
}

export const RejectionBody = Schema.Struct({
  proposalId: Schema.NullOr(Str),
  clientId: Schema.NullOr(Str),
  reason: Str,
  proposalOffset: Num,
});

/**
 * Proposal decoding, fast path: a guard derived from the op schemas above
 * (each field String, Number or Boolean; `op` a literal) that accepts exactly
 * what they accept and, like them, drops unknown fields. Anything it refuses
 * goes through the Effect schema, which names what is wrong. The writer
 * decodes every proposal, and the Effect union costs several times the
 * msgpack decode.
 */
const OP_MEMBERS = [
  ModelRegistered,
  WorkerRegistered,
  ChunkPublished,
  ReplicaChanged,
  DemandObserved,
  LeaseAcquire,
  LeaseRelease,
  PlacementSet,
  DecisionRecorded,
  DecisionMeasured,
] as const;

/** An op's fields other than `op`, and the typeof each must have. */
interface OpShape {
  readonly fields: readonly string[];
  readonly types: readonly ("string" | "number" | "boolean")[];
}

function fieldType(op: string, field: string, s: unknown): "string" | "number" | "boolean" {
  if (s === Schema.String) return "string";
  if (s === Schema.Number) return "number";
  if (s === Schema.Boolean) return "boolean";
  throw new Error(`catalog op ${op}: field ${field} has a type the fast guard does not know`);
}

const OP_SHAPES = new Map<string, OpShape>();
for (const member of OP_MEMBERS) {
  const { op, ...rest } = member.fields as Record<string, unknown>;
  const tag = op as { literal?: string; literals?: readonly string[] };
  const names = tag.literals ?? [tag.literal!];
  for (const name of names) {
    const entries = Object.entries(rest);
    OP_SHAPES.set(name, {
      fields: entries.map(([field]) => field),
      types: entries.map(([field, s]) => fieldType(name, field, s)),
    });
  }
}

/**
 * The op, checked against its shape. An object with exactly the shape's own
 * keys is returned as it is; one with more (unknown fields, which the schema
 * drops) is copied without them.
 */
function fastOp(u: unknown): CatalogOp | undefined {
  if (typeof u !== "object" || u === null || Array.isArray(u)) return undefined;
  const o = u as Record<string, unknown>;
  const shape = typeof o.op === "string" ? OP_SHAPES.get(o.op) : undefined;
  if (shape === undefined) return undefined;
  const { fields, types } = shape;
  for (let i = 0; i < fields.length; i++) {
    if (typeof o[fields[i]!] !== types[i]) return undefined;
  }
  let keys = 0;
  for (const k in o) {
    if (!Object.hasOwn(o, k)) return copyOp(o, fields);
    keys++;
  }
  return keys === fields.length + 1 ? (o as CatalogOp) : copyOp(o, fields);
}

function copyOp(o: Record<string, unknown>, fields: readonly string[]): CatalogOp {
  const out: Record<string, unknown> = { op: o.op };
  for (const f of fields) out[f] = o[f];
  return out as CatalogOp;
}

/** The fast guard alone: the decoded proposal, or undefined where the Effect schema must decide. */
export function decodeProposalFast(body: unknown): Proposal | undefined {
  if (typeof body !== "object" || body === null) return undefined;
  const b = body as Record<string, unknown>;
  if (typeof b.id !== "string" || typeof b.clientId !== "string" || !Array.isArray(b.ops)) return undefined;
  const ops: CatalogOp[] = new Array(b.ops.length);
  for (let i = 0; i < b.ops.length; i++) {
    const op = fastOp(b.ops[i]);
    if (op === undefined) return undefined;
    ops[i] = op;
  }
  return { id: b.id, clientId: b.clientId, ops };
}

const checkedProposal = defineMessage("catalog.proposal", ProposalBody);
export const ProposalMsg: MessageKind<Proposal> = {
  kind: checkedProposal.kind,
  decodeBody: (body) => decodeProposalFast(body) ?? checkedProposal.decodeBody(body),
};
/**
 * A proposal from its opened envelope (openMessage's `value`, `v` and `kind`
 * still in it: the fast guard reads neither, so the writer copies no body).
 * Throws WireError as ProposalMsg.decodeBody does.
 */
export function decodeProposalValue(value: Record<string, unknown>): Proposal {
  return decodeProposalFast(value) ?? checkedProposal.decodeBody(messageBody(value));
}
/**
 * Tx decoding: the guard alone decides (the body is returned as it is, as
 * Schema.declare would); only a body it refuses goes through the Effect
 * schema, for the error message. The Effect call alone costs more than
 * unpacking the tx's bytes (bench/catalog.md), and every replica decodes every tx.
 */
const checkedTx = defineMessage("catalog.tx", TxBody);
export const TxMsg: MessageKind<TxRecord> = {
  kind: checkedTx.kind,
  decodeBody: (body) => (isTxBody(body) ? body : checkedTx.decodeBody(body)),
};
export const RejectionMsg: MessageKind<Rejection> = defineMessage("catalog.rejection", RejectionBody);
