import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { longestPublishedPrefix } from "../../catalog/queries.ts";
import { Replica } from "../../catalog/replica.ts";
import { textCodec } from "../../cli/embedded/text-codec.ts";
import { defaultAssignmentLimits } from "../../controller/assignments.ts";
import { planChain } from "../../controller/candidates.ts";
import { type AssignmentMessage, WorkerHub } from "../../controller/fleet/hub.ts";
import { FleetService } from "../../controller/fleet/service.ts";
import { defaultRouterPolicy } from "../../controller/router.ts";
import { RequestId, TenantId, type WorkerId } from "../../schema/ids.ts";
import { createLogger, type Logger, silentLogger } from "../../schema/log.ts";
import { WorkerAgent } from "../../worker/agent/agent.ts";
import { generateModel } from "../../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../../worker/model/model-dir.ts";
import { CPU_VARIANT, executionVariant } from "../../worker/model/variant.ts";
import { ConstraintCompiler } from "../../worker/structured/constraint.ts";
import {
  CHUNK,
  generate,
  PAGE,
  promptOf,
  startWorker,
  startWriter,
  type TestWorker,
  uniqueBucket,
  waitPublished,
} from "../worker/restore/harness.ts";

/**
 * A mixed fleet never restores across execution variants.
 *
 * Four workers on one catalog log and one S3 bucket, each a peer of the
 * others: two whose engines compute the CPU variant, and two "CUDA-variant"
 * workers. This machine has no GPU, so the seam is the model's variant: the
 * CUDA-variant workers load the same weights fingerprinted under an H200's
 * CUDA variant (what loadModelDir takes from chooseEngine in a process) while
 * their engine is the CPU one — a pairing no process can make (servedVariant
 * refuses it), which here only means their bits would in truth have been
 * shareable, so any restore across the two would go unnoticed by the logits:
 * the test watches the restorers and the router instead.
 *
 * The controller is the real one (FleetService over a WorkerHub, its own
 * catalog replica, the workers' agents on WebSockets) routing the CPU
 * variant, as a controller with model.variant auto does.
 */
const H200_VARIANT = executionVariant("cuda", {
  built: true,
  devices: 1,
  arch: "sm90",
  toolkit: "13.0",
  numerics: "gemm-mma16816.f32acc.k256+attn-mma.hilo.s512/v1",
});

let root: string;
let cpuModel: LoadedModel;
let gpuModel: LoadedModel;
let log: EmbeddedLog;
let writer: { stop(): Promise<void> };
let replica: Replica;
let hub: WorkerHub;
let service: FleetService;
const workers: TestWorker[] = [];
const agents: WorkerAgent[] = [];
let c1: TestWorker;
let c2: TestWorker;
let g1: TestWorker;
let g2: TestWorker;
/** The controller's routing decisions (assignment.routed events). */
const routed: Record<string, unknown>[] = [];
const hubMessages: AssignmentMessage[] = [];

const capture: Logger = createLogger({
  level: "info",
  write: (line) => {
    const e = JSON.parse(line) as Record<string, unknown>;
    if (e.event === "assignment.routed") routed.push(e);
  },
});

