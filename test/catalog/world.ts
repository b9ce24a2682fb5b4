import { expect } from "vitest";
import { CatalogDb } from "../../catalog/db.ts";
import type { CatalogOp, Proposal } from "../../schema/catalog.ts";
import { catalogNodeId, prefixChain } from "../../schema/identity.ts";
import { CHUNK_TOKENS, fingerprintOf, LAYOUT } from "./gen.ts";

/** A small fixed catalog world for the db and rules suites: two models, two workers, one 8-chunk chain. */

export const fp = fingerprintOf(0);
export const other = fingerprintOf(1);
export const chain = prefixChain(
  Array.from({ length: 8 * CHUNK_TOKENS }, (_, i) => i),
  CHUNK_TOKENS,
);
export const node = (i: number) => catalogNodeId(fp, chain[i]!.hash);
export const content = "c".repeat(64);

let seq = 0;
export const prop = (...ops: CatalogOp[]): Proposal => ({ id: `p${seq++}`, clientId: "test", ops });

export function publish(
  i: number,
  over: Partial<Extract<CatalogOp, { op: "chunk.published" }>> = {},
): CatalogOp {
  return {
    op: "chunk.published",
    node: node(i),
    prefix: chain[i]!.hash,
    parent: chain[i]!.parent,
    model: fp,
    start: chain[i]!.start,
    tokens: CHUNK_TOKENS,
    content,
    bytes: 1024,
    layout: LAYOUT,
    created: 1,
    ...over,
  };
}

/** Applies an accepted proposal at the writer's clock `now`; fails the test on a rejection. */
export function commit(db: CatalogDb, p: Proposal, now = 1): void {
  const r = db.resolve(p, now);
  if (!r.ok) throw new Error(`unexpected rejection: ${r.reason}`);
  db.apply({ txNo: db.nextTxNo, proposalId: p.id, clientId: p.clientId, time: now, datoms: r.datoms });
}

/** The rejection reason; fails the test if accepted. Checks that resolve changed nothing. */
export function rejected(db: CatalogDb, p: Proposal, now = 1): string {
  const before = db.dbHash();
  const r = db.resolve(p, now);
  expect(db.dbHash()).toBe(before);
  if (r.ok) throw new Error("expected a rejection");
  return r.reason;
}

export function world(): CatalogDb {
  const db = CatalogDb.empty();
  commit(
    db,
    prop(
      { op: "model.registered", fingerprint: fp, name: "m0", layout: LAYOUT, chunkTokens: CHUNK_TOKENS },
      { op: "model.registered", fingerprint: other, name: "m1", layout: LAYOUT, chunkTokens: CHUNK_TOKENS },
      { op: "worker.registered", worker: "w0", model: fp, address: "127.0.0.1:8090" },
      { op: "worker.registered", worker: "w1", model: other, address: "127.0.0.1:8091" },
    ),
  );
  return db;
}
