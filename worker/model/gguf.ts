import { constants } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { gguf as parseGguf } from "@huggingface/gguf";
import type { WeightFormat } from "./dtype.ts";
import { type ByteProgress, silentProgress } from "./progress.ts";
import { QUANT_BLOCKS } from "./quant.ts";

/**
 * llama.cpp's GGUF file: `"GGUF" ‖ u32 version ‖ u64 tensor_count ‖ u64
 * kv_count ‖ metadata ‖ tensor infos ‖ padding to general.alignment ‖ tensor
 * data` (ggml docs/gguf.md). The header and metadata are parsed by
 * @huggingface/gguf; this module validates them against the file (sizes,
 * alignment, types, bounds) and reads the tensor data itself, one tensor at a
 * time with positioned reads, as safetensors are read (the file is never
 * held whole). Every failure names the file and what is wrong.
 */
export class GgufError extends Error {
  override readonly name = "GgufError";
}

/** ggml_type ids of the supported tensor types. */
export const GGML_TYPE: Readonly<Record<WeightFormat, number>> = {
  F32: 0,
  F16: 1,
  Q4_0: 2,
  Q8_0: 8,
  Q4_K: 12,
  Q6_K: 14,
  BF16: 30,
};
const FORMAT_OF_TYPE = new Map<number, WeightFormat>(
  Object.entries(GGML_TYPE).map(([f, id]) => [id, f as WeightFormat]),
);
/** Names of the ggml types this reader does not support, for error messages. */
const OTHER_TYPES: Readonly<Record<number, string>> = {
  3: "Q4_1",
  6: "Q5_0",
  7: "Q5_1",
  9: "Q8_1",
  10: "Q2_K",
  11: "Q3_K",
  13: "Q5_K",
  15: "Q8_K",
  16: "IQ2_XXS",
  17: "IQ2_XS",
  18: "IQ3_XXS",
  19: "IQ1_S",
  20: "IQ4_NL",
  21: "IQ3_S",
  22: "IQ2_S",
  23: "IQ4_XS",
  24: "I8",
  25: "I16",
  26: "I32",
  27: "I64",
  28: "F64",
  29: "IQ1_M",
  34: "TQ1_0",
  35: "TQ2_0",
  39: "MXFP4",
};

/** Elements and bytes of one block (one element for F32/F16/BF16). */
export function blockOf(f: WeightFormat): { elems: number; bytes: number } {
  if (f === "F32") return { elems: 1, bytes: 4 };
  if (f === "F16" || f === "BF16") return { elems: 1, bytes: 2 };
  return QUANT_BLOCKS[f];
}

export type GgufValue = number | bigint | string | boolean | GgufValue[];

export interface GgufTensorInfo {
  /** As in the file (e.g. "blk.0.attn_q.weight"). */
  readonly name: string;
  readonly format: WeightFormat;
  /** ggml order: dims[0] is the fastest (a row's length), the reverse of a Hugging Face shape. */
  readonly dims: readonly number[];
  /** Absolute byte offset in the file. */
  readonly offset: number;
  readonly byteLength: number;
}

export interface GgufHeader {
  readonly file: string;
  readonly version: number;
  readonly metadata: ReadonlyMap<string, GgufValue>;
  readonly tensors: ReadonlyMap<string, GgufTensorInfo>;
  readonly alignment: number;
  readonly fileSize: number;
}

/** The smallest bytes one metadata pair (empty key, u8 value) and one tensor info (empty name, 0 dims) take. */
const MIN_KV_BYTES = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8;
/** Positioned reads are at most this long (fs.read takes at most 2 GiB per call). */
const READ_CHUNK_BYTES = 64 * 2 ** 20;

async function openFile(file: string): Promise<FileHandle> {
  try {
    return await open(file, constants.O_RDONLY);
  } catch (err) {
    throw new GgufError(`${file}: cannot open: ${(err as Error).message}`);
  }
}

async function readFully(fh: FileHandle, buf: Uint8Array, position: number, file: string, what: string) {
  for (let done = 0; done < buf.byteLength; ) {
    const len = Math.min(READ_CHUNK_BYTES, buf.byteLength - done);
    const { bytesRead } = await fh.read(buf, done, len, position + done);
    if (bytesRead === 0)
      throw new GgufError(`${file}: truncated while reading ${what} (${done} of ${buf.byteLength} bytes)`);
    done += bytesRead;
  }
}

