import { createHash } from "node:crypto";
import type { ContentId, ModelFingerprint, NodeId, PrefixHash } from "./ids.ts";

/**
 * The four identities of the architecture's Identity section. All are sha256
 * digests written as 64 lowercase hex digits, and each is domain-separated by
 * a versioned tag, so a change of format is a change of tag and never a silent
 * collision with old ids. Golden vectors in test/schema/identity.test.ts pin
 * every one of them.
 */
export const PREFIX_CHAIN_TAG = "continuum/prefix-chain/v1";
export const TENANT_SALT_TAG = "continuum/tenant-salt/v1";
export const MODEL_MANIFEST_TAG = "continuum/model-manifest/v1";
export const CATALOG_NODE_TAG = "continuum/catalog-node/v1";
export const CONTENT_TAG = "continuum/content/v1";

const ZERO32 = new Uint8Array(32);

function hexToBytes(hex: string): Uint8Array {
  return Uint8Array.from(Buffer.from(hex, "hex"));
}

function u32le(n: number): Uint8Array {
  if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new RangeError(`not a u32: ${n}`);
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n, true);
  return b;
}

/**
 * The parent of the first chunk. Without a salt it is 32 zero bytes; with a
 * tenant cache salt it is sha256(TENANT_SALT_TAG ‖ u32 len ‖ salt), so one
 * tenant's chain never meets another's, not even as a probe.
 */
export function chainRoot(salt?: string): PrefixHash {
  if (salt === undefined || salt === "") return Buffer.from(ZERO32).toString("hex") as PrefixHash;
  const s = Buffer.from(salt, "utf8");
  return createHash("sha256")
    .update(TENANT_SALT_TAG)
    .update(u32le(s.length))
    .update(s)
    .digest("hex") as PrefixHash;
}

/**
 * One chain node: sha256(tag ‖ parent ‖ u32 count ‖ u32 tokens…), all
 * little-endian. Commits to every token before it through `parent`.
 */
export function chainHash(parent: PrefixHash, tokens: ArrayLike<number>): PrefixHash {
  const buf = new Uint8Array(4 + 4 * tokens.length);
  const view = new DataView(buf.buffer);
  view.setUint32(0, tokens.length, true);
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (!Number.isInteger(t) || t < 0 || t > 0xffffffff)
      throw new RangeError(`token ${i} is not a u32: ${t}`);
    view.setUint32(4 + 4 * i, t, true);
  }
  return createHash("sha256")
    .update(PREFIX_CHAIN_TAG)
    .update(hexToBytes(parent))
    .update(buf)
    .digest("hex") as PrefixHash;
}

/** One node of a planned chain: the chunk's hash and its token range [start, start + count). */
export interface ChainNode {
  readonly hash: PrefixHash;
  readonly parent: PrefixHash;
  readonly start: number;
  readonly count: number;
}

/**
 * The chain of whole chunks of `tokens` (a trailing partial chunk is not a
 * node). Only processed tokens are hashed: a caller leaving the last token
 * pending passes the tokens before it.
 */
export function prefixChain(tokens: ArrayLike<number>, chunkTokens: number, salt?: string): ChainNode[] {
  if (!Number.isInteger(chunkTokens) || chunkTokens <= 0)
    throw new RangeError(`chunk size must be positive: ${chunkTokens}`);
  const nodes: ChainNode[] = [];
  let parent = chainRoot(salt);
  for (let start = 0; start + chunkTokens <= tokens.length; start += chunkTokens) {
    const slice = Array.prototype.slice.call(tokens, start, start + chunkTokens) as number[];
    const hash = chainHash(parent, slice);
    nodes.push({ hash, parent, start, count: chunkTokens });
    parent = hash;
  }
  return nodes;
}

/** JSON with object keys sorted at every depth: one text per value. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value))
      throw new RangeError("canonical JSON has no NaN/Infinity");
    if (value === undefined) throw new RangeError("canonical JSON has no undefined");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
}

/**
 * What makes two workers' attention state interchangeable. Two workers share
 * chunks only when their fingerprints are equal.
 */
export interface ModelManifest {
  /** sha256 over the weights (tensor names, dtypes, shapes and bytes, in name order). */
  readonly weightsDigest: string;
  /** The architecture config that shapes the computation (layers, heads, dims, rope, eps…). */
  readonly architecture: Record<string, unknown>;
  /**
   * How a block-quantized model's weights are stored, which decides the
   * numbers computed from them: a GGUF file's mix such as "f32+q4_k+q6_k" (the
   * distinct tensor types, lowercase, sorted, joined by "+"). So chunks
   * computed from a Q4 model are never reused by an F16 one, whatever else
   * they share. Absent for f32/f16/bf16 models, whose dtypes the weights
   * digest names (their fingerprints predate this field).
   */
  readonly weightFormat?: string;
  /** KV page element type, e.g. "f16". */
  readonly kvDtype: string;
  /** Attention-state layout, e.g. "kv-gqa/v2". */
  readonly layout: string;
  /** Execution variant whose numerics the bytes depend on, e.g. "cpu-f32acc/v1". */
  readonly variant: string;
}

export function modelFingerprint(manifest: ModelManifest): ModelFingerprint {
  return createHash("sha256")
    .update(MODEL_MANIFEST_TAG)
    .update(canonicalJson(manifest))
    .digest("hex") as ModelFingerprint;
}

/** Catalog node id: sha256(tag ‖ fingerprint ‖ prefix hash). */
export function catalogNodeId(fingerprint: ModelFingerprint, prefix: PrefixHash): NodeId {
  return createHash("sha256")
    .update(CATALOG_NODE_TAG)
    .update(hexToBytes(fingerprint))
    .update(hexToBytes(prefix))
    .digest("hex") as NodeId;
}

/**
 * Content id of stored bytes and their metadata:
 * sha256(tag ‖ u32 len(meta) ‖ canonicalJson(meta) ‖ bytes). The store key;
 * every read recomputes it before bytes reach a page.
 */
export function contentId(bytes: Uint8Array, meta: Record<string, unknown>): ContentId {
  const m = Buffer.from(canonicalJson(meta), "utf8");
  return createHash("sha256")
    .update(CONTENT_TAG)
    .update(u32le(m.length))
    .update(m)
    .update(bytes)
    .digest("hex") as ContentId;
}
