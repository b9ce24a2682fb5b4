import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { Replica } from "../../catalog/replica.ts";
import type { TextCodec } from "../../controller/api/service.ts";
import { defaultAssignmentLimits } from "../../controller/assignments.ts";
import { DecisionRecorder } from "../../controller/fleet/decisions.ts";
import { WorkerHub } from "../../controller/fleet/hub.ts";
import { FleetService } from "../../controller/fleet/service.ts";
import { defaultRouterPolicy, type RouterPolicy } from "../../controller/router.ts";
import { RequestId, TenantId, WorkerId } from "../../schema/ids.ts";
import { silentLogger } from "../../schema/log.ts";
import { WorkerAgent } from "../../worker/agent/agent.ts";
import type { LoadedModel } from "../../worker/model/model-dir.ts";
import { ConstraintCompiler } from "../../worker/structured/constraint.ts";
import { CHUNK, PAGE, startWorker, startWriter, type TestWorker } from "../worker/restore/harness.ts";

/**
 * A whole fleet in one process, on real parts: an embedded catalog log on
 * disk with its writer, the controller's replica, hub, fleet service and
 * decision recorder, and workers (runtime, durable cache, agent over a real
 * WebSocket). Requests go through FleetService.generate, as the HTTP front
 * door sends them.
 */

const SECRET = "fleet-secret";

export interface InProcessFleet {
  readonly log: EmbeddedLog;
  readonly logPath: string;
  readonly hub: WorkerHub;
  readonly service: FleetService;
  readonly recorder: DecisionRecorder;
  readonly replica: Replica;
  readonly workers: { readonly worker: TestWorker; readonly agent: WorkerAgent }[];
  /** Greedy generation of `maxTokens` tokens for `prompt`; resolves with the tokens and cached tokens. */
  generate(
    prompt: readonly number[],
    maxTokens: number,
    tenant?: string,
  ): Promise<{ tokens: number[]; cachedTokens: number }>;
  close(): Promise<void>;
}

const codec = (vocab: number): TextCodec => ({
  encode: () => [],
  decode: () => "",
  renderChat: () => "",
  tokenString: (id) => String(id),
  tokenBytes: () => null,
  checkConstraint: () => 0,
  toolParser: null,
  eosTokenIds: [],
  vocabSize: vocab,
});

export interface FleetSpec {
  readonly workers: number;
  readonly policy?: Partial<RouterPolicy>;
  /** Whether worker i says it is warm from its first heartbeat (default: every worker). */
  readonly ready?: (i: number) => boolean;
}

export async function startFleet(model: LoadedModel, spec: FleetSpec): Promise<InProcessFleet> {
  const dir = await mkdtemp(join(tmpdir(), "continuum-fleet-"));
  const logPath = join(dir, "catalog.log");
  const log = await EmbeddedLog.open({ path: logPath });
  const writer = startWriter(log);
  const replica = await Replica.start({ log });
  const hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: SECRET,
    ttlMs: 5_000,
    log: silentLogger,
  });
  await hub.start();
  const recorder = new DecisionRecorder(log, { clientId: "controller", log: silentLogger, flushMs: 50 });
  const policy: RouterPolicy = {
    ...defaultRouterPolicy,
    heartbeatTtlMs: 5_000,
    residentFreshMs: 5_000,
    ...spec.policy,
  };
  const service = new FleetService(hub, { db: () => replica.catalog, lag: () => 0 }, recorder, {
    model: {
      id: "tiny",
      fingerprint: model.fingerprint,
      maxContext: model.config.spec.maxPosition,
      codec: codec(model.config.spec.vocab),
    },
    chunkTokens: CHUNK,
    limits: { ...defaultAssignmentLimits, offerTimeoutMs: 10_000, progressTimeoutMs: 60_000 },
    policy,
    maxActive: 64,
    tickMs: 20,
    log: silentLogger,
  });
  const s = model.config.spec;
  const workers: InProcessFleet["workers"] = [];
  for (let i = 0; i < spec.workers; i++) {
    const worker = await startWorker(model, { id: `fw-${i}`, log, secret: SECRET });
    const agent = new WorkerAgent(worker.runtime, {
      workerId: WorkerId(`fw-${i}`),
      controllerUrl: `ws://127.0.0.1:${hub.port}`,
      clusterSecret: SECRET,
      fingerprint: model.fingerprint,
      maxContext: s.maxPosition,
      pageTokens: PAGE,
      chunkTokens: CHUNK,
      kvBytesPerToken: s.nLayers * s.nKvHeads * (s.headDim + s.vHeadDim) * 2,
      durableTiers: ["ram", "ssd"],
      stopTokenIds: [],
      constraints: new ConstraintCompiler(model.tokenizer.tokenBytes()),
      heartbeatIntervalMs: 50,
      reconnectBaseMs: 50,
      reconnectMaxMs: 500,
      fenceMemory: 1024,
      maxQueuedBytes: 8 << 20,
      log: silentLogger,
    });
    if (spec.ready?.(i) ?? true) agent.markReady();
    agent.start();
    workers.push({ worker, agent });
  }
  for (const w of workers) await w.agent.connected;
  const deadline = Date.now() + 30_000;
  while (service.workers().filter((w) => w.live).length < spec.workers) {
    if (Date.now() > deadline) throw new Error("the fleet's workers sent no heartbeat in 30 s");
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    log,
    logPath,
    hub,
    service,
    recorder,
    replica,
    workers,
    async generate(prompt, maxTokens, tenant = "default") {
      const g = service.generate({
        requestId: RequestId(`q-${randomUUID().slice(0, 8)}`),
        tenant: TenantId(tenant),
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
      for await (const e of g.events) {
        if (e.type === "token") tokens.push(e.token);
        else if (e.type === "error") throw new Error(e.message);
        else return { tokens, cachedTokens: e.cachedTokens };
      }
      throw new Error("the generation ended without an end event");
    },
    async close() {
      service.close();
      for (const w of workers) await w.agent.stop();
      await recorder.close();
      await hub.close();
      for (const w of workers) await w.worker.close();
      await replica.stop();
      await writer.stop();
      await log.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
