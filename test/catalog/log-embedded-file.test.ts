import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { encodeCommit, frame, TYPE_COMMIT, TYPE_PROPOSAL } from "../../catalog/embedded-file.ts";
import { CatalogLogError } from "../../catalog/log.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { repairLog } from "../../catalog/log-repair.ts";
import { type SmallFs, smallFs } from "../../deploy/small-fs.ts";
import { ProposalMsg } from "../../schema/catalog.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { bytes, leaseProposal, startWriter, until } from "./log-helpers.ts";

/**
 * The embedded log's file under the faults a single process never meets:
 * a second process appending to it, a file two writers already interleaved
 * (and its repair), a disk that fills and frees.
 */

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

async function freshPath(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "continuum-log-file-"));
  dirs.push(dir);
  return join(dir, "embedded.log");
}

const proposal = (id: string) => encodeMessage(ProposalMsg, leaseProposal(id, `k-${id}`));

describe("embedded log: a second process appending to the file", () => {
  it("the first process stops writing at once, so the file keeps one consistent history", async () => {
    const path = await freshPath();
    const a = await EmbeddedLog.open({ path });
    const wa = startWriter(a);
    await a.propose(proposal("a0"));
    await a.propose(proposal("a1"));
    await until(async () => (await a.endOffset()) === 2);
    // The second process: it sees the file as of now, writes and commits three more.
    const b = await EmbeddedLog.open({ path });
    const wb = startWriter(b);
    for (const id of ["b0", "b1", "b2"]) await b.propose(proposal(id));
    await until(async () => (await b.endOffset()) === 5);
    await wb.stop();
    await b.close();
    // The first one, at its stale offsets: refused, naming why.
    await expect(a.propose(proposal("a2"))).rejects.toThrow(/changed under this process.*another process/);
    await wa.stop();
    await a.close();
    const again = await EmbeddedLog.open({ path });
    try {
      expect(again.proposalsEnd()).toBe(5);
      expect(await again.endOffset()).toBe(5);
    } finally {
      await again.close();
    }
  });
});

/**
 * A file as two processes leave it: A commits 2; B appends 3 and commits 5
 * (a real writer, so the transactions decode); A, stale, appends 2 and
 * commits 3, then 4 (written by hand: the journal no longer lets it).
 */
async function interleavedFile(path: string): Promise<{ file: Buffer; staleAt: number }> {
  const log = await EmbeddedLog.open({ path });
  const w = startWriter(log);
  for (const id of ["a0", "a1", "b0", "b1", "b2"]) await log.propose(proposal(id));
  await until(async () => (await log.endOffset()) === 5);
  await w.stop();
  await log.close();
  const p = (id: string) => frame(TYPE_PROPOSAL, Buffer.from(proposal(id)));
  const c = (consumed: number, tx: string[]) =>
    frame(TYPE_COMMIT, encodeCommit(consumed, { tx: tx.map(bytes), rejections: [] }));
  const head = await readFile(path);
  const staleAt = head.length + p("a2").length;
  const file = Buffer.concat([head, p("a2"), c(3, ["t2'"]), p("a3"), c(4, ["t3'"])]);
  await writeFile(path, file);
  return { file, staleAt };
}

describe("embedded log: a file two writers interleaved", () => {
  it("is refused on open, naming the stale commit, the cause and the repair command", async () => {
    const path = await freshPath();
    const { staleAt } = await interleavedFile(path);
    const err = await EmbeddedLog.open({ path }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CatalogLogError);
    expect((err as Error).message).toContain(`commit at byte ${staleAt} consumes up to 3`);
    expect((err as Error).message).toMatch(/second process appended.*continuum catalog repair/);
  });

  it("repair keeps the consistent part and every proposal, drops the stale commits, and reports it", async () => {
    const path = await freshPath();
    const { file, staleAt } = await interleavedFile(path);
    await writeFile(path, Buffer.concat([file, Buffer.from([7, 0, 0])]));
    const report = await repairLog(path);
    expect(report).toMatchObject({
      repaired: true,
      inconsistentAt: staleAt,
      kept: { proposals: 7, tx: 5, rejections: 0 },
      requeuedProposals: 1,
      undecidedProposals: 2,
      dropped: { commits: 2, tx: 2, rejections: 0, tailBytes: 3 },
    });
    // The original stays beside it.
    expect(await readFile(report.backup!)).toEqual(Buffer.concat([file, Buffer.from([7, 0, 0])]));
    const log = await EmbeddedLog.open({ path });
    try {
      expect(log.proposalsEnd()).toBe(7);
      expect(await log.endOffset()).toBe(5);
      // The stale writer's two proposals are decided again by the next writer.
      const w = startWriter(log);
      await until(async () => (await log.endOffset()) === 7);
      await w.stop();
    } finally {
      await log.close();
    }
    // A consistent file is left as it is.
    const again = await repairLog(path);
    expect(again).toMatchObject({ repaired: false, dropped: { commits: 0, tailBytes: 0 } });
    expect((await readdir(join(path, ".."))).filter((f) => f.includes("before-repair"))).toHaveLength(1);
  });
});

const fs = smallFs(4 << 20);
const unavailable = "unavailable" in fs ? fs.unavailable : undefined;
if (unavailable) console.warn(`log-embedded-file: full-disk case skipped: ${unavailable}`);

describe("embedded log: a full disk", () => {
  afterAll(() => {
    if (!unavailable) (fs as SmallFs).unmount();
  });

  it.skipIf(unavailable !== undefined)(
    "a write that meets ENOSPC fails its callers only; once space is freed the log appends again, and a reopen holds exactly what was acknowledged",
    async () => {
      const small = fs as SmallFs;
      const path = join(small.dir, "embedded.log");
      const log = await EmbeddedLog.open({ path });
      const w = startWriter(log);
      await log.propose(proposal("before"));
      await until(async () => (await log.endOffset()) === 1);
      small.fill();
      // Large enough not to fit in what the filler left.
      const big = encodeMessage(ProposalMsg, {
        ...leaseProposal("big", "k-big"),
        clientId: "x".repeat(64 << 10),
      });
      await expect(log.propose(big)).rejects.toThrow(/embedded log write failed: ENOSPC/);
      await expect(log.propose(big)).rejects.toThrow(/ENOSPC/);
      small.free();
      await log.propose(proposal("after"));
      await until(async () => (await log.endOffset()) === 2);
      await w.stop();
      await log.close();
      const again = await EmbeddedLog.open({ path });
      try {
        expect(again.proposalsEnd()).toBe(2);
        expect(await again.endOffset()).toBe(2);
      } finally {
        await again.close();
      }
    },
  );
});
