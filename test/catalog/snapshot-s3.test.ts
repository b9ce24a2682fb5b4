import { randomUUID } from "node:crypto";
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { afterEach, describe, expect, it } from "vitest";
import { CatalogDb } from "../../catalog/db.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { Replica } from "../../catalog/replica.ts";
import { snapshotOffset } from "../../catalog/snapshot.ts";
import { S3SnapshotStore } from "../../catalog/snapshot-s3.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import { type Proposal, ProposalMsg } from "../../schema/catalog.ts";
import { silentLogger } from "../../schema/log.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { CatalogGen, fingerprintOf, LAYOUT } from "./gen.ts";

// The real S3 server of test/setup/s3.ts.
const endpoint = process.env.CONTINUUM_S3_ENDPOINT!;
const creds = {
  accessKeyId: process.env.CONTINUUM_S3_ACCESS_KEY_ID ?? "continuum",
  secretAccessKey: process.env.CONTINUUM_S3_SECRET_ACCESS_KEY ?? "continuum-secret",
};
const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe("catalog snapshots in the object store (real S3 server)", () => {
  it("a replica started from an S3 snapshot equals one replayed from 0, and skips a damaged one", async () => {
    expect(endpoint, "test/setup/s3.ts exports CONTINUUM_S3_ENDPOINT").toBeTruthy();
    const bucket = `snap-${randomUUID().slice(0, 8)}`;
    const store = await S3SnapshotStore.open({
      endpoint,
      region: "us-east-1",
      ...creds,
      bucket,
      prefix: "catalog/snapshots/",
      requestTimeoutMs: 10_000,
    });
    cleanups.push(() => store.close());
    const log = await EmbeddedLog.open({ maxBatch: 100 });
    cleanups.push(() => log.close());
    const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
    const running = writer.run();
    cleanups.push(async () => {
      await writer.stop();
      await running;
    });
    const snapshotter = await Replica.start({ log, snapshots: store, snapshotEvery: 300 });
    cleanups.push(() => snapshotter.stop());

    // 1,000 random proposals, then a sentinel whose tx marks the end.
    const gen = new CatalogGen(7);
    const proposals = [gen.setup(), ...Array.from({ length: 1_000 }, () => gen.next())];
    const sentinel: Proposal = {
      id: "sentinel",
      clientId: "test",
      ops: [
        {
          op: "model.registered",
          fingerprint: fingerprintOf(4242),
          name: "sentinel",
          layout: LAYOUT,
          chunkTokens: 4,
        },
      ],
    };
    const seen = new Promise<number>((resolve) => {
      const off = snapshotter.listen((reports) => {
        for (const r of reports)
          if (r.tx.proposalId === "sentinel") {
            off();
            resolve(r.offset);
          }
      });
    });
    for (let i = 0; i < proposals.length; i += 200) {
      await Promise.all(proposals.slice(i, i + 200).map((p) => log.propose(encodeMessage(ProposalMsg, p))));
    }
    await log.propose(encodeMessage(ProposalMsg, sentinel));
    const last = await Promise.race([seen, new Promise<number>((r) => setTimeout(() => r(-1), 60_000))]);
    expect(last, "the sentinel was applied").toBeGreaterThan(0);
    await snapshotter.waitFor(last + 1);
    const keys = await store.list();
    expect(keys.length).toBeGreaterThanOrEqual(2);
    const newest = keys[keys.length - 1]!;
    expect(snapshotOffset(newest)).toBeGreaterThan(0);

    const fromSnapshot = await Replica.start({ log, snapshots: store });
    cleanups.push(() => fromSnapshot.stop());
    const fromZero = await Replica.start({ log, snapshots: store, ignoreSnapshots: true });
    cleanups.push(() => fromZero.stop());
    await fromSnapshot.waitFor(last + 1);
    await fromZero.waitFor(last + 1);
    expect(fromSnapshot.startOffset).toBe(snapshotOffset(newest));
    expect(fromSnapshot.dbHash()).toBe(fromZero.dbHash());

    // Damage the newest object in the bucket: the next replica warns and uses the one before.
    const raw = new S3Client({
      endpoint,
      region: "us-east-1",
      forcePathStyle: true,
      credentials: creds,
      requestChecksumCalculation: "WHEN_REQUIRED",
    });
    cleanups.push(() => raw.destroy());
    await raw.send(
      new PutObjectCommand({
        Bucket: bucket,
        Key: `catalog/snapshots/${newest}`,
        Body: Buffer.from("garbage"),
        ContentLength: 7,
      }),
    );
    const warnings: string[] = [];
    const fallback = await Replica.start({ log, snapshots: store, warn: (m) => warnings.push(m) });
    cleanups.push(() => fallback.stop());
    await fallback.waitFor(last + 1);
    expect(fallback.startOffset).toBe(snapshotOffset(keys[keys.length - 2]!));
    expect(fallback.dbHash()).toBe(fromZero.dbHash());
    expect(warnings.join("\n")).toMatch(/skipping catalog snapshot/);
    expect(await store.get("catalog-snapshot-9999999999999999.bin")).toBeUndefined();
  });
});
