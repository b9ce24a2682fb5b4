import { TxMsg, type TxRecord } from "./catalog.ts";
import { encodeMessage, MAX_MESSAGE_BYTES, WIRE_VERSION, WireError } from "./wire.ts";

/**
 * The writer's encoder of `catalog.tx` messages: the same bytes as
 * `encodeMessage(TxMsg, tx)` (test/schema/tx-encode.test.ts compares them on
 * random txs), written by hand because the writer encodes every accepted
 * proposal and msgpackr's generic packer spends its time choosing how to
 * write each value of a shape known in advance (bench/catalog.md).
 *
 * The rules are msgpackr's with this project's settings (schema/wire.ts):
 * a map with keys in order v, kind, txNo, proposalId, clientId, time, datoms;
 * integers in [0, 2^32) as positive fixint (< 128), uint8, uint16 or uint32;
 * integers in [-2^31, 0) as negative fixint, int8, int16 or int32; every other
 * number as float64; strings as UTF-8 with the smallest str header (a lone
 * surrogate as U+FFFD); arrays with the smallest array header. Any other
 * datom value falls back to encodeMessage, which refuses it the same way.
 */
export function encodeTx(tx: TxRecord): Uint8Array {
  const datoms = tx.datoms;
  // Upper bound: 3 bytes per UTF-16 unit of every string, 9 per number, 5 per header.
  let bound = 64 + 3 * (tx.proposalId.length + tx.clientId.length) + 18 + 5;
  for (let i = 0; i < datoms.length; i++) {
    const d = datoms[i]!;
    const v = d[2];
    bound += 1 + 9 + 5 + 3 * d[1].length + 1 + (typeof v === "string" ? 5 + 3 * v.length : 9);
    if (typeof v !== "string" && typeof v !== "number" && typeof v !== "boolean")
      return encodeMessage(TxMsg, tx);
  }
  if (bound > MAX_BOUND) return encodeMessage(TxMsg, tx);
  if (rest < bound) newChunk(bound);
  let p = out.length - rest;
  const start = p;
  const b = out;
  b[p++] = 0x87;
  p = bytes(b, p, KEY_V);
  p = num(b, p, WIRE_VERSION);
  p = bytes(b, p, KEY_KIND);
  p = bytes(b, p, KIND);
  p = bytes(b, p, KEY_TXNO);
  p = num(b, p, tx.txNo);
  p = bytes(b, p, KEY_PROPOSAL_ID);
  p = str(b, p, tx.proposalId);
  p = bytes(b, p, KEY_CLIENT_ID);
  p = str(b, p, tx.clientId);
  p = bytes(b, p, KEY_TIME);
  p = num(b, p, tx.time);
  p = bytes(b, p, KEY_DATOMS);
  p = arrayHeader(b, p, datoms.length);
  for (let i = 0; i < datoms.length; i++) {
    const d = datoms[i]!;
    b[p++] = 0x94;
    p = num(b, p, d[0]);
    p = attr(b, p, d[1]);
    const v = d[2];
    if (typeof v === "string") p = str(b, p, v);
    else if (typeof v === "number") p = num(b, p, v);
    else b[p++] = v ? 0xc3 : 0xc2;
    b[p++] = d[3] ? 0xc3 : 0xc2;
  }
  if (p - start > MAX_MESSAGE_BYTES) {
    throw new WireError(
      `catalog.tx: encoded message is ${p - start} bytes, over the ${MAX_MESSAGE_BYTES} limit`,
    );
  }
  rest = out.length - p;
  return b.subarray(start, p);
}

/**
 * Output is written into chunks of CHUNK_BYTES and handed out as subarrays
 * (as msgpackr does), so an encoded tx is never copied; a chunk lives as long
 * as any tx encoded into it.
 */
const CHUNK_BYTES = 64 * 1024;
let out = Buffer.allocUnsafeSlow(CHUNK_BYTES);
/** Bytes left at the end of `out`. */
let rest = out.length;

/** A tx whose bound passes this goes to encodeMessage (which refuses it past MAX_MESSAGE_BYTES). */
const MAX_BOUND = 4 * MAX_MESSAGE_BYTES;

function newChunk(atLeast: number): void {
  out = Buffer.allocUnsafeSlow(Math.max(CHUNK_BYTES, atLeast));
  rest = out.length;
}

const enc = (s: string): Uint8Array => Buffer.from(strBytes(s));
/** msgpack str bytes (header + UTF-8) of a constant string. */
function strBytes(s: string): Uint8Array {
  const tmp = Buffer.alloc(5 + 3 * s.length);
  return tmp.subarray(0, str(tmp, 0, s));
}
const KEY_V = enc("v");
const KEY_KIND = enc("kind");
const KIND = enc(TxMsg.kind);
const KEY_TXNO = enc("txNo");
const KEY_PROPOSAL_ID = enc("proposalId");
const KEY_CLIENT_ID = enc("clientId");
const KEY_TIME = enc("time");
const KEY_DATOMS = enc("datoms");
/** Encoded attribute names, built on first use (a tx names few distinct attributes). */
const ATTR_BYTES = new Map<string, Uint8Array>();

