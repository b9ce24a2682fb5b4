import { copyFile, mkdtemp, readFile, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gguf as parseGguf } from "@huggingface/gguf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { decodeValues } from "../../../worker/model/dtype.ts";
import { readGgufHeader, readGgufTensors } from "../../../worker/model/gguf.ts";
import { interleavedRows } from "../../../worker/model/gguf-arch.ts";
import { loadGgufModel } from "../../../worker/model/gguf-model.ts";
import { quantizeModelDir } from "../../../worker/model/gguf-quantize.ts";
import { type GgufMetaValue, type GgufTensorToWrite, writeGguf } from "../../../worker/model/gguf-write.ts";
import { SafetensorsCheckpoint } from "../../../worker/model/safetensors.ts";
import { writeBlockModel } from "./gguf-fixture.ts";

/**
 * The GGUF reader and writer: the layout against an independent parser
 * (@huggingface/gguf reads what the writer writes, offsets aligned as the
 * spec requires), llama's q/k rows stored in llama.cpp's interleaved order,
 * and the clear errors for truncated files, unknown tensor types and
 * metadata that disagrees with the tensors.
 */
let root: string;
let hf: string;
let q8: string;
const VARIANT = "cpu-f32acc/v1";

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-gguf-"));
  hf = await writeBlockModel(join(root, "hf"));
  q8 = join(root, "m-q8_0.gguf");
  await quantizeModelDir(hf, q8, "q8_0");
}, 120_000);
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

/** Rewrites `src` with `edit` applied to its metadata and tensors. */
async function rewrite(
  src: string,
  dst: string,
  edit: (meta: Map<string, GgufMetaValue>, tensors: GgufTensorToWrite[]) => void,
): Promise<string> {
  const h = await readGgufHeader(src);
  const data = await readGgufTensors(h, h.tensors.keys());
  const meta = new Map<string, GgufMetaValue>();
  for (const [k, v] of h.metadata) {
    if (k === "general.alignment") continue;
    if (typeof v === "string") meta.set(k, { type: "string", value: v });
    else if (typeof v === "boolean") meta.set(k, { type: "bool", value: v });
    else if (typeof v === "number")
      meta.set(k, Number.isInteger(v) ? { type: "u32", value: v } : { type: "f32", value: v });
    else if (Array.isArray(v) && typeof v[0] === "string")
      meta.set(k, { type: "strings", value: v as string[] });
    else if (Array.isArray(v)) meta.set(k, { type: "i32s", value: v as number[] });
  }
  const tensors = [...h.tensors.values()].map((t) => ({
    name: t.name,
    format: t.format,
    dims: t.dims,
    bytes: () => data.get(t.name)!,
  }));
  edit(meta, tensors);
  await writeGguf(dst, meta, tensors);
  return dst;
}

describe("GGUF layout", () => {
  it("an independent parser reads the written file: version 3, aligned offsets, the metadata as written", async () => {
    const p = await parseGguf(q8, { allowLocalFile: true });
    const meta = p.metadata as Record<string, unknown>;
    expect(p.metadata.version).toBe(3);
    expect(meta["general.architecture"]).toBe("llama");
    expect(meta["general.alignment"]).toBe(32);
    expect(meta["llama.embedding_length"]).toBe(256);
    expect(Number(p.tensorDataOffset) % 32).toBe(0);
    for (const t of p.tensorInfos) expect(Number(t.offset) % 32).toBe(0);
    const embd = p.tensorInfos.find((t) => t.name === "token_embd.weight")!;
    expect(embd.shape.map(Number)).toEqual([256, 512]); // ggml order: row length first
    expect(embd.dtype).toBe(8); // GGML_TYPE_Q8_0
    expect((meta["tokenizer.ggml.tokens"] as string[]).length).toBe(512);
  });

  it("llama q/k rows are stored in llama.cpp's interleaved RoPE order and loaded back in Hugging Face order", async () => {
    const h = await readGgufHeader(q8);
    const stored = decodeValues(
      (await readGgufTensors(h, ["blk.0.attn_q.weight"])).get("blk.0.attn_q.weight")!,
      "Q8_0",
    );
    const ckpt = await SafetensorsCheckpoint.open(hf);
    const name = "model.layers.0.self_attn.q_proj.weight";
    const orig = decodeValues((await ckpt.load([name])).get(name)!.data, "BF16");
    const perm = interleavedRows(4, 64);
    const K = 256;
    // GGUF row 1 is head 0's row d/2 = 32 in Hugging Face order (within Q8_0's rounding).
    expect(perm[1]).toBe(32);
    for (const g of [0, 1, 2, 63, 64, 255]) {
      const r = perm[g]!;
      for (let k = 0; k < K; k += 37)
        expect(Math.abs(stored[g * K + k]! - orig[r * K + k]!)).toBeLessThan(0.01 * 0.1 + 1e-3);
    }
    const m = await loadGgufModel(q8, { variant: VARIANT });
    const loaded = decodeValues(m.weights.layers[0]!.q.data, "Q8_0");
    for (let i = 0; i < loaded.length; i += 101) expect(Math.abs(loaded[i]! - orig[i]!)).toBeLessThan(2e-3);
  });
});

