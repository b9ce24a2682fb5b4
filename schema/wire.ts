import { Schema } from "effect";
import { Packr } from "msgpackr";

/**
 * The wire envelope for every message that crosses a process boundary
 * (catalog proposals and transactions, offers and results, heartbeats):
 * one msgpack map `{v, kind, ...body}`.
 *
 * Decoding is all-or-nothing: bytes are size-checked, unpacked as exactly one
 * msgpack value, checked for version and kind, then validated by the kind's
 * schema. Any failure is a WireError naming what is wrong; a caller never sees
 * a half-decoded message.
 */
export const WIRE_VERSION = 1;

/** Upper bound on one encoded message (16 MiB): larger bytes are refused before unpacking. */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

export class WireError extends Error {
  override readonly name = "WireError";
}

// Plain maps and arrays only (no msgpackr records or structure sharing), so any
// msgpack decoder in any language reads the bytes.
const packr = new Packr({ useRecords: false, moreTypes: false, mapsAsObjects: true, variableMapSize: true });

/** A message kind: its name on the wire and the schema of its body. */
export interface MessageKind<T> {
  readonly kind: string;
  readonly decodeBody: (body: unknown) => T;
}

/** Reserved envelope keys; a body may not use them. */
const ENVELOPE_KEYS = new Set(["v", "kind"]);

/**
 * Defines a message kind from an Effect schema of its body (a struct whose
 * fields sit beside `v` and `kind` in the envelope).
 */
export function defineMessage<S extends Schema.Top & { readonly Type: object }>(
  kind: string,
  schema: S,
): MessageKind<S["Type"]> {
  const decode = Schema.decodeUnknownSync(schema as never) as (u: unknown) => S["Type"];
  return {
    kind,
    decodeBody(body) {
      try {
        return decode(body);
      } catch (err) {
        throw new WireError(`${kind}: invalid message: ${(err as Error).message}`);
      }
    },
  };
}

export function encodeMessage<T extends object>(kind: MessageKind<T>, body: T): Uint8Array {
  for (const key of Object.keys(body)) {
    if (ENVELOPE_KEYS.has(key))
      throw new WireError(`${kind.kind}: body field '${key}' is reserved by the envelope`);
  }
  const bytes = packr.pack({ v: WIRE_VERSION, kind: kind.kind, ...body });
  if (bytes.length > MAX_MESSAGE_BYTES) {
    throw new WireError(
      `${kind.kind}: encoded message is ${bytes.length} bytes, over the ${MAX_MESSAGE_BYTES} limit`,
    );
  }
  return bytes;
}

/**
 * Unpacks and checks the envelope; returns its kind and the map as decoded,
 * `v` and `kind` still in it. For hot paths whose readers ignore those two
 * keys (the writer's proposals): no copy of the body.
 */
export function openMessage(bytes: Uint8Array): { kind: string; value: Record<string, unknown> } {
  if (!(bytes instanceof Uint8Array)) throw new WireError("message must be bytes");
  if (bytes.length === 0) throw new WireError("empty message");
  if (bytes.length > MAX_MESSAGE_BYTES) {
    throw new WireError(`message is ${bytes.length} bytes, over the ${MAX_MESSAGE_BYTES} limit`);
  }
  let values: unknown[];
  try {
    values = packr.unpackMultiple(bytes) as unknown[];
  } catch (err) {
    throw new WireError(`malformed or truncated msgpack: ${(err as Error).message}`);
  }
  if (values.length !== 1) throw new WireError(`expected one msgpack value, found ${values.length}`);
  const value = values[0];
  if (typeof value !== "object" || value === null || Array.isArray(value) || value instanceof Uint8Array) {
    throw new WireError("envelope must be a msgpack map");
  }
  const { v, kind } = value as Record<string, unknown>;
  if (v !== WIRE_VERSION)
    throw new WireError(`unknown wire version ${JSON.stringify(v)} (this build speaks ${WIRE_VERSION})`);
  if (typeof kind !== "string" || kind === "") throw new WireError("envelope has no kind");
  return { kind, value: value as Record<string, unknown> };
}

/** The body of an opened message: its map without `v` and `kind`. */
export function messageBody(value: Record<string, unknown>): Record<string, unknown> {
  const { v: _v, kind: _kind, ...body } = value;
  return body;
}

/** Unpacks and checks the envelope; returns its kind and the remaining body. */
export function openEnvelope(bytes: Uint8Array): { kind: string; body: Record<string, unknown> } {
  const { kind, value } = openMessage(bytes);
  return { kind, body: messageBody(value) };
}

/** Decodes bytes that must hold a message of one kind. */
export function decodeMessage<T>(kind: MessageKind<T>, bytes: Uint8Array): T {
  const env = openEnvelope(bytes);
  if (env.kind !== kind.kind) throw new WireError(`expected a ${kind.kind} message, got ${env.kind}`);
  return kind.decodeBody(env.body);
}

/** A set of kinds a channel accepts (e.g. everything a worker may send the controller). */
export class MessageRegistry<T> {
  private readonly kinds = new Map<string, MessageKind<T>>();

  constructor(kinds: readonly MessageKind<T>[]) {
    for (const k of kinds) {
      if (this.kinds.has(k.kind)) throw new Error(`message kind ${k.kind} registered twice`);
      this.kinds.set(k.kind, k);
    }
  }

  /** Decodes any registered kind; the result carries its kind name. */
  decode(bytes: Uint8Array): { kind: string; message: T } {
    const env = openEnvelope(bytes);
    const k = this.kinds.get(env.kind);
    if (!k) throw new WireError(`unknown message kind ${JSON.stringify(env.kind)}`);
    return { kind: env.kind, message: k.decodeBody(env.body) };
  }
}
