import { constants } from "node:fs";
import { type FileHandle, open, readFile, rename, stat, unlink } from "node:fs/promises";
import { basename, join } from "node:path";
import { type DType, dtypeBytes, isDType, type WeightFormat } from "./dtype.ts";
import { type ByteProgress, silentProgress } from "./progress.ts";

/**
 * The safetensors format: `u64 LE n ‖ n bytes of JSON header ‖ data`. The
 * header maps each tensor name to `{dtype, shape, data_offsets: [begin, end]}`
 * with offsets relative to the start of data; `__metadata__` holds strings.
 *
 * Tensors are read one by one with positioned reads into their own Buffers,
 * whose memory lives outside the JS heap; the file as a whole is never held in
 * memory. A failed load closes its files and drops every buffer it made.
 */
export class SafetensorsError extends Error {
  override readonly name = "SafetensorsError";
}

/** Largest header accepted (the reference implementation's bound). */
const MAX_HEADER_BYTES = 100 * 2 ** 20;
/** Positioned reads are at most this long (fs.read takes at most 2 GiB per call). */
const READ_CHUNK_BYTES = 64 * 2 ** 20;

export interface TensorInfo {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** The file holding it. */
  readonly file: string;
  /** Absolute byte offset of the first element in the file. */
  readonly offset: number;
  readonly byteLength: number;
}

export interface LoadedTensor {
  readonly name: string;
  /** One value per element (safetensors), or a GGUF block format (gguf.ts). */
  readonly dtype: WeightFormat;
  readonly shape: readonly number[];
  /** Exactly byteLength bytes, little-endian elements. */
  readonly data: Buffer;
}

export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

function isUInt(x: unknown): x is number {
  return typeof x === "number" && Number.isSafeInteger(x) && x >= 0;
}

/** Reads and validates one file's header against the file's size. */
export async function readSafetensorsHeader(
  file: string,
): Promise<{ tensors: Map<string, TensorInfo>; metadata: Record<string, string> }> {
  let fh: FileHandle;
  try {
    fh = await open(file, constants.O_RDONLY);
  } catch (err) {
    throw new SafetensorsError(`${file}: cannot open: ${(err as Error).message}`);
  }
  try {
    const fileSize = (await fh.stat()).size;
    if (fileSize < 8) throw new SafetensorsError(`${file}: truncated: ${fileSize} bytes, no header length`);
    const lenBuf = Buffer.alloc(8);
    await readFully(fh, lenBuf, 0, file, "header length");
    const headerLen = lenBuf.readBigUInt64LE(0);
    if (headerLen > BigInt(MAX_HEADER_BYTES))
      throw new SafetensorsError(`${file}: header length ${headerLen} exceeds ${MAX_HEADER_BYTES} bytes`);
    const n = Number(headerLen);
    if (8 + n > fileSize)
      throw new SafetensorsError(
        `${file}: truncated: header of ${n} bytes but the file has ${fileSize} bytes`,
      );
    const headerBuf = Buffer.alloc(n);
    await readFully(fh, headerBuf, 8, file, "header");
    let header: unknown;
    try {
      header = JSON.parse(headerBuf.toString("utf8"));
    } catch (err) {
      throw new SafetensorsError(`${file}: header is not JSON: ${(err as Error).message}`);
    }
    return parseHeader(file, header, 8 + n, fileSize);
  } finally {
    await fh.close();
  }
}

function parseHeader(
  file: string,
  header: unknown,
  dataStart: number,
  fileSize: number,
): { tensors: Map<string, TensorInfo>; metadata: Record<string, string> } {
  if (header === null || typeof header !== "object" || Array.isArray(header))
    throw new SafetensorsError(`${file}: header must be a JSON object`);
  const tensors = new Map<string, TensorInfo>();
  let metadata: Record<string, string> = {};
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (entry === null || typeof entry !== "object" || Array.isArray(entry))
        throw new SafetensorsError(`${file}: __metadata__ must be an object of strings`);
      metadata = entry as Record<string, string>;
      continue;
    }
    const where = `${file}: tensor '${name}'`;
    if (entry === null || typeof entry !== "object")
      throw new SafetensorsError(`${where}: entry must be an object`);
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;
    if (!isDType(dtype))
      throw new SafetensorsError(
        `${where}: dtype ${JSON.stringify(dtype)} is not supported (F32, F16, BF16)`,
      );
    if (!Array.isArray(shape) || !shape.every(isUInt))
      throw new SafetensorsError(`${where}: shape must be a list of non-negative integers`);
    if (
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !offsets.every(isUInt) ||
      offsets[0]! > offsets[1]!
    )
      throw new SafetensorsError(`${where}: data_offsets must be [begin, end] with 0 <= begin <= end`);
    const [begin, end] = offsets as [number, number];
    const want = numel(shape) * dtypeBytes(dtype);
    if (end - begin !== want)
      throw new SafetensorsError(
        `${where}: shape [${shape.join(", ")}] of ${dtype} needs ${want} bytes but data_offsets span ${end - begin}`,
      );
    if (dataStart + end > fileSize)
      throw new SafetensorsError(
        `${where}: truncated file: the tensor ends at byte ${dataStart + end} but the file has ${fileSize} bytes`,
      );
    tensors.set(name, { name, dtype, shape, file, offset: dataStart + begin, byteLength: want });
  }
  // Tensors must not share bytes.
  const byOffset = [...tensors.values()].filter((t) => t.byteLength > 0).sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < byOffset.length; i++) {
    const prev = byOffset[i - 1]!;
    const cur = byOffset[i]!;
    if (cur.offset < prev.offset + prev.byteLength)
      throw new SafetensorsError(`${file}: tensors '${prev.name}' and '${cur.name}' overlap`);
  }
  return { tensors, metadata };
}

