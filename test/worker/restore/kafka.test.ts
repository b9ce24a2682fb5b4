import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { tinyModel } from "../runtime/fixture.ts";
import {
  Device,
  generate,
  promptOf,
  startWorker,
  startWriter,
  uniqueBucket,
  waitPublished,
} from "./harness.ts";

/**
 * The two deployments end to end through the runtime: a fleet (real Kafka
 * catalog log, one S3 bucket, two workers with their own disks) and the
 * embedded default (one process, embedded log on disk, local files, no S3),
 * across a restart of its worker.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
const cleanups: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  await cleanupModel?.();
});

async function reference(prompt: readonly number[]): Promise<number[]> {
  const d = await Device.open(model);
  try {
    return (await d.continueGreedy(d.openRoute("ref", prompt.length + 16), prompt, 3)).greedy;
  } finally {
    d.close();
  }
}

const brokers = process.env.CONTINUUM_KAFKA_BROKERS;

describe.skipIf(!brokers)("fleet: catalog through real Kafka, one S3 bucket", () => {
  it("worker B continues, bit-exact, a prompt whose prefix only worker A computed", async () => {
    const suffix = randomUUID().slice(0, 8);
    const open = (who: string) =>
      KafkaLog.open({
        brokers: brokers!.split(","),
        clientId: `restore-${who}-${suffix}`,
        topics: {
          proposals: `r-${suffix}.proposals`,
          tx: `r-${suffix}.tx`,
          rejections: `r-${suffix}.rejections`,
        },
      });
    const writerLog = await open("writer");
    cleanups.push(() => writerLog.close());
    const writer = startWriter(writerLog);
    cleanups.push(() => writer.stop());
    const bucket = uniqueBucket();
    const logA = await open("a");
    cleanups.push(() => logA.close());
    const logB = await open("b");
    cleanups.push(() => logB.close());
    const a = await startWorker(model, { id: "k-a", log: logA, s3Bucket: bucket });
    cleanups.push(() => a.close());
    const b = await startWorker(model, { id: "k-b", log: logB, s3Bucket: bucket });
    cleanups.push(() => b.close());
    const prompt = promptOf(420, 31);
    const first = await generate(a.runtime, prompt, 4);
    expect(first.cachedTokens).toBe(0);
    await a.cache.idle();
    await waitPublished(b, prompt, 3);
    const second = await generate(b.runtime, prompt, 4);
    expect(second.cachedTokens).toBe(390);
    expect(second.tokens).toEqual(first.tokens);
    expect(second.tokens).toEqual((await reference(prompt)).slice(0, 4));
  });
});

describe("embedded default: one process, embedded log on disk, local files", () => {
  it("a restarted worker restores its own prefix from SSD, bit-exact", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-embedded-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const logPath = join(dir, "catalog.log");
    const prompt = promptOf(420, 32);

    let log = await EmbeddedLog.open({ path: logPath });
    let writer = startWriter(log);
    const w1 = await startWorker(model, { id: "e-0", log, dir });
    const first = await generate(w1.runtime, prompt, 4);
    await w1.cache.idle();
    await waitPublished(w1, prompt, 3);
    await w1.close();
    await writer.stop();
    await log.close();

    log = await EmbeddedLog.open({ path: logPath });
    writer = startWriter(log);
    cleanups.push(() => log.close());
    cleanups.push(() => writer.stop());
    const w2 = await startWorker(model, { id: "e-0", log, dir });
    cleanups.push(() => w2.close());
    const second = await generate(w2.runtime, prompt, 4);
    expect(second.cachedTokens).toBe(390);
    expect(second.tokens).toEqual(first.tokens);
    const st = w2.cache.restorer.stats();
    expect(st.chunks.ssd).toBe(3);
    // The RAM replicas of the earlier life were withdrawn at start, so none was tried.
    expect(st.fallbacks.missing).toBe(0);
  });
});