function attr(b: Buffer, p: number, a: string): number {
  let e = ATTR_BYTES.get(a);
  if (e === undefined) {
    e = enc(a);
    if (ATTR_BYTES.size < 1024) ATTR_BYTES.set(a, e);
  }
  return bytes(b, p, e);
}

function bytes(b: Buffer, p: number, src: Uint8Array): number {
  for (let i = 0; i < src.length; i++) b[p + i] = src[i]!;
  return p + src.length;
}

function arrayHeader(b: Buffer, p: number, n: number): number {
  if (n < 16) {
    b[p] = 0x90 | n;
    return p + 1;
  }
  if (n < 0x10000) {
    b[p] = 0xdc;
    b[p + 1] = n >> 8;
    b[p + 2] = n & 0xff;
    return p + 3;
  }
  b[p] = 0xdd;
  b.writeUInt32BE(n, p + 1);
  return p + 5;
}

function num(b: Buffer, p: number, v: number): number {
  if (v >>> 0 === v) {
    if (v < 0x80) {
      b[p] = v;
      return p + 1;
    }
    if (v < 0x100) {
      b[p] = 0xcc;
      b[p + 1] = v;
      return p + 2;
    }
    if (v < 0x10000) {
      b[p] = 0xcd;
      b[p + 1] = v >> 8;
      b[p + 2] = v & 0xff;
      return p + 3;
    }
    b[p] = 0xce;
    b.writeUInt32BE(v, p + 1);
    return p + 5;
  }
  if (v >> 0 === v) {
    if (v >= -0x20) {
      b[p] = 0x100 + v;
      return p + 1;
    }
    if (v >= -0x80) {
      b[p] = 0xd0;
      b[p + 1] = v + 0x100;
      return p + 2;
    }
    if (v >= -0x8000) {
      b[p] = 0xd1;
      b.writeInt16BE(v, p + 1);
      return p + 3;
    }
    b[p] = 0xd2;
    b.writeInt32BE(v, p + 1);
    return p + 5;
  }
  b[p] = 0xcb;
  b.writeDoubleBE(v, p + 1);
  return p + 9;
}

/**
 * A string: UTF-8 after the smallest header for its byte length. The header
 * is first sized for the UTF-16 length (bytes ≥ units), and the bytes move
 * right when multi-byte characters need a larger one, as msgpackr does.
 */
function str(b: Buffer, p: number, s: string): number {
  const n = s.length;
  const header = n < 0x20 ? 1 : n < 0x100 ? 2 : n < 0x10000 ? 3 : 5;
  let q = p + header;
  for (let i = 0; i < n; i++) {
    let c = s.charCodeAt(i);
    if (c < 0x80) {
      b[q++] = c;
    } else if (c < 0x800) {
      b[q++] = (c >> 6) | 0xc0;
      b[q++] = (c & 0x3f) | 0x80;
    } else if ((c & 0xfc00) === 0xd800 && i + 1 < n && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      c = 0x10000 + ((c & 0x03ff) << 10) + (s.charCodeAt(++i) & 0x03ff);
      b[q++] = (c >> 18) | 0xf0;
      b[q++] = ((c >> 12) & 0x3f) | 0x80;
      b[q++] = ((c >> 6) & 0x3f) | 0x80;
      b[q++] = (c & 0x3f) | 0x80;
    } else if ((c & 0xf800) === 0xd800) {
      b[q++] = 0xef;
      b[q++] = 0xbf;
      b[q++] = 0xbd;
    } else {
      b[q++] = (c >> 12) | 0xe0;
      b[q++] = ((c >> 6) & 0x3f) | 0x80;
      b[q++] = (c & 0x3f) | 0x80;
    }
  }
  const len = q - p - header;
  const need = len < 0x20 ? 1 : len < 0x100 ? 2 : len < 0x10000 ? 3 : 5;
  if (need !== header) b.copyWithin(p + need, p + header, q);
  if (need === 1) b[p] = 0xa0 | len;
  else if (need === 2) {
    b[p] = 0xd9;
    b[p + 1] = len;
  } else if (need === 3) {
    b[p] = 0xda;
    b[p + 1] = len >> 8;
    b[p + 2] = len & 0xff;
  } else {
    b[p] = 0xdb;
    b.writeUInt32BE(len, p + 1);
  }
  return p + need + len;
}
