import { open, rename, unlink } from "node:fs/promises";
import type { WeightFormat } from "./dtype.ts";
import { blockOf, GGML_TYPE, GgufError } from "./gguf.ts";

/**
 * Writes a GGUF v3 file as ggml's docs/gguf.md lays it out, little-endian:
 * "GGUF", u32 3, u64 tensor count, u64 metadata count, the metadata pairs
 * (key string, u32 value type, value), the tensor infos (name string, u32
 * n_dims, u64 dims in ggml order, u32 ggml type, u64 offset from the data
 * start), zero padding to general.alignment, then each tensor's bytes at its
 * offset (a multiple of the alignment, zero-padded between tensors). Strings
 * are u64 length + UTF-8 bytes. Written to `path.partial` and renamed, so a
 * crash leaves no file that looks complete; tensors are produced one at a
 * time (memory: the largest tensor).
 */
export type GgufMetaValue =
  | { readonly type: "u32"; readonly value: number }
  | { readonly type: "i32"; readonly value: number }
  | { readonly type: "f32"; readonly value: number }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "strings"; readonly value: readonly string[] }
  | { readonly type: "f32s"; readonly value: readonly number[] }
  | { readonly type: "i32s"; readonly value: readonly number[] };

export interface GgufTensorToWrite {
  readonly name: string;
  readonly format: WeightFormat;
  /** ggml order: dims[0] is the row length. */
  readonly dims: readonly number[];
  readonly bytes: () => Uint8Array | Promise<Uint8Array>;
}

// gguf_metadata_value_type
const T_U32 = 4;
const T_I32 = 5;
const T_F32 = 6;
const T_BOOL = 7;
const T_STRING = 8;
const T_ARRAY = 9;

class Bytes {
  readonly parts: Buffer[] = [];
  length = 0;
  #push(b: Buffer) {
    this.parts.push(b);
    this.length += b.length;
  }
  u8(v: number) {
    this.#push(Buffer.from([v]));
  }
  u32(v: number) {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.#push(b);
  }
  i32(v: number) {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.#push(b);
  }
  f32(v: number) {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.#push(b);
  }
  u64(v: number) {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.#push(b);
  }
  str(s: string) {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.#push(b);
  }
}

function putValue(out: Bytes, v: GgufMetaValue): void {
  switch (v.type) {
    case "u32":
      out.u32(T_U32);
      out.u32(v.value);
      return;
    case "i32":
      out.u32(T_I32);
      out.i32(v.value);
      return;
    case "f32":
      out.u32(T_F32);
      out.f32(v.value);
      return;
    case "bool":
      out.u32(T_BOOL);
      out.u8(v.value ? 1 : 0);
      return;
    case "string":
      out.u32(T_STRING);
      out.str(v.value);
      return;
    case "strings":
      out.u32(T_ARRAY);
      out.u32(T_STRING);
      out.u64(v.value.length);
      for (const s of v.value) out.str(s);
      return;
    case "f32s":
      out.u32(T_ARRAY);
      out.u32(T_F32);
      out.u64(v.value.length);
      for (const x of v.value) out.f32(x);
      return;
    case "i32s":
      out.u32(T_ARRAY);
      out.u32(T_I32);
      out.u64(v.value.length);
      for (const x of v.value) out.i32(x);
      return;
  }
}

export async function writeGguf(
  path: string,
  metadata: ReadonlyMap<string, GgufMetaValue>,
  tensors: readonly GgufTensorToWrite[],
  alignment = 32,
): Promise<void> {
  if (!Number.isInteger(alignment) || alignment < 8 || alignment % 8 !== 0)
    throw new GgufError(`${path}: alignment must be a positive multiple of 8, got ${alignment}`);
  const meta = new Map(metadata);
  meta.set("general.alignment", { type: "u32", value: alignment });
  const head = new Bytes();
  head.parts.push(Buffer.from("GGUF", "latin1"));
  head.length += 4;
  head.u32(3);
  head.u64(tensors.length);
  head.u64(meta.size);
  for (const [k, v] of meta) {
    head.str(k);
    putValue(head, v);
  }
  const pad = (n: number) => Math.ceil(n / alignment) * alignment;
  const sizes: number[] = [];
  let offset = 0;
  const names = new Set<string>();
  for (const t of tensors) {
    if (names.has(t.name)) throw new GgufError(`${path}: tensor '${t.name}' given twice`);
    names.add(t.name);
    const block = blockOf(t.format);
    if (t.dims.length < 1 || t.dims[0]! % block.elems !== 0)
      throw new GgufError(
        `${path}: tensor '${t.name}': rows of ${t.dims[0]} are not whole ${t.format} blocks`,
      );
    const size = (t.dims.reduce((a, d) => a * d, 1) / block.elems) * block.bytes;
    head.str(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(GGML_TYPE[t.format]);
    head.u64(offset);
    sizes.push(size);
    offset = pad(offset + size);
  }
  const headBytes = Buffer.concat(head.parts);
  const dataStart = pad(headBytes.length);
  const tmp = `${path}.partial`;
  const fh = await open(tmp, "w");
  let ok = false;
  try {
    await fh.write(headBytes);
    await fh.write(Buffer.alloc(dataStart - headBytes.length));
    for (const [i, t] of tensors.entries()) {
      const bytes = await t.bytes();
      if (bytes.byteLength !== sizes[i])
        throw new GgufError(
          `${path}: tensor '${t.name}' produced ${bytes.byteLength} bytes, expected ${sizes[i]}`,
        );
      await fh.write(bytes);
      await fh.write(Buffer.alloc(pad(bytes.byteLength) - bytes.byteLength));
    }
    ok = true;
  } finally {
    await fh.close();
    if (!ok) await unlink(tmp).catch(() => {});
  }
  await rename(tmp, path);
}