async function readFully(fh: FileHandle, buf: Buffer, position: number, file: string, what: string) {
  let done = 0;
  while (done < buf.byteLength) {
    const len = Math.min(READ_CHUNK_BYTES, buf.byteLength - done);
    const { bytesRead } = await fh.read(buf, done, len, position + done);
    if (bytesRead === 0)
      throw new SafetensorsError(
        `${file}: truncated while reading ${what} (${done} of ${buf.byteLength} bytes)`,
      );
    done += bytesRead;
  }
}

/**
 * A checkpoint directory's tensors: one `model.safetensors`, or shards named
 * by `model.safetensors.index.json` (`{"weight_map": {tensor: file}}`).
 */
export class SafetensorsCheckpoint {
  private constructor(
    readonly dir: string,
    readonly files: readonly string[],
    readonly tensors: ReadonlyMap<string, TensorInfo>,
  ) {}

  static async open(dir: string): Promise<SafetensorsCheckpoint> {
    const indexPath = join(dir, "model.safetensors.index.json");
    const single = join(dir, "model.safetensors");
    if (await exists(indexPath)) return SafetensorsCheckpoint.openSharded(dir, indexPath);
    if (await exists(single)) {
      const { tensors } = await readSafetensorsHeader(single);
      return new SafetensorsCheckpoint(dir, [single], tensors);
    }
    throw new SafetensorsError(`${dir}: no model.safetensors or model.safetensors.index.json`);
  }

  private static async openSharded(dir: string, indexPath: string): Promise<SafetensorsCheckpoint> {
    let index: unknown;
    try {
      index = JSON.parse(await readFile(indexPath, "utf8"));
    } catch (err) {
      throw new SafetensorsError(`${indexPath}: not readable JSON: ${(err as Error).message}`);
    }
    const weightMap = (index as { weight_map?: unknown } | null)?.weight_map;
    if (weightMap === null || typeof weightMap !== "object" || Array.isArray(weightMap))
      throw new SafetensorsError(`${indexPath}: weight_map must be an object of tensor name -> file name`);
    const byFile = new Map<string, string[]>();
    for (const [name, f] of Object.entries(weightMap as Record<string, unknown>)) {
      // Shards are plain names inside the directory: nothing may point outside it.
      if (typeof f !== "string" || f !== basename(f) || f === "." || f === "..")
        throw new SafetensorsError(`${indexPath}: weight_map['${name}'] must be a file name in ${dir}`);
      const list = byFile.get(f) ?? [];
      list.push(name);
      byFile.set(f, list);
    }
    const tensors = new Map<string, TensorInfo>();
    const files: string[] = [];
    for (const [f, names] of [...byFile.entries()].sort(([a], [b]) => (a < b ? -1 : 1))) {
      const path = join(dir, f);
      files.push(path);
      const header = await readSafetensorsHeader(path);
      for (const name of names) {
        const info = header.tensors.get(name);
        if (!info)
          throw new SafetensorsError(
            `${path}: tensor '${name}' is listed in the index but missing from the file`,
          );
        tensors.set(name, info);
      }
    }
    return new SafetensorsCheckpoint(dir, files, tensors);
  }

  /** Total bytes of the named tensors. */
  bytesOf(names: Iterable<string>): number {
    let n = 0;
    for (const name of names) n += this.info(name).byteLength;
    return n;
  }

  info(name: string): TensorInfo {
    const t = this.tensors.get(name);
    if (!t) throw new SafetensorsError(`${this.dir}: missing tensor '${name}'`);
    return t;
  }

  /**
   * Streams one tensor's bytes in order, at most `spanBytes` at a time through
   * one reused buffer (so reading a tensor costs `spanBytes` of memory, not
   * its size). `onSpan` must consume the span before it returns.
   */
  async stream(name: string, spanBytes: number, onSpan: (span: Buffer) => void): Promise<void> {
    if (!Number.isSafeInteger(spanBytes) || spanBytes < 1)
      throw new RangeError(`span must be a positive whole number of bytes, got ${spanBytes}`);
    const t = this.info(name);
    const buf = Buffer.allocUnsafeSlow(Math.min(spanBytes, Math.max(1, t.byteLength)));
    const fh = await open(t.file, constants.O_RDONLY);
    try {
      for (let done = 0; done < t.byteLength; ) {
        const span = buf.subarray(0, Math.min(buf.byteLength, t.byteLength - done));
        await readFully(fh, span, t.offset + done, t.file, `tensor '${t.name}'`);
        onSpan(span);
        done += span.byteLength;
      }
    } finally {
      await fh.close();
    }
  }