async function until(what: string, ok: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** One request through the controller: its tokens and how many prompt tokens were cached. */
async function viaController(id: string, prompt: number[], maxTokens: number) {
  const gen = service.generate({
    requestId: RequestId(id),
    tenant: TenantId("default"),
    model: "tiny",
    prompt,
    maxTokens,
    sampling: {
      temperature: 0,
      topP: 1,
      topK: 0,
      minP: 0,
      seed: 1,
      repetitionPenalty: 1,
      presencePenalty: 0,
      frequencyPenalty: 0,
      logitBias: [],
      minTokens: 0,
      allowedTokenIds: null,
    },
    stopTokenIds: [],
    cacheSalt: null,
    priority: 0,
    logprobs: null,
    promptLogprobs: null,
    constraint: null,
  });
  const tokens: number[] = [];
  for await (const e of gen.events) {
    if (e.type === "token") tokens.push(e.token);
    else if (e.type === "error") throw new Error(e.message);
    else return { tokens, cachedTokens: e.cachedTokens };
  }
  throw new Error("no end event");
}

const restoredChunks = (w: TestWorker) => {
  const c = w.cache.restorer.stats().chunks;
  return c.ram + c.ssd + c.peer + c.s3;
};

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-variants-"));
  const dir = (await generateModel({ preset: "tiny", out: join(root, "tiny"), seed: 7 })).dir;
  cpuModel = await loadModelDir(dir, { variant: CPU_VARIANT });
  gpuModel = await loadModelDir(dir, { variant: H200_VARIANT });
  log = await EmbeddedLog.open();
  writer = startWriter(log);
  const bucket = uniqueBucket();
  c1 = await startWorker(cpuModel, { id: "cpu-1", log, s3Bucket: bucket });
  c2 = await startWorker(cpuModel, { id: "cpu-2", log, s3Bucket: bucket });
  g1 = await startWorker(gpuModel, { id: "gpu-1", log, s3Bucket: bucket });
  g2 = await startWorker(gpuModel, { id: "gpu-2", log, s3Bucket: bucket });
  workers.push(c1, c2, g1, g2);

  replica = await Replica.start({ log, warn: () => undefined });
  hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: "cluster-secret",
    ttlMs: 60_000,
    log: silentLogger,
  });
  const port = await hub.start();
  service = new FleetService(
    hub,
    {
      db: () => replica.catalog,
      lag: () => 0,
    },
    null,
    {
      model: {
        id: "tiny",
        fingerprint: cpuModel.fingerprint,
        maxContext: cpuModel.config.spec.maxPosition,
        codec: textCodec(cpuModel),
      },
      chunkTokens: CHUNK,
      limits: defaultAssignmentLimits,
      policy: { ...defaultRouterPolicy, heartbeatTtlMs: 60_000, residentFreshMs: 60_000 },
      maxActive: 64,
      tickMs: 20,
      log: capture,
    },
  );
  for (const [w, model] of [
    [c1, cpuModel],
    [c2, cpuModel],
    [g1, gpuModel],
    [g2, gpuModel],
  ] as const) {
    const s = model.config.spec;
    const agent = new WorkerAgent(w.runtime, {
      workerId: w.id as WorkerId,
      controllerUrl: `ws://127.0.0.1:${port}`,
      clusterSecret: "cluster-secret",
      fingerprint: model.fingerprint,
      maxContext: s.maxPosition,
      pageTokens: PAGE,
      chunkTokens: CHUNK,
      kvBytesPerToken: s.nLayers * s.nKvHeads * (s.headDim + s.vHeadDim) * 2,
      durableTiers: ["ram", "ssd", "s3"],
      stopTokenIds: [],
      constraints: new ConstraintCompiler(model.tokenizer.tokenBytes()),
      heartbeatIntervalMs: 50,
      reconnectBaseMs: 20,
      reconnectMaxMs: 200,
      fenceMemory: 64,
      maxQueuedBytes: 1 << 20,
      log: silentLogger,
    });
    // Engines loaded and caches open: warm (heartbeats say ready, or the router drops them as warming).
    agent.markReady();
    agent.start();
    agents.push(agent);
    await agent.connected;
  }
  await until(
    "every worker's heartbeat",
    () => [...hub.view.entries.values()].filter((e) => e.heartbeat).length === 4,
  );
}, 120_000);

afterAll(async () => {
  service?.close();
  for (const a of agents) await a.stop();
  await hub?.close();
  for (const w of workers) await w.close();
  await replica?.stop();
  await writer?.stop();
  await log?.close();
  await rm(root, { recursive: true, force: true });
});

