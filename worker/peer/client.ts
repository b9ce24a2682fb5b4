import type { ContentId } from "../../schema/ids.ts";
import {
  checkDigest,
  contentHasher,
  HEADER_BYTES,
  parseHeader,
  parseMeta,
  VerifiedChunk,
} from "../store/chunk.ts";

/**
 * Reads a chunk from a peer worker (worker/peer/server.ts) and verifies it
 * like a tier read: framing, canonical metadata, then the content id over
 * metadata and payload. Corrupt bytes are never returned (CorruptChunkError,
 * reported as the "file" tier of the peer, which is where they came from);
 * absent is undefined; anything else (refused, unreachable, past the
 * deadline) throws PeerUnavailableError.
 */
export class PeerUnavailableError extends Error {
  override readonly name = "PeerUnavailableError";
}

export interface PeerFetchOptions {
  readonly secret: string;
  readonly signal?: AbortSignal;
  /** Bytes [from, to] of the framed object (a range request); the whole object when absent. */
  readonly range?: readonly [number, number];
}

export async function fetchPeerBytes(
  address: string,
  id: ContentId,
  opts: PeerFetchOptions,
): Promise<Uint8Array | undefined> {
  let res: Response;
  try {
    res = await fetch(`http://${address}/v1/chunks/${id}`, {
      headers: {
        authorization: `Bearer ${opts.secret}`,
        ...(opts.range && { range: `bytes=${opts.range[0]}-${opts.range[1]}` }),
      },
      ...(opts.signal && { signal: opts.signal }),
    });
  } catch (err) {
    throw new PeerUnavailableError(`peer ${address}: ${(err as Error).message}`);
  }
  if (res.status === 404) {
    await res.body?.cancel();
    return undefined;
  }
  if (res.status !== 200 && res.status !== 206) {
    const body = await res.text().catch(() => "");
    throw new PeerUnavailableError(`peer ${address}: HTTP ${res.status} ${body}`);
  }
  try {
    return new Uint8Array(await res.arrayBuffer());
  } catch (err) {
    throw new PeerUnavailableError(`peer ${address}: body failed: ${(err as Error).message}`);
  }
}

/** The verified chunk from a peer, undefined when the peer does not hold it. */
export async function fetchPeerChunk(
  address: string,
  id: ContentId,
  opts: PeerFetchOptions,
): Promise<VerifiedChunk | undefined> {
  const framed = await fetchPeerBytes(address, id, {
    secret: opts.secret,
    ...(opts.signal && { signal: opts.signal }),
  });
  if (framed === undefined) return undefined;
  const frame = parseHeader("file", id, framed, framed.byteLength);
  const metaJson = Buffer.from(framed.subarray(HEADER_BYTES, frame.payloadOffset));
  const meta = parseMeta("file", id, metaJson);
  const payload = framed.subarray(frame.payloadOffset);
  checkDigest("file", id, contentHasher(metaJson).update(payload));
  return VerifiedChunk.trusted(id, payload, meta, metaJson);
}
