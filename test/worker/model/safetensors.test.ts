import { mkdtemp, readdir, readFile, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  bf16BitsToF32,
  decodeValues,
  encodeValues,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
} from "../../../worker/model/dtype.ts";
import {
  readSafetensorsHeader,
  SafetensorsCheckpoint,
  SafetensorsError,
  type TensorToWrite,
  writeSafetensors,
  writeShardedSafetensors,
} from "../../../worker/model/safetensors.ts";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "continuum-st-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function tensor(name: string, dtype: "F32" | "F16" | "BF16", shape: number[], start: number): TensorToWrite {
  const n = shape.reduce((a, b) => a * b, 1);
  const values = Array.from({ length: n }, (_, i) => (start + i) * 0.25 - 3);
  return { name, dtype, shape, bytes: () => encodeValues(values, dtype) };
}

/** A safetensors file from a raw header object and a data section. */
async function rawFile(path: string, header: unknown, data: Buffer): Promise<void> {
  const h = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  await writeFile(path, Buffer.concat([len, h, data]));
}

describe("dtype conversions", () => {
  it("round to nearest even into f16, with overflow to infinity and subnormals kept", () => {
    expect(f32ToF16Bits(1)).toBe(0x3c00);
    expect(f32ToF16Bits(-2)).toBe(0xc000);
    expect(f32ToF16Bits(65504)).toBe(0x7bff);
    expect(f32ToF16Bits(65519)).toBe(0x7bff); // below the halfway point to 65536
    expect(f32ToF16Bits(65520)).toBe(0x7c00); // halfway: ties to even = infinity
    expect(f32ToF16Bits(2 ** -24)).toBe(0x0001); // smallest subnormal
    expect(f32ToF16Bits(2 ** -25)).toBe(0x0000); // half of it: ties to even = 0
    expect(f32ToF16Bits(3 * 2 ** -25)).toBe(0x0002); // 1.5 ulp: ties to even = 2
    expect(f32ToF16Bits(1 + 2 ** -11)).toBe(0x3c00); // tie between 1 and 1+2^-10: even
    expect(f32ToF16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02); // tie: rounds up to even
    expect(f32ToF16Bits(0.1)).toBe(0x2e66);
    expect(f32ToF16Bits(Number.NaN) & 0x7e00).toBe(0x7e00);
  });

  it("f16 -> f32 -> f16 is the identity on every non-NaN pattern", () => {
    const wrong: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      if ((h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0) continue;
      if (f32ToF16Bits(f16BitsToF32(h)) !== h) wrong.push(h);
    }
    expect(wrong).toEqual([]);
  });

  it("rounds to nearest even into bf16", () => {
    expect(f32ToBf16Bits(1)).toBe(0x3f80);
    expect(bf16BitsToF32(0x3f80)).toBe(1);
    expect(f32ToBf16Bits(1 + 2 ** -8)).toBe(0x3f80); // tie: even
    expect(f32ToBf16Bits(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie: up to even
    expect(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -12)).toBe(0x3f81); // above half: up
  });

  it("encodes and decodes values through each dtype", () => {
    const v = [0, 1, -2.5, 0.125, 1024];
    for (const dt of ["F32", "F16", "BF16"] as const)
      expect([...decodeValues(encodeValues(v, dt), dt)]).toEqual(v);
  });
});

describe("safetensors", () => {
  it("round-trips tensors of every dtype through one file with an 8-byte aligned header", async () => {
    const path = join(dir, "model.safetensors");
    const ts = [
      tensor("b.f16", "F16", [3, 5], 0),
      tensor("a.f32", "F32", [4], 10),
      tensor("c.bf16", "BF16", [2, 2, 2], 3),
    ];
    await writeSafetensors(path, ts, { format: "pt" });
    const raw = await readFile(path);
    expect(Number(raw.readBigUInt64LE(0)) % 8).toBe(0);
    const { tensors, metadata } = await readSafetensorsHeader(path);
    expect(metadata).toEqual({ format: "pt" });
    expect([...tensors.keys()].sort()).toEqual(["a.f32", "b.f16", "c.bf16"]);
    expect(tensors.get("b.f16")).toMatchObject({ dtype: "F16", shape: [3, 5], byteLength: 30 });
    const ckpt = await SafetensorsCheckpoint.open(dir);
    const loaded = await ckpt.load(["a.f32", "b.f16", "c.bf16"]);
    for (const t of ts) {
      const got = loaded.get(t.name)!;
      expect(got.dtype).toBe(t.dtype);
      expect(got.shape).toEqual(t.shape);
      expect(Buffer.compare(got.data, Buffer.from(t.bytes()))).toBe(0);
    }
    // A subset loads alone.
    expect([...(await ckpt.load(["b.f16"])).keys()]).toEqual(["b.f16"]);
  });

  it("reads a sharded checkpoint through model.safetensors.index.json", async () => {
    const ts = Array.from({ length: 7 }, (_, i) => tensor(`layer.${i}.w`, "F32", [16, 4], i * 64));
    const shards = await writeShardedSafetensors(dir, ts, 600);
    expect(shards.length).toBeGreaterThan(1);
    expect(shards[0]).toMatch(/^model-00001-of-0000\d\.safetensors$/);
    const index = JSON.parse(await readFile(join(dir, "model.safetensors.index.json"), "utf8"));
    expect(index.metadata.total_size).toBe(7 * 256);
    expect(Object.keys(index.weight_map)).toHaveLength(7);
    const ckpt = await SafetensorsCheckpoint.open(dir);
    expect(ckpt.files).toHaveLength(shards.length);
    const loaded = await ckpt.load(ts.map((t) => t.name));
    for (const t of ts) expect(Buffer.compare(loaded.get(t.name)!.data, Buffer.from(t.bytes()))).toBe(0);
  });

  it("names the tensor cut off by a truncated file", async () => {
    const path = join(dir, "model.safetensors");
    await writeSafetensors(path, [tensor("a", "F32", [8], 0), tensor("z", "F32", [8], 0)]);
    await truncate(path, (await readFile(path)).length - 4);
    await expect(SafetensorsCheckpoint.open(dir)).rejects.toThrow(/tensor 'z'.*truncated/);
    await truncate(path, 5);
    await expect(readSafetensorsHeader(path)).rejects.toThrow(/truncated/);
  });

  it("names a tensor the index lists but its shard lacks, and a tensor that does not exist", async () => {
    const ts = [tensor("x", "F32", [4], 0), tensor("y", "F32", [4], 0)];
    await writeShardedSafetensors(dir, ts, 1 << 20);
    const indexPath = join(dir, "model.safetensors.index.json");
    const index = JSON.parse(await readFile(indexPath, "utf8"));
    index.weight_map.ghost = index.weight_map.x;
    await writeFile(indexPath, JSON.stringify(index));
    await expect(SafetensorsCheckpoint.open(dir)).rejects.toThrow(/'ghost'.*missing/);
    delete index.weight_map.ghost;
    index.weight_map.x = "../escape.safetensors";
    await writeFile(indexPath, JSON.stringify(index));
    await expect(SafetensorsCheckpoint.open(dir)).rejects.toThrow(/weight_map\['x'\] must be a file name/);
    await rm(indexPath);
    await expect(SafetensorsCheckpoint.open(dir)).rejects.toThrow(/no model.safetensors/);
  });

  it("checks dtypes, shapes against byte spans, and overlaps", async () => {
    const path = join(dir, "model.safetensors");
    await rawFile(path, { w: { dtype: "F64", shape: [2], data_offsets: [0, 16] } }, Buffer.alloc(16));
    await expect(readSafetensorsHeader(path)).rejects.toThrow(/tensor 'w': dtype "F64" is not supported/);
    await rawFile(path, { w: { dtype: "F32", shape: [3], data_offsets: [0, 8] } }, Buffer.alloc(16));
    await expect(readSafetensorsHeader(path)).rejects.toThrow(
      /tensor 'w': shape \[3\] of F32 needs 12 bytes/,
    );
    await rawFile(
      path,
      {
        a: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
        b: { dtype: "F32", shape: [2], data_offsets: [4, 12] },
      },
      Buffer.alloc(12),
    );
    await expect(readSafetensorsHeader(path)).rejects.toThrow(/'a' and 'b' overlap/);
    await rawFile(path, { w: { dtype: "F32", shape: [-1], data_offsets: [0, 4] } }, Buffer.alloc(4));
    await expect(readSafetensorsHeader(path)).rejects.toThrow(/shape must be/);
    await writeFile(path, Buffer.from([4, 0, 0, 0, 0, 0, 0, 0, 0x7b, 0x7b, 0x7b, 0x7b]));
    await expect(readSafetensorsHeader(path)).rejects.toThrow(SafetensorsError);
  });

  it("fails a load whole when a shard vanishes mid-load, leaving no partial files behind", async () => {
    const ts = Array.from({ length: 4 }, (_, i) => tensor(`t${i}`, "F32", [32], i));
    const shards = await writeShardedSafetensors(dir, ts, 300);
    const ckpt = await SafetensorsCheckpoint.open(dir);
    await truncate(join(dir, shards[shards.length - 1]!), 20);
    await expect(ckpt.load(ts.map((t) => t.name))).rejects.toThrow(/truncated while reading tensor/);
    expect((await readdir(dir)).filter((f) => f.endsWith(".partial"))).toEqual([]);
  });

  it("refuses a tensor whose producer returns the wrong number of bytes, writing nothing", async () => {
    const path = join(dir, "model.safetensors");
    const bad: TensorToWrite = { name: "w", dtype: "F32", shape: [4], bytes: () => new Uint8Array(12) };
    await expect(writeSafetensors(path, [bad])).rejects.toThrow(/'w' produced 12 bytes, expected 16/);
    expect(await readdir(dir)).toEqual([]);
  });
});