describe("a fleet of CPU and CUDA-variant workers", () => {
  const p = promptOf(420, 5);

  it("the two variants fingerprint the same weights apart", () => {
    expect(gpuModel.manifest.weightsDigest).toBe(cpuModel.manifest.weightsDigest);
    expect(gpuModel.fingerprint).not.toBe(cpuModel.fingerprint);
    const nodes = (fp: typeof cpuModel.fingerprint) => planChain(fp, p, CHUNK).map((n) => n.nodeId);
    const shared = nodes(cpuModel.fingerprint).filter((n) => nodes(gpuModel.fingerprint).includes(n));
    expect(shared).toEqual([]);
  });

  it("the controller routes the CPU variant only to CPU workers, dropping the others as wrong_model", async () => {
    const r = await viaController("mixed-1", p, 4);
    expect(r.cachedTokens).toBe(0);
    const d = routed.at(-1)!;
    expect(["cpu-1", "cpu-2"]).toContain(d.workerId);
    const dropped = d.dropped as string[];
    for (const g of ["gpu-1", "gpu-2"]) expect(dropped).toContain(`${g}:recompute:wrong_model`);
    await c1.cache.idle();
    await c2.cache.idle();
    for (const w of [c1, c2]) await waitPublished(w, p, 3);
  });

  it("a CUDA-variant worker recomputes a prompt whose chunks only the CPU variant published", async () => {
    // The CPU chunks are in the CUDA-variant worker's own catalog replica (and in S3 and the CPU workers' tiers).
    const cpuNodes = planChain(cpuModel.fingerprint, p, CHUNK).map((n) => n.nodeId);
    await until(
      "g1's replica to hold the CPU chunks",
      () => longestPublishedPrefix(g1.cache.catalog.db, cpuNodes).length === 3,
    );
    const out = await generate(g1.runtime, p, 4);
    expect(out.cachedTokens).toBe(0);
    expect(restoredChunks(g1)).toBe(0);
    await g1.cache.idle();
  });

  it("a CUDA-variant worker restores, exactly, what another of its variant published", async () => {
    await waitPublished(g2, p, 3);
    const fromG1 = await generate(g1.runtime, p, 4);
    const restored = await generate(g2.runtime, p, 4);
    expect(restored.cachedTokens).toBe(3 * CHUNK);
    expect(restoredChunks(g2)).toBe(3);
    expect(restored.tokens).toEqual(fromG1.tokens);
  });

  it("the controller never offers a CUDA-variant worker the CPU chunks it could reach (peer, S3)", async () => {
    const before = routed.length;
    const r = await viaController("mixed-2", [...p.slice(0, 400), ...promptOf(30, 9)], 2);
    expect(r.cachedTokens).toBeGreaterThan(0);
    const d = routed[before]!;
    expect(["cpu-1", "cpu-2"]).toContain(d.workerId);
    const dropped = d.dropped as string[];
    // The CPU chunks in the CPU workers' RAM and in S3 are peer and S3 sources for every worker:
    // on a CUDA-variant worker each is derived and dropped, as is its recompute.
    for (const g of ["gpu-1", "gpu-2"]) {
      expect(dropped).toContain(`${g}:recompute:wrong_model`);
      expect(dropped).toContain(`${g}:peer:wrong_model`);
      expect(dropped.filter((x) => x.startsWith(`${g}:`) && !x.endsWith(":wrong_model"))).toEqual([]);
    }
  });

  it("a CPU worker recomputes a prompt whose chunks only the CUDA variant published", async () => {
    const q = promptOf(420, 21);
    await generate(g2.runtime, q, 2);
    await g2.cache.idle();
    await waitPublished(g1, q, 3);
    const gpuNodes = planChain(gpuModel.fingerprint, q, CHUNK).map((n) => n.nodeId);
    await until(
      "the controller's replica to hold the CUDA chunks",
      () => longestPublishedPrefix(replica.catalog, gpuNodes).length === 3,
    );
    const before = restoredChunks(c1) + restoredChunks(c2);
    const r = await viaController("mixed-3", q, 2);
    expect(r.cachedTokens).toBe(0);
    expect(["cpu-1", "cpu-2"]).toContain(routed.at(-1)!.workerId);
    expect(routed.at(-1)!.source).toBe("recompute");
    expect(restoredChunks(c1) + restoredChunks(c2)).toBe(before);
  });

  it("a CUDA-variant worker declines an offer of the CPU variant (its own admission)", async () => {
    hub.setListener({ onAssignment: (m) => hubMessages.push(m), onWorkerLost: () => undefined });
    const sent = hub.sendOffer("gpu-1" as WorkerId, {
      requestId: RequestId("mixed-direct"),
      attempt: 1,
      workerId: "gpu-1" as WorkerId,
      modelFingerprint: cpuModel.fingerprint,
      prompt: p,
      maxTokens: 2 as never,
      cacheSalt: "",
      sampling: { temperature: 0 },
      plan: { source: "recompute", cachedTokens: 0 as never, predictedTtftMs: 1 },
    });
    expect(sent).toBe(true);
    await until("gpu-1's answer", () => hubMessages.some((m) => m.msg.requestId === "mixed-direct"));
    const answer = hubMessages.find((m) => m.msg.requestId === "mixed-direct")!;
    expect(answer.type).toBe("decline");
    expect((answer.msg as { reason: string }).reason).toBe("wrong_model");
  });
});