  /**
   * Reads the named tensors, file by file in offset order. All or nothing:
   * on any failure the files are closed, every buffer read so far is dropped,
   * and the error names the file and tensor.
   */
  async load(
    names: Iterable<string>,
    progress: ByteProgress = silentProgress,
  ): Promise<Map<string, LoadedTensor>> {
    const wanted = [...new Set(names)].map((n) => this.info(n));
    const byFile = new Map<string, TensorInfo[]>();
    for (const t of wanted) byFile.set(t.file, [...(byFile.get(t.file) ?? []), t]);
    let out: Map<string, LoadedTensor> | undefined = new Map();
    try {
      for (const [file, infos] of byFile) {
        const fh = await open(file, constants.O_RDONLY);
        try {
          for (const t of infos.sort((a, b) => a.offset - b.offset)) {
            const data = Buffer.allocUnsafeSlow(t.byteLength);
            await readFully(fh, data, t.offset, file, `tensor '${t.name}'`);
            out.set(t.name, { name: t.name, dtype: t.dtype, shape: t.shape, data });
            progress.advance(t.byteLength);
          }
        } finally {
          await fh.close();
        }
      }
      progress.done();
      const done = out;
      out = undefined;
      return done;
    } finally {
      // Reached with `out` set only on failure: release the half-loaded buffers.
      out?.clear();
    }
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

// ---- writing -------------------------------------------------------------

export interface TensorToWrite {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** Produces the bytes when the writer reaches this tensor (so large models stream). */
  readonly bytes: () => Uint8Array;
}

/**
 * Writes one safetensors file, tensors in name order, header padded with
 * spaces to a multiple of 8 bytes (as the reference writer does, so data is
 * aligned). Written to `path.partial` and renamed, so a crash leaves no file
 * that looks complete.
 */
export async function writeSafetensors(
  path: string,
  tensors: readonly TensorToWrite[],
  metadata: Record<string, string> = {},
): Promise<void> {
  const sorted = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of sorted) {
    if (t.name in header) throw new SafetensorsError(`${path}: tensor '${t.name}' given twice`);
    const len = numel(t.shape) * dtypeBytes(t.dtype);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + len] };
    offset += len;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const headerBuf = Buffer.from(json, "utf8");
  const lenBuf = Buffer.alloc(8);
  lenBuf.writeBigUInt64LE(BigInt(headerBuf.byteLength));
  const tmp = `${path}.partial`;
  const fh = await open(tmp, "w");
  let ok = false;
  try {
    await fh.write(lenBuf);
    await fh.write(headerBuf);
    for (const t of sorted) {
      const bytes = t.bytes();
      const len = numel(t.shape) * dtypeBytes(t.dtype);
      if (bytes.byteLength !== len)
        throw new SafetensorsError(
          `${path}: tensor '${t.name}' produced ${bytes.byteLength} bytes, expected ${len}`,
        );
      await fh.write(bytes);
    }
    ok = true;
  } finally {
    await fh.close();
    if (!ok) await unlink(tmp).catch(() => {});
  }
  await rename(tmp, path);
}

/**
 * Writes tensors as Hugging Face shards `model-0000i-of-0000N.safetensors`
 * of at most `maxShardBytes` each (a tensor larger than that gets a shard of
 * its own) plus `model.safetensors.index.json`. Returns the shard names.
 */
export async function writeShardedSafetensors(
  dir: string,
  tensors: readonly TensorToWrite[],
  maxShardBytes: number,
): Promise<string[]> {
  const sorted = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const shards: TensorToWrite[][] = [];
  let cur: TensorToWrite[] = [];
  let curBytes = 0;
  let total = 0;
  for (const t of sorted) {
    const len = numel(t.shape) * dtypeBytes(t.dtype);
    total += len;
    if (cur.length > 0 && curBytes + len > maxShardBytes) {
      shards.push(cur);
      cur = [];
      curBytes = 0;
    }
    cur.push(t);
    curBytes += len;
  }
  if (cur.length > 0) shards.push(cur);
  const pad = (i: number) => String(i).padStart(5, "0");
  const names = shards.map((_, i) => `model-${pad(i + 1)}-of-${pad(shards.length)}.safetensors`);
  const weightMap: Record<string, string> = {};
  for (let i = 0; i < shards.length; i++) {
    await writeSafetensors(join(dir, names[i]!), shards[i]!, { format: "pt" });
    for (const t of shards[i]!) weightMap[t.name] = names[i]!;
  }
  const index = { metadata: { total_size: total }, weight_map: weightMap };
  await writeFileAtomic(join(dir, "model.safetensors.index.json"), `${JSON.stringify(index, null, 2)}\n`);
  return names;
}

async function writeFileAtomic(path: string, text: string): Promise<void> {
  const tmp = `${path}.partial`;
  const fh = await open(tmp, "w");
  try {
    await fh.writeFile(text);
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
}
