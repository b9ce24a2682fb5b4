import { describe, expect, it } from "vitest";
import { fastCatalogNodeId } from "../../catalog/rules.ts";
import type { CatalogOp } from "../../schema/catalog.ts";
import { catalogNodeId } from "../../schema/identity.ts";
import { CHUNK_TOKENS, rng } from "./gen.ts";
import { chain, commit, fp, node, other, prop, publish, rejected, world } from "./world.ts";

/** The proposal rules (catalog/rules.ts), run through CatalogDb.resolve against a real db. */

describe("proposal rules (CatalogDb.resolve)", () => {
  it("accepts a chunk and its replica in one proposal, 15 datoms, entity ids assigned once", () => {
    const db = world();
    const r = db.resolve(
      prop(publish(0), { op: "replica.ready", node: node(0), worker: "w0", tier: "ram", verifiedAt: 5 }),
      1,
    );
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.datoms).toHaveLength(9 + 5); // root chunk: no parent datom
    const ids = new Set(r.datoms.map((d) => d[0]));
    expect([...ids].sort()).toEqual([5, 6]);
    expect(r.datoms.every((d) => d[3])).toBe(true);
  });

  it("rejects a missing reference: unregistered model, unknown worker, unpublished chunk or parent", () => {
    const db = world();
    const unknownModel = "e".repeat(64);
    expect(
      rejected(db, prop({ op: "worker.registered", worker: "w9", model: unknownModel, address: "x:1" })),
    ).toMatch(/op 0 \(worker.registered\): model eeeeeeeeeeee… is not registered/);
    expect(rejected(db, prop(publish(1)))).toMatch(/parent chunk .* is not published/);
    expect(
      rejected(db, prop({ op: "replica.ready", node: node(0), worker: "w0", tier: "ram", verifiedAt: 1 })),
    ).toMatch(/chunk .* is not published/);
    commit(db, prop(publish(0)));
    expect(
      rejected(
        db,
        prop({ op: "replica.ready", node: node(0), worker: "nobody", tier: "ram", verifiedAt: 1 }),
      ),
    ).toMatch(/worker nobody is not registered/);
    expect(
      rejected(db, prop({ op: "replica.bad", node: node(0), worker: "w0", tier: "ssd", verifiedAt: 1 })),
    ).toMatch(/no replica of chunk .* on w0\/ssd/);
    expect(
      rejected(db, prop({ op: "decision.measured", request: "r1", attempt: 0, measuredTtftMs: 3 })),
    ).toMatch(/no decision for request r1 attempt 0/);
  });

  it("finds a parent by the model's prefix index: in the db or earlier in the same proposal, never another model's", () => {
    const db = world();
    // Chunks 0-2 in one proposal: 1's parent is 0 and 2's is 1, both only in the draft.
    commit(db, prop(publish(0), publish(1), publish(2)));
    const e = (i: number) => db.eidOf("chunk/node", node(i))!;
    expect(db.get(e(1), "chunk/parent")).toBe(e(0));
    expect(db.get(e(2), "chunk/parent")).toBe(e(1));
    // Chunk 3's parent (2) comes from the db.
    commit(db, prop(publish(3)));
    expect(db.get(e(3), "chunk/parent")).toBe(e(2));
    // The same prefix published under another model is not this model's parent.
    const theirs = (i: number) => publish(i, { model: other, node: catalogNodeId(other, chain[i]!.hash) });
    commit(db, prop(theirs(0)));
    expect(rejected(db, prop(publish(5)))).toBe(
      `op 0 (chunk.published): parent chunk ${node(4).slice(0, 12)}… is not published`,
    );
    commit(db, prop(theirs(1)));
    expect(db.get(db.eidOf("chunk/node", catalogNodeId(other, chain[1]!.hash))!, "chunk/parent")).toBe(
      db.eidOf("chunk/node", catalogNodeId(other, chain[0]!.hash)),
    );
  });

  it("computes node ids equal to schema/identity.ts catalogNodeId", () => {
    const r = rng(7);
    const hex64 = () => Array.from({ length: 64 }, () => "0123456789abcdef"[Math.floor(r() * 16)]).join("");
    for (let i = 0; i < 200; i++) {
      const f = hex64() as typeof fp;
      const p = hex64() as (typeof chain)[number]["hash"];
      expect(fastCatalogNodeId(f, p)).toBe(catalogNodeId(f, p));
    }
  });

  it("rejects the whole proposal when a later op fails, naming the op", () => {
    const db = world();
    const reason = rejected(db, prop(publish(0), publish(2)));
    expect(reason).toMatch(/^op 1 \(chunk.published\): parent chunk/);
    expect(db.eidOf("chunk/node", node(0))).toBeUndefined();
  });

  it("enforces uniqueness and immutability", () => {
    const db = world();
    commit(db, prop(publish(0)));
    // The same chunk again is a no-op (immutable facts, a second publisher).
    const again = db.resolve(prop(publish(0)), 1);
    expect(again).toEqual({ ok: true, datoms: [] });
    expect(rejected(db, prop(publish(0, { content: "d".repeat(64) })))).toMatch(
      /is published with content cccccccccccc…, not dddddddddddd…/,
    );
    expect(
      rejected(
        db,
        prop({
          op: "model.registered",
          fingerprint: fp,
          name: "m0",
          layout: "other/v1",
          chunkTokens: CHUNK_TOKENS,
        }),
      ),
    ).toMatch(/registered with another layout or chunk size/);
    const decision: CatalogOp = {
      op: "decision.recorded",
      request: "r1",
      attempt: 0,
      tenant: "t",
      model: fp,
      time: 1,
      candidates: "[]",
      worker: "w0",
      source: "recompute",
      cachedTokens: 0,
      predictedTtftMs: 10,
    };
    commit(db, prop(decision));
    expect(rejected(db, prop(decision))).toMatch(/decision for request r1 attempt 0 is already recorded/);
  });

  it("detects a re-sent proposal id as a duplicate", () => {
    const db = world();
    const p = prop(publish(0));
    commit(db, p);
    const r = db.resolve(p, 1);
    expect(r).toMatchObject({ ok: false, duplicate: true });
  });

  it("checks identities and shapes", () => {
    const db = world();
    expect(rejected(db, prop(publish(0, { node: node(1) })))).toMatch(/is not H\(model, prefix\)/);
    expect(rejected(db, prop(publish(0, { content: "XYZ" })))).toMatch(
      /content id must be 64 lowercase hex digits, got "XYZ"/,
    );
    expect(rejected(db, prop(publish(0, { tokens: 0 })))).toMatch(
      /token count must be an integer in \[1, 1048576\], got 0/,
    );
    expect(rejected(db, prop(publish(0, { bytes: 1.5 })))).toMatch(/byte size must be an integer/);
    expect(rejected(db, prop(publish(0, { layout: "other/v1" })))).toMatch(/differs from the model's/);
    commit(db, prop(publish(0)));
    expect(rejected(db, prop(publish(1, { start: 7 })))).toMatch(
      /parent chunk ends at token 4, this chunk starts at 7/,
    );
    expect(
      rejected(db, prop({ op: "replica.ready", node: node(0), worker: "w0", tier: "floppy", verifiedAt: 1 })),
    ).toMatch(/tier must be one of ram\|ssd\|s3\|peer, got "floppy"/);
    expect(
      rejected(db, prop({ op: "replica.ready", node: node(0), worker: "w1", tier: "ram", verifiedAt: 1 })),
    ).toMatch(/worker w1 serves another model/);
    expect(rejected(db, { id: "has space", clientId: "c", ops: [publish(0)] })).toMatch(
      /proposal id must be 1-128 printable/,
    );
    expect(rejected(db, { id: "empty", clientId: "c", ops: [] })).toMatch(/at least one op/);
    expect(
      rejected(
        db,
        prop({
          op: "decision.recorded",
          request: "r",
          attempt: 0,
          tenant: "t",
          model: fp,
          time: 1,
          candidates: "{",
          worker: "w0",
          source: "ram",
          cachedTokens: 4,
          predictedTtftMs: 1,
        }),
      ),
    ).toMatch(/candidates must be JSON text/);
  });

  it("fences leases by epoch, and another holder takes over only once the lease expired", () => {
    const db = world();
    const acquire = (holder: string, epoch: number, ttlMs = 1_000): CatalogOp => ({
      op: "lease.acquire",
      key: "placement",
      holder,
      epoch,
      ttlMs,
    });
    const expires = () => db.get(db.eidOf("lease/key", "placement")!, "lease/expires");
    commit(db, prop(acquire("ctl-a", 1)), 100);
    expect(expires()).toBe(1_100);
    // Renewal by the holder at its epoch moves the expiry on (and is visible to every replica).
    const renewal = db.resolve(prop(acquire("ctl-a", 1)), 600);
    expect(renewal).toEqual({
      ok: true,
      datoms: [
        [db.eidOf("lease/key", "placement"), "lease/expires", 1_100, false],
        [db.eidOf("lease/key", "placement"), "lease/expires", 1_600, true],
      ],
    });
    commit(db, prop(acquire("ctl-a", 1)), 600);
    expect(rejected(db, prop(acquire("ctl-b", 1)), 700)).toMatch(
      /lease placement is held by ctl-a at epoch 1; acquiring needs an epoch > 1, got 1/,
    );
    // A higher epoch does not steal a lease that is held and unexpired.
    expect(rejected(db, prop(acquire("ctl-b", 2)), 1_599)).toMatch(
      /lease placement is held by ctl-a at epoch 1 for 1 ms more/,
    );
    // Lapsed: the holder itself can no longer renew at its old epoch...
    expect(rejected(db, prop(acquire("ctl-a", 1)), 1_600)).toMatch(
      /free at epoch 1; acquiring needs an epoch > 1/,
    );
    // ...and another holder takes over at a higher epoch.
    commit(db, prop(acquire("ctl-b", 2)), 1_600);
    expect(rejected(db, prop({ op: "lease.release", key: "placement", holder: "ctl-a", epoch: 1 }))).toMatch(
      /fenced: lease placement is held by ctl-b at epoch 2; release came from ctl-a at epoch 1/,
    );
    // The same holder at a higher epoch (a restarted process) fences its old self at once.
    commit(db, prop(acquire("ctl-b", 3)), 1_700);
    commit(db, prop({ op: "lease.release", key: "placement", holder: "ctl-b", epoch: 3 }), 1_800);
    expect(rejected(db, prop(acquire("ctl-b", 3)), 1_900)).toMatch(/free at epoch 3/);
    // Released: anyone takes it at a higher epoch before the old expiry.
    commit(db, prop(acquire("ctl-a", 4)), 1_900);
    expect(rejected(db, prop(acquire("ctl-a", 5, 0)), 2_000)).toMatch(
      /lease ttl must be an integer in \[1, 3600000\]/,
    );
  });

  it("fences placements by the lease epoch and its expiry", () => {
    const db = world();
    commit(db, prop(publish(0)));
    const place = (epoch: number): CatalogOp => ({
      op: "placement.set",
      node: node(0),
      worker: "w0",
      tier: "ssd",
      desired: true,
      lease: "placement",
      epoch,
    });
    const acquire = (holder: string, epoch: number): CatalogOp => ({
      op: "lease.acquire",
      key: "placement",
      holder,
      epoch,
      ttlMs: 1_000,
    });
    expect(rejected(db, prop(place(1)))).toMatch(/fenced: lease placement does not exist/);
    commit(db, prop(acquire("ctl-a", 1)), 0);
    commit(db, prop(place(1)), 999);
    // Nobody took over, but the holder stopped renewing: its late placements are refused.
    expect(rejected(db, prop(place(1)), 1_000)).toMatch(
      /fenced: lease placement at epoch 1 expired 0 ms ago/,
    );
    commit(db, prop(acquire("ctl-b", 2)), 1_500);
    expect(rejected(db, prop(place(1)), 1_600)).toMatch(
      /fenced: lease placement is held at epoch 2; the placement carries epoch 1/,
    );
    commit(db, prop(place(2)), 1_600);
    const e = db.eidOf("chunk/node", node(0))!;
    const placements = [...db.entities()].filter(([, ent]) => ent.get("placement/chunk") === e);
    expect(placements).toHaveLength(1);
    expect(placements[0]![1].get("placement/epoch")).toBe(2);
  });

  it("emits a retraction before a changed value", () => {
    const db = world();
    commit(
      db,
      prop(publish(0), { op: "replica.ready", node: node(0), worker: "w0", tier: "ram", verifiedAt: 1 }),
    );
    const r = db.resolve(
      prop({ op: "replica.removed", node: node(0), worker: "w0", tier: "ram", verifiedAt: 2 }),
      1,
    );
    if (!r.ok) throw new Error(r.reason);
    expect(r.datoms.map(([, a, v, added]) => [a, v, added])).toEqual([
      ["replica/state", "ready", false],
      ["replica/state", "removed", true],
      ["replica/verified-at", 1, false],
      ["replica/verified-at", 2, true],
    ]);
  });
});
