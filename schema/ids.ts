/**
 * Branded identifiers and units. A brand makes mixing two kinds of id (or a
 * token count with a page count) a type error; the constructors check shape so
 * a malformed id never travels further than the edge that received it.
 */
declare const brand: unique symbol;
export type Brand<T, B extends string> = T & { readonly [brand]: B };

/** 64 lowercase hex digits: a sha256 digest. */
export type Hex256 = Brand<string, "Hex256">;
/** Prefix-chain hash of a chunk: commits to its parent and its tokens. */
export type PrefixHash = Brand<string, "PrefixHash">;
/** Model fingerprint: sha256 of the canonical model manifest. */
export type ModelFingerprint = Brand<string, "ModelFingerprint">;
/** Catalog node id: hash of (fingerprint, prefix-chain hash). */
export type NodeId = Brand<string, "NodeId">;
/** Content id: hash of stored bytes plus their metadata; the store key. */
export type ContentId = Brand<string, "ContentId">;

export type WorkerId = Brand<string, "WorkerId">;
export type RequestId = Brand<string, "RequestId">;
export type TenantId = Brand<string, "TenantId">;
/** One continuation's resident route on a worker (a request's, a fork's, or a cached prefix's). */
export type ContinuationId = Brand<string, "ContinuationId">;

/** Counts of tokens (rows of attention state). */
export type TokenCount = Brand<number, "TokenCount">;
/** Counts of KV pages. */
export type PageCount = Brand<number, "PageCount">;
/** A physical page index in a page pool. */
export type PageId = Brand<number, "PageId">;
/** Per-page generation: bumps each time a page is freed, fencing late transfers. */
export type Generation = Brand<number, "Generation">;
/** Offset in the catalog transaction log. */
export type LogOffset = Brand<number, "LogOffset">;

export class InvalidIdError extends Error {
  override readonly name = "InvalidIdError";
}

const HEX256 = /^[0-9a-f]{64}$/;

function hex256<T extends Hex256 | PrefixHash | ModelFingerprint | NodeId | ContentId>(
  what: string,
  s: unknown,
): T {
  if (typeof s !== "string" || !HEX256.test(s)) {
    throw new InvalidIdError(
      `${what} must be 64 lowercase hex digits, got ${JSON.stringify(s)?.slice(0, 80)}`,
    );
  }
  return s as T;
}

export const PrefixHash = (s: unknown): PrefixHash => hex256<PrefixHash>("prefix hash", s);
export const ModelFingerprint = (s: unknown): ModelFingerprint =>
  hex256<ModelFingerprint>("model fingerprint", s);
export const NodeId = (s: unknown): NodeId => hex256<NodeId>("node id", s);
export const ContentId = (s: unknown): ContentId => hex256<ContentId>("content id", s);

/** Ids chosen by people or processes: 1–128 printable ASCII characters without spaces. */
const NAME = /^[\x21-\x7e]{1,128}$/;

function name<T extends WorkerId | RequestId | TenantId | ContinuationId>(what: string, s: unknown): T {
  if (typeof s !== "string" || !NAME.test(s)) {
    throw new InvalidIdError(
      `${what} must be 1-128 printable ASCII characters, got ${JSON.stringify(s)?.slice(0, 80)}`,
    );
  }
  return s as T;
}

export const WorkerId = (s: unknown): WorkerId => name<WorkerId>("worker id", s);
export const RequestId = (s: unknown): RequestId => name<RequestId>("request id", s);
export const TenantId = (s: unknown): TenantId => name<TenantId>("tenant id", s);
export const ContinuationId = (s: unknown): ContinuationId => name<ContinuationId>("continuation id", s);

function count<T extends TokenCount | PageCount | PageId | Generation | LogOffset>(
  what: string,
  n: number,
): T {
  if (!Number.isSafeInteger(n) || n < 0)
    throw new InvalidIdError(`${what} must be a non-negative integer, got ${n}`);
  return n as T;
}

export const TokenCount = (n: number): TokenCount => count<TokenCount>("token count", n);
export const PageCount = (n: number): PageCount => count<PageCount>("page count", n);
export const PageId = (n: number): PageId => count<PageId>("page id", n);
export const Generation = (n: number): Generation => count<Generation>("generation", n);
export const LogOffset = (n: number): LogOffset => count<LogOffset>("log offset", n);

/** Pages needed to hold `tokens` rows: ceil(tokens / pageTokens). */
export function pagesFor(tokens: TokenCount, pageTokens: number): PageCount {
  return Math.ceil(tokens / pageTokens) as PageCount;
}