/**
 * Reads and validates the header: magic, version 2 or 3, counts that fit
 * the file, metadata and tensor infos inside the file, general.alignment a
 * positive multiple of 8 (default 32), every tensor of a supported type with
 * rows of whole blocks, aligned, inside the file and overlapping no other.
 */
export async function readGgufHeader(file: string): Promise<GgufHeader> {
  const fh = await openFile(file);
  let fileSize: number;
  const head = new Uint8Array(24);
  try {
    fileSize = (await fh.stat()).size;
    if (fileSize < 24)
      throw new GgufError(`${file}: truncated: ${fileSize} bytes, shorter than a GGUF header (24)`);
    await readFully(fh, head, 0, file, "the header");
  } finally {
    await fh.close();
  }
  const view = new DataView(head.buffer);
  if (Buffer.from(head.subarray(0, 4)).toString("latin1") !== "GGUF")
    throw new GgufError(`${file}: not a GGUF file (no "GGUF" magic)`);
  const version = view.getUint32(4, true);
  if (version !== 2 && version !== 3)
    throw new GgufError(`${file}: GGUF version ${version} is not supported (2 or 3)`);
  const tensorCount = view.getBigUint64(8, true);
  const kvCount = view.getBigUint64(16, true);
  // Bounds before the parser allocates anything: every pair and info takes bytes of the file.
  if (tensorCount * BigInt(MIN_TENSOR_INFO_BYTES) + kvCount * BigInt(MIN_KV_BYTES) > BigInt(fileSize - 24))
    throw new GgufError(
      `${file}: truncated or corrupt: the header declares ${tensorCount} tensors and ${kvCount} metadata pairs, more than ${fileSize} bytes can hold`,
    );
  let parsed: Awaited<ReturnType<typeof parseGguf>>;
  try {
    parsed = await parseGguf(file, { allowLocalFile: true });
  } catch (err) {
    throw new GgufError(`${file}: unreadable GGUF header: ${(err as Error).message}`);
  }
  const [, infoEnd] = parsed.tensorInfoByteRange;
  if (infoEnd > fileSize)
    throw new GgufError(
      `${file}: truncated: the tensor infos end at byte ${infoEnd} but the file has ${fileSize}`,
    );
  const metadata = new Map<string, GgufValue>();
  for (const [k, v] of Object.entries(parsed.metadata)) {
    if (k === "version" || k === "tensor_count" || k === "kv_count") continue;
    metadata.set(k, v as GgufValue);
  }
  const alignment = readAlignment(file, metadata);
  const dataStart = Math.ceil(infoEnd / alignment) * alignment;
  const tensors = new Map<string, GgufTensorInfo>();
  for (const t of parsed.tensorInfos) {
    const where = `${file}: tensor '${t.name}'`;
    if (tensors.has(t.name)) throw new GgufError(`${where} appears twice`);
    const format = FORMAT_OF_TYPE.get(t.dtype);
    if (format === undefined) {
      const known = OTHER_TYPES[t.dtype];
      throw new GgufError(
        `${where} has ggml type ${t.dtype}${known ? ` (${known})` : " (unknown)"}, which is not supported (supported: ${Object.keys(GGML_TYPE).join(", ")})`,
      );
    }
    const dims = t.shape.map(Number);
    if (dims.length < 1 || dims.length > 4 || dims.some((d) => !Number.isSafeInteger(d) || d < 1))
      throw new GgufError(`${where}: dimensions [${dims.join(", ")}] must be 1 to 4 positive sizes`);
    const block = blockOf(format);
    if (dims[0]! % block.elems !== 0)
      throw new GgufError(
        `${where}: rows of ${dims[0]} elements are not a whole number of ${format} blocks of ${block.elems}`,
      );
    const byteLength = (dims.reduce((a, d) => a * d, 1) / block.elems) * block.bytes;
    const rel = Number(t.offset);
    if (!Number.isSafeInteger(rel) || rel % alignment !== 0)
      throw new GgufError(
        `${where}: data offset ${t.offset} is not a multiple of general.alignment ${alignment}`,
      );
    const offset = dataStart + rel;
    if (!Number.isSafeInteger(offset + byteLength) || offset + byteLength > fileSize)
      throw new GgufError(
        `${where}: truncated file: the tensor ends at byte ${offset + byteLength} but the file has ${fileSize} bytes`,
      );
    tensors.set(t.name, { name: t.name, format, dims, offset, byteLength });
  }
  const byOffset = [...tensors.values()].sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < byOffset.length; i++) {
    const prev = byOffset[i - 1]!;
    if (byOffset[i]!.offset < prev.offset + prev.byteLength)
      throw new GgufError(`${file}: tensors '${prev.name}' and '${byOffset[i]!.name}' overlap`);
  }
  return { file, version, metadata, tensors, alignment, fileSize };
}

