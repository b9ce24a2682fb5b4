import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  canonicalJson,
  catalogNodeId,
  chainHash,
  chainRoot,
  contentId,
  type ModelManifest,
  modelFingerprint,
  prefixChain,
} from "../../schema/identity.ts";
import { InvalidIdError, PrefixHash } from "../../schema/ids.ts";

// Golden vectors. Each was computed independently of this code (Python's
// hashlib over the byte layout the architecture specifies) and must never
// change: a change here orphans every chunk ever published.
const GOLDEN = {
  root: "0000000000000000000000000000000000000000000000000000000000000000",
  saltedRoot: "18df4ef88ebe27bb862521cdd3bcf1d6165e596ad04439bc27f015a09a4c89c6",
  h123: "e3a1ad5b4060d4e78e512281362044a629305c870c305e9504f8c1460a69595f",
  hMaxZero: "576b3759e85ae9db8b221d3d35d808606c09997f80b2c0fd72e29e01874dd8fb",
  hEmpty: "fafddf84fcfb2ba9c517c877c3adb64af961b989d913f4d8b8a9845cf2da69da",
  saltedChain16: [
    "dde2603359e01e915a4e7e9a4e726cdebd9469dca60722a6fdf08f60f3cf0dce",
    "a3e42b5f688fb4cc80cea55e3b58c99e05edebc0d26817adf027c644d804e87b",
  ],
  fingerprint: "7a41ba386e3e40c1432be965bdc8f3e4aed58f80ebf3c0aeaf3e8ab1d14cb7a0",
  nodeId: "ecebe95084e06d09fa48b68d60c9bde3cbbc8daf3b17b7b00c245522827d8db8",
  contentId: "53b5a412e3ebd2765c73726fba2c39380616635c988c9a3dac94f42bd833d76a",
};

const manifest: ModelManifest = {
  weightsDigest: "ab".repeat(32),
  architecture: { layers: 2, hidden: 64 },
  kvDtype: "f16",
  layout: "kv-gqa/v1",
  variant: "cpu-f32acc/v1",
};

describe("identity golden vectors", () => {
  it("prefix-chain hash", () => {
    const root = chainRoot();
    expect(root).toBe(GOLDEN.root);
    expect(chainRoot("tenant-a")).toBe(GOLDEN.saltedRoot);
    const h = chainHash(root, [1, 2, 3]);
    expect(h).toBe(GOLDEN.h123);
    expect(chainHash(h, [0xffffffff, 0])).toBe(GOLDEN.hMaxZero);
    expect(chainHash(root, [])).toBe(GOLDEN.hEmpty);
    const tokens = Array.from({ length: 40 }, (_, i) => i * 7);
    expect(prefixChain(tokens, 16, "tenant-a").map((n) => n.hash)).toEqual(GOLDEN.saltedChain16);
  });

  it("model fingerprint, catalog node id, content id", () => {
    const fp = modelFingerprint(manifest);
    expect(fp).toBe(GOLDEN.fingerprint);
    expect(catalogNodeId(fp, PrefixHash(GOLDEN.h123))).toBe(GOLDEN.nodeId);
    const meta = { node: GOLDEN.h123, tokens: 256, layout: "kv-gqa/v1" };
    expect(contentId(new Uint8Array([1, 2, 3, 4]), meta)).toBe(GOLDEN.contentId);
  });
});

const tokenArb = fc.integer({ min: 0, max: 0xffffffff });
const tokensArb = fc.array(tokenArb, { minLength: 1, maxLength: 64 });