describe("GGUF errors name what is wrong", () => {
  it("truncation: in the header, in the metadata, in the tensor infos, in the data", async () => {
    const bytes = await readFile(q8);
    const h = await readGgufHeader(q8);
    const last = [...h.tensors.values()].sort((a, b) => b.offset - a.offset)[0]!;
    for (const [cut, pattern] of [
      [10, /truncated: 10 bytes/],
      [400, /truncated|unreadable GGUF header/],
      [last.offset - 8, /truncated/],
      [last.offset + 5, new RegExp(`tensor '${last.name.replaceAll(".", "\\.")}': truncated file`)],
    ] as const) {
      const f = join(root, `cut-${cut}.gguf`);
      await writeFile(f, bytes.subarray(0, cut));
      await expect(readGgufHeader(f)).rejects.toThrow(pattern);
    }
    const f = join(root, "cut-one.gguf");
    await copyFile(q8, f);
    await truncate(f, bytes.length - 1);
    await expect(loadGgufModel(f, { variant: VARIANT })).rejects.toThrow(/truncated file/);
  });

  it("an unknown or unsupported tensor type names the tensor and the type", async () => {
    const bytes = Buffer.from(await readFile(q8));
    // The type field of token_embd.weight's info: after its name, n_dims and two u64 dims.
    const name = Buffer.from("token_embd.weight");
    const at = bytes.indexOf(name) + name.length + 4 + 16;
    expect(bytes.readUInt32LE(at)).toBe(8);
    for (const [type, pattern] of [
      [13, /tensor 'token_embd\.weight' has ggml type 13 \(Q5_K\), which is not supported/],
      [99, /tensor 'token_embd\.weight' has ggml type 99 \(unknown\)/],
    ] as const) {
      bytes.writeUInt32LE(type, at);
      const f = join(root, `type-${type}.gguf`);
      await writeFile(f, bytes);
      await expect(readGgufHeader(f)).rejects.toThrow(pattern);
    }
  });

  it("metadata that disagrees with the tensors, or is missing, or unsupported", async () => {
    const cases: [string, (m: Map<string, GgufMetaValue>, t: GgufTensorToWrite[]) => void, RegExp][] = [
      ["layers", (m) => m.set("llama.block_count", { type: "u32", value: 1 }), /unexpected tensor 'blk\.1\./],
      [
        "more-layers",
        (m) => m.set("llama.block_count", { type: "u32", value: 3 }),
        /missing tensor for 'model\.layers\.2\./,
      ],
      [
        "kv-heads",
        (m) => m.set("llama.attention.head_count_kv", { type: "u32", value: 4 }),
        /tensor 'blk\.0\.attn_k\.weight' has dimensions \[256, 128\], the metadata implies \[256, 256\]/,
      ],
      [
        "vocab",
        (m) => m.set("llama.vocab_size", { type: "u32", value: 600 }),
        /llama\.vocab_size = 600 but token_embd\.weight has 512 rows/,
      ],
      ["no-hidden", (m) => m.delete("llama.embedding_length"), /metadata llama\.embedding_length: missing/],
      [
        "arch",
        (m) => m.set("general.architecture", { type: "string", value: "falcon" }),
        /general\.architecture = "falcon" is not supported/,
      ],
      ["alignment", (m) => m.set("general.alignment", { type: "u32", value: 7 }), /alignment/],
      [
        "pre",
        (m) => m.set("tokenizer.ggml.pre", { type: "string", value: "exotic" }),
        /tokenizer\.ggml\.pre = "exotic" is not supported/,
      ],
      [
        "rope",
        (m) => m.set("continuum.rope.llama3.factor", { type: "f32", value: 2 }),
        /rope_freqs\.weight' holds RoPE factors that match no Llama-3 scaling/,
      ],
      [
        "extra",
        (_m, t) =>
          t.push({
            name: "blk.0.ffn_gate_inp.weight",
            format: "F32",
            dims: [256],
            bytes: () => new Uint8Array(1024),
          }),
        /unexpected tensor 'blk\.0\.ffn_gate_inp\.weight'/,
      ],
    ];
    for (const [name, edit, pattern] of cases) {
      if (name === "alignment") {
        await expect(writeGguf(join(root, "a.gguf"), new Map(), [], 7)).rejects.toThrow(pattern);
        continue;
      }
      const f = await rewrite(q8, join(root, `bad-${name}.gguf`), edit);
      await expect(loadGgufModel(f, { variant: VARIANT }), name).rejects.toThrow(pattern);
    }
  });
});
