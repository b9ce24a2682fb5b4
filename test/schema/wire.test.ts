import { Schema } from "effect";
import { Packr } from "msgpackr";
import { describe, expect, it } from "vitest";
import {
  decodeMessage,
  defineMessage,
  encodeMessage,
  MAX_MESSAGE_BYTES,
  MessageRegistry,
  WIRE_VERSION,
  WireError,
} from "../../schema/wire.ts";

const Ping = defineMessage("test.ping", Schema.Struct({ seq: Schema.Number, note: Schema.String }));
const Blob = defineMessage("test.blob", Schema.Struct({ data: Schema.Uint8Array }));
const plain = new Packr({ useRecords: false, mapsAsObjects: true });

describe("wire envelope", () => {
  it("round-trips a message and writes a plain msgpack map {v, kind, ...body}", () => {
    const bytes = encodeMessage(Ping, { seq: 7, note: "hi" });
    expect(decodeMessage(Ping, bytes)).toEqual({ seq: 7, note: "hi" });
    expect(plain.unpack(bytes)).toEqual({ v: WIRE_VERSION, kind: "test.ping", seq: 7, note: "hi" });
  });

  it("round-trips binary fields byte-exact", () => {
    const data = new Uint8Array([0, 1, 2, 255, 128]);
    const out = decodeMessage(Blob, encodeMessage(Blob, { data }));
    expect(Array.from(out.data)).toEqual(Array.from(data));
  });

  it("rejects an unknown version with a clear error", () => {
    const bytes = plain.pack({ v: 99, kind: "test.ping", seq: 1, note: "x" });
    expect(() => decodeMessage(Ping, bytes)).toThrow(/unknown wire version 99/);
  });

  it("rejects a wrong shape naming the field", () => {
    const bytes = plain.pack({ v: WIRE_VERSION, kind: "test.ping", seq: "one", note: "x" });
    expect(() => decodeMessage(Ping, bytes)).toThrow(WireError);
    expect(() => decodeMessage(Ping, bytes)).toThrow(/seq/);
  });

  it("rejects every truncation of a valid message without crashing", () => {
    const bytes = encodeMessage(Ping, { seq: 123456, note: "a longer note to cut" });
    for (let n = 0; n < bytes.length; n++) {
      expect(() => decodeMessage(Ping, bytes.subarray(0, n))).toThrow(WireError);
    }
  });

  it("rejects trailing garbage, non-maps, oversized input and the wrong kind", () => {
    const bytes = encodeMessage(Ping, { seq: 1, note: "x" });
    const trailing = new Uint8Array([...bytes, 0xc0]);
    expect(() => decodeMessage(Ping, trailing)).toThrow(/one msgpack value/);
    expect(() => decodeMessage(Ping, plain.pack([1, 2]))).toThrow(/map/);
    expect(() => decodeMessage(Ping, new Uint8Array(MAX_MESSAGE_BYTES + 1))).toThrow(/limit/);
    expect(() => decodeMessage(Blob, bytes)).toThrow(/expected a test.blob message, got test.ping/);
  });

  it("refuses a body that shadows the envelope", () => {
    expect(() => encodeMessage(Ping, { seq: 1, note: "x", kind: "evil" } as never)).toThrow(/reserved/);
  });

  it("a registry decodes any of its kinds and names an unknown one", () => {
    const reg = new MessageRegistry<unknown>([Ping, Blob]);
    expect(reg.decode(encodeMessage(Ping, { seq: 2, note: "y" })).kind).toBe("test.ping");
    const other = defineMessage("test.other", Schema.Struct({}));
    expect(() => reg.decode(encodeMessage(other, {}))).toThrow(/unknown message kind "test.other"/);
  });
});
