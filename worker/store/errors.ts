import type { ContentId } from "../../schema/ids.ts";

/** Which tier of the store an error or figure belongs to. */
export type TierName = "ram" | "file" | "s3";

/** Base of every chunk-store error; `code` is stable for callers to branch on. */
export abstract class StoreError extends Error {
  abstract readonly code: string;
}

/**
 * The caller's input is wrong: a malformed content id, bytes that are not a
 * Uint8Array, metadata that is not a plain JSON object. Nothing was stored.
 */
export class InvalidChunkError extends StoreError {
  override readonly name = "InvalidChunkError";
  readonly code = "invalid-chunk";
}

/** The bytes and metadata hash to another content id than the one given. Nothing was stored. */
export class ContentMismatchError extends StoreError {
  override readonly name = "ContentMismatchError";
  readonly code = "content-mismatch";
  constructor(
    readonly expected: string,
    readonly actual: ContentId,
  ) {
    super(`bytes and metadata hash to content id ${actual}, not the given ${expected}`);
  }
}

/** An object is larger than a tier (or the store) accepts. Nothing was stored. */
export class ObjectTooLargeError extends StoreError {
  override readonly name = "ObjectTooLargeError";
  readonly code = "object-too-large";
  constructor(
    readonly tier: TierName | "store",
    readonly bytes: number,
    readonly limit: number,
  ) {
    super(`${tier}: object of ${bytes} bytes is over the limit of ${limit} bytes`);
  }
}

/**
 * A stored object failed verification: truncated, bad framing, or its bytes no
 * longer hash to its id. The bytes are never returned.
 */
export class CorruptChunkError extends StoreError {
  override readonly name = "CorruptChunkError";
  readonly code = "corrupt-chunk";
  constructor(
    readonly tier: TierName,
    readonly id: ContentId,
    readonly reason: string,
  ) {
    super(`${tier}: chunk ${id} is corrupt: ${reason}`);
  }
}

/** A tier could not be reached or failed after its bounded retries. */
export class StoreUnavailableError extends StoreError {
  override readonly name = "StoreUnavailableError";
  readonly code = "store-unavailable";
  constructor(
    readonly tier: TierName,
    readonly op: string,
    readonly attempts: number,
    override readonly cause: unknown,
  ) {
    super(`${tier}: ${op} failed after ${attempts} attempt${attempts === 1 ? "" : "s"}: ${describe(cause)}`);
  }
}

/** A required write found the write-behind queue full and no room came within its wait. Nothing was stored. */
export class WriteBehindTimeoutError extends StoreError {
  override readonly name = "WriteBehindTimeoutError";
  readonly code = "write-behind-timeout";
  constructor(
    readonly waitedMs: number,
    readonly depth: number,
    readonly capacity: number,
  ) {
    super(
      `write-behind queue stayed full (${depth}/${capacity} jobs) for ${waitedMs} ms; the required write was not accepted`,
    );
  }
}

/** The store was closed; it accepts no more work. */
export class StoreClosedError extends StoreError {
  override readonly name = "StoreClosedError";
  readonly code = "store-closed";
}

/** One line for any thrown value, with the errno/S3 code when there is one. */
export function describe(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    const name = err.name && err.name !== "Error" ? err.name : "";
    const tag = [name, typeof code === "string" ? code : ""].filter(Boolean).join("/");
    return tag ? `${tag}: ${err.message}` : err.message;
  }
  return String(err);
}

/**
 * The file tier is at its byte bound (store.dir.maxBytes): the object would
 * take it past. Nothing was stored; callers keep the chunk elsewhere or skip
 * it, as for a full write-behind queue.
 */
export class FileFullError extends StoreError {
  override readonly name = "FileFullError";
  readonly code = "file-full";
  constructor(
    readonly bytes: number,
    readonly heldBytes: number,
    readonly limit: number,
  ) {
    super(`file: no room for ${bytes} bytes: ${heldBytes} of ${limit} bytes held (store.dir.maxBytes)`);
  }
}

/** The RAM tier cannot make room: pinned entries hold too much of it. Nothing was stored. */
export class RamFullError extends StoreError {
  override readonly name = "RamFullError";
  readonly code = "ram-full";
  constructor(
    readonly bytes: number,
    readonly pinnedBytes: number,
    readonly limit: number,
  ) {
    super(`ram: no room for ${bytes} bytes: ${pinnedBytes} of ${limit} bytes are pinned`);
  }
}
