import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generate } from "../../worker/model/decoder.ts";
import { PageAllocator, PagedDecoder } from "../../worker/model/decoder-paged.ts";
import { openEngine } from "../../worker/model/engine.ts";
import { generateModel } from "../../worker/model/generate.ts";
import type { Arch } from "../../worker/model/generate-arch.ts";
import { type LoadedModel, loadModelDir } from "../../worker/model/model-dir.ts";
import { initialSamplerState, samplingParams } from "../../worker/model/sampling.ts";
import { freePort, freePortPair } from "../ports.ts";
import { startBroker } from "../setup/kafka.ts";
import { RoleProcess, tokens } from "./fleet-process.ts";
import { startServe } from "./serve-process.ts";

/**
 * The families served for real: `continuum serve` (the embedded default) on
 * each family's generated model through CONTINUUM_MODEL_DIR, and a fleet
 * (writer, controller, worker over a real Kafka broker) on a Gemma 3 model.
 * Each greedy completion must be the one the paged decoder computes in this
 * process for the same prompt ids: the served path runs the same forward,
 * windows included, at a context several times the window.
 */
const FAMILIES: readonly Arch[] = ["mistral-sw", "qwen3", "gemma2", "gemma3", "phi3"];
const MAX_TOKENS = 12;

let root: string;
const models = new Map<Arch, LoadedModel>();

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-e2e-families-"));
  for (const arch of FAMILIES) {
    const g = await generateModel({ preset: "tiny", out: join(root, arch), arch, seed: 3 });
    models.set(arch, await loadModelDir(g.dir, { variant: "cpu-f32acc/v1" }));
  }
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

/** The greedy completion of `prompt` by the paged decoder in this process, as text. */
async function expected(model: LoadedModel, prompt: number[]): Promise<{ text: string; n: number }> {
  const engine = await openEngine(model.config.spec, model.weights, { threads: 1 });
  try {
    const d = new PagedDecoder(
      engine,
      new PageAllocator(Math.ceil((prompt.length + MAX_TOKENS) / 16)),
      16,
      1,
    );
    const params = samplingParams({ maxTokens: MAX_TOKENS, stopTokens: model.eosTokenIds });
    const [g] = await generate(d, [prompt], [initialSamplerState(params)]);
    const ids = g!.tokens.filter((t) => !model.eosTokenIds.includes(t));
    return { text: model.tokenizer.decode(ids, { skipSpecialTokens: true }), n: g!.tokens.length };
  } finally {
    engine.free();
  }
}

describe("the embedded default serves every family", () => {
  it.each(FAMILIES)(
    "%s: greedy completions equal the paged decoder's, and a shared prefix is reused",
    async (arch) => {
      const model = models.get(arch)!;
      const server = await startServe({ CONTINUUM_MODEL_DIR: model.dir });
      try {
        const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
        const id = (await client.models.list()).data[0]!.id;
        // 6 windows of prompt, then a second prompt sharing its first 128 tokens.
        const a = tokens(6 * 24, 1);
        const b = [...a.slice(0, 128), ...tokens(20, 2)];
        for (const [i, prompt] of [a, b].entries()) {
          const r = await client.completions.create({
            model: id,
            prompt,
            max_tokens: MAX_TOKENS,
            temperature: 0,
          });
          const want = await expected(model, prompt);
          expect(r.choices[0]!.text).toBe(want.text);
          expect(r.usage!.completion_tokens).toBe(want.n);
          if (i === 1) expect(r.usage!.prompt_tokens_details?.cached_tokens).toBeGreaterThan(0);
        }
      } finally {
        await server.stop();
      }
    },
  );
});

describe("a fleet serves a Gemma 3 model", () => {
  let stopBroker: (() => Promise<void>) | undefined;
  const procs: RoleProcess[] = [];
  let dataDir: string;

  afterAll(async () => {
    for (const p of procs.reverse()) await p.stop();
    await stopBroker?.();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  it("writer, controller and a worker on the model's directory answer as the paged decoder does", async () => {
    let brokers = process.env.CONTINUUM_KAFKA_BROKERS;
    if (!brokers) {
      const dir = await mkdtemp(join(tmpdir(), "continuum-families-kafka-"));
      const b = await startBroker(await freePortPair(), dir);
      brokers = b.brokers;
      stopBroker = async () => {
        await b.stop();
        await rm(dir, { recursive: true, force: true });
      };
    }
    const model = models.get("gemma3")!;
    dataDir = await mkdtemp(join(tmpdir(), "continuum-families-fleet-"));
    const run = randomBytes(4).toString("hex");
    const httpPort = await freePort();
    const workerPort = await freePort();
    const env = {
      PORT: String(httpPort),
      CONTINUUM_MODEL_DIR: model.dir,
      CONTINUUM_CATALOG_LOG: "kafka",
      CONTINUUM_CATALOG_BROKERS: brokers,
      CONTINUUM_CATALOG_TOPICS_PROPOSALS: `families-${run}.proposals`,
      CONTINUUM_CATALOG_TOPICS_TX: `families-${run}.tx`,
      CONTINUUM_CATALOG_TOPICS_REJECTIONS: `families-${run}.rejections`,
      CONTINUUM_STORE_DATA_DIR: dataDir,
      CONTINUUM_AUTH_CLUSTER_SECRET: `families-${run}`,
      CONTINUUM_CONTROLLER_WORKER_PORT: String(workerPort),
      CONTINUUM_WORKER_CONTROLLER_URL: `ws://127.0.0.1:${workerPort}`,
      CONTINUUM_PAGES_PHYSICAL_PAGES: "256",
      CONTINUUM_WORKER_THREADS: "1",
      CONTINUUM_LOG_LEVEL: "info",
    };
    const writer = new RoleProcess("writer", ["writer"], env);
    procs.push(writer);
    const controller = new RoleProcess("controller", ["controller"], env);
    procs.push(controller);
    const ready = await controller.waitFor("controller.ready", {}, 90_000);
    procs.push(new RoleProcess("worker-0", ["worker"], { ...env, CONTINUUM_WORKER_INDEX: "0" }));
    await controller.waitFor("hub.worker_connected", { workerId: "worker-0" }, 90_000);
    await writer.waitFor("writer.active", {}, 60_000);
    // The controller names the model by the fingerprint of its sliding/global layout.
    expect(ready.fingerprint).toBe(model.fingerprint);
    const client = new OpenAI({
      baseURL: `http://127.0.0.1:${httpPort}/v1`,
      apiKey: "unused",
      maxRetries: 0,
    });
    const id = (await client.models.list()).data[0]!.id;
    const prompt = tokens(5 * 24, 7);
    const r = await client.completions.create({ model: id, prompt, max_tokens: MAX_TOKENS, temperature: 0 });
    const want = await expected(model, prompt);
    expect(r.choices[0]!.text).toBe(want.text);
    expect(r.usage!.completion_tokens).toBe(want.n);
  }, 240_000);
});