describe("identity properties", () => {
  it("changing any token, the parent, or the salt changes the chain", () => {
    fc.assert(
      fc.property(tokensArb, fc.nat(), tokenArb, fc.string({ minLength: 1 }), (tokens, at, repl, salt) => {
        const i = at % tokens.length;
        fc.pre(tokens[i] !== repl);
        const root = chainRoot();
        const base = chainHash(root, tokens);
        const changed = [...tokens];
        changed[i] = repl;
        expect(chainHash(root, changed)).not.toBe(base);
        expect(chainHash(chainRoot(salt), tokens)).not.toBe(base);
        expect(chainHash(base, tokens)).not.toBe(base);
      }),
    );
  });

  it("token count is committed: a prefix never hashes like the whole", () => {
    fc.assert(
      fc.property(tokensArb, (tokens) => {
        fc.pre(tokens.length > 1);
        expect(chainHash(chainRoot(), tokens.slice(0, -1))).not.toBe(chainHash(chainRoot(), tokens));
      }),
    );
  });

  it("a chain depends on chunk size and tokens only, never on page size", () => {
    // Page size is not an input to the chain at all; what it could change is
    // how tokens are grouped in memory. Regrouping the same tokens (split into
    // pages of 16 or 32 and concatenated back) yields the same chain.
    fc.assert(
      fc.property(fc.array(tokenArb, { minLength: 0, maxLength: 600 }), (tokens) => {
        const paged = (pageTokens: number) => {
          const pages: number[][] = [];
          for (let i = 0; i < tokens.length; i += pageTokens) pages.push(tokens.slice(i, i + pageTokens));
          return pages.flat();
        };
        const a = prefixChain(paged(16), 128);
        const b = prefixChain(paged(32), 128);
        expect(a).toEqual(b);
        expect(a.length).toBe(Math.floor(tokens.length / 128));
      }),
      { numRuns: 50 },
    );
  });

  it("chains link: each node's parent is the previous node's hash", () => {
    const nodes = prefixChain(
      Array.from({ length: 1000 }, (_, i) => i),
      256,
    );
    expect(nodes.map((n) => n.start)).toEqual([0, 256, 512]);
    expect(nodes[0]!.parent).toBe(chainRoot());
    for (let i = 1; i < nodes.length; i++) expect(nodes[i]!.parent).toBe(nodes[i - 1]!.hash);
  });

  it("any change of manifest field changes the fingerprint; key order does not", () => {
    const fp = modelFingerprint(manifest);
    expect(modelFingerprint({ ...manifest, kvDtype: "bf16" })).not.toBe(fp);
    expect(modelFingerprint({ ...manifest, weightFormat: "f32+q4_0" })).not.toBe(fp);
    expect(modelFingerprint({ ...manifest, variant: "cuda/v1" })).not.toBe(fp);
    expect(modelFingerprint({ ...manifest, architecture: { layers: 3, hidden: 64 } })).not.toBe(fp);
    expect(modelFingerprint({ ...manifest, architecture: { hidden: 64, layers: 2 } })).toBe(fp);
    fc.assert(
      fc.property(
        fc.uint8Array({ minLength: 32, maxLength: 32 }).map((b) => Buffer.from(b).toString("hex")),
        (digest) => {
          fc.pre(digest !== manifest.weightsDigest);
          expect(modelFingerprint({ ...manifest, weightsDigest: digest })).not.toBe(fp);
        },
      ),
      { numRuns: 50 },
    );
  });

  it("node ids differ by fingerprint and by prefix; content ids by bytes and by metadata", () => {
    const fp = modelFingerprint(manifest);
    const other = modelFingerprint({ ...manifest, layout: "x" });
    const h = chainHash(chainRoot(), [1]);
    expect(catalogNodeId(fp, h)).not.toBe(catalogNodeId(other, h));
    expect(catalogNodeId(fp, h)).not.toBe(catalogNodeId(fp, chainHash(chainRoot(), [2])));
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 1, maxLength: 256 }), fc.nat(), (bytes, at) => {
        const id = contentId(bytes, { n: 1 });
        const flipped = Uint8Array.from(bytes);
        flipped[at % bytes.length]! ^= 1;
        expect(contentId(flipped, { n: 1 })).not.toBe(id);
        expect(contentId(bytes, { n: 2 })).not.toBe(id);
      }),
    );
  });

  it("rejects tokens that are not u32 and malformed ids", () => {
    expect(() => chainHash(chainRoot(), [-1])).toThrow(RangeError);
    expect(() => chainHash(chainRoot(), [2 ** 32])).toThrow(RangeError);
    expect(() => chainHash(chainRoot(), [1.5])).toThrow(RangeError);
    expect(() => PrefixHash("ABC")).toThrow(InvalidIdError);
    expect(() => prefixChain([1], 0)).toThrow(RangeError);
  });

  it("canonical JSON sorts keys at every depth and refuses non-finite numbers", () => {
    expect(canonicalJson({ b: 1, a: { d: [3, { z: 1, y: 2 }], c: null } })).toBe(
      '{"a":{"c":null,"d":[3,{"y":2,"z":1}]},"b":1}',
    );
    expect(() => canonicalJson({ a: Number.NaN })).toThrow(RangeError);
  });
});