function readAlignment(file: string, metadata: ReadonlyMap<string, GgufValue>): number {
  const a = metadata.get("general.alignment");
  if (a === undefined) return 32;
  const n = typeof a === "bigint" ? Number(a) : a;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 8 || n % 8 !== 0 || n > 2 ** 20)
    throw new GgufError(
      `${file}: metadata general.alignment must be a positive multiple of 8, got ${String(a)}`,
    );
  return n;
}

// ---- metadata accessors (errors name the key) -----------------------------

export class GgufMeta {
  constructor(readonly header: GgufHeader) {}

  has(key: string): boolean {
    return this.header.metadata.has(key);
  }

  #fail(key: string, what: string): never {
    throw new GgufError(`${this.header.file}: metadata ${key}: ${what}`);
  }

  /** A non-negative integer of any width; `fallback` when absent (undefined: required). */
  uint(key: string, fallback?: number): number {
    const v = this.header.metadata.get(key);
    if (v === undefined) return fallback ?? this.#fail(key, "missing (a non-negative integer)");
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0)
      this.#fail(key, `must be a non-negative integer, got ${JSON.stringify(String(v))}`);
    return n;
  }

  posUint(key: string, fallback?: number): number {
    const n = this.uint(key, fallback);
    if (n === 0) this.#fail(key, "must be positive, got 0");
    return n;
  }

  /**
   * A finite positive number (float or integer). An f32 comes back as the
   * shortest decimal that rounds to it (what the config.json it was written
   * from said: 1e-5, not 9.99999974e-6), so the model's config equals the
   * source's.
   */
  posFloat(key: string, fallback?: number): number {
    const v = this.header.metadata.get(key);
    if (v === undefined) return fallback ?? this.#fail(key, "missing (a positive number)");
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n !== "number" || !Number.isFinite(n) || n <= 0)
      this.#fail(key, `must be a positive finite number, got ${JSON.stringify(String(v))}`);
    if (Math.fround(n) !== n) return n;
    for (let p = 1; p < 9; p++) {
      const d = Number(n.toPrecision(p));
      if (Math.fround(d) === n) return d;
    }
    return n;
  }

  string(key: string, fallback?: string): string {
    const v = this.header.metadata.get(key);
    if (v === undefined) return fallback ?? this.#fail(key, "missing (a string)");
    if (typeof v !== "string") this.#fail(key, `must be a string, got ${typeof v}`);
    return v;
  }

  bool(key: string, fallback: boolean): boolean {
    const v = this.header.metadata.get(key);
    if (v === undefined) return fallback;
    if (typeof v !== "boolean") this.#fail(key, `must be true or false, got ${JSON.stringify(String(v))}`);
    return v;
  }

  /** An array whose every element passes `ok` (undefined when absent). */
  array<T extends GgufValue>(key: string, ok: (v: GgufValue) => v is T, what: string): T[] | undefined {
    const v = this.header.metadata.get(key);
    if (v === undefined) return undefined;
    if (!Array.isArray(v)) this.#fail(key, `must be an array of ${what}`);
    for (const [i, e] of v.entries()) if (!ok(e)) this.#fail(key, `element ${i} is not ${what}`);
    return v as T[];
  }
}

// ---- tensor data -----------------------------------------------------------

/**
 * Reads the named tensors' bytes, in file order, one positioned read each
 * (all or nothing: on failure the buffers read so far are dropped).
 */
export async function readGgufTensors(
  header: GgufHeader,
  names: Iterable<string>,
  progress: ByteProgress = silentProgress,
): Promise<Map<string, Buffer>> {
  const infos = [...new Set(names)].map((n) => {
    const t = header.tensors.get(n);
    if (!t) throw new GgufError(`${header.file}: missing tensor '${n}'`);
    return t;
  });
  const fh = await openFile(header.file);
  const out = new Map<string, Buffer>();
  try {
    for (const t of infos.sort((a, b) => a.offset - b.offset)) {
      const data = Buffer.allocUnsafeSlow(t.byteLength);
      await readFully(fh, data, t.offset, header.file, `tensor '${t.name}'`);
      out.set(t.name, data);
      progress.advance(t.byteLength);
    }
    progress.done();
    return out;
  } catch (err) {
    out.clear();
    throw err;
  } finally {
    await fh.close();
  }
}
