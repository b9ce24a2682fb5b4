import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ApiFrontDoor, openFrontDoor } from "../../cli/api-server.ts";
import { textCodec } from "../../cli/embedded/text-codec.ts";
import { defaultAssignmentLimits } from "../../controller/assignments.ts";
import { WorkerHub } from "../../controller/fleet/hub.ts";
import { FleetService } from "../../controller/fleet/service.ts";
import { defaultRouterPolicy } from "../../controller/router.ts";
import { resolveConfig } from "../../schema/config-load.ts";
import type { WorkerId } from "../../schema/ids.ts";
import { silentLogger } from "../../schema/log.ts";
import { WorkerAgent } from "../../worker/agent/agent.ts";
import type { LoadedModel } from "../../worker/model/model-dir.ts";
import { ConstraintCompiler } from "../../worker/structured/constraint.ts";
import { type ApiHarness, startApi } from "../controller/api/harness.ts";
import { type RuntimeFixture, startRuntime, tinyModel } from "../worker/runtime/fixture.ts";

/**
 * Issue 17's request fields through the fleet controller: the official
 * openai client against `continuum controller`'s front door (FleetService
 * over a WorkerHub, a real worker runtime behind a WorkerAgent on a
 * WebSocket) answers what the embedded default answers for the same seeded
 * requests — the offer carries the sampling fields, stop ids, priority,
 * log-probability requests and the output constraint to the worker, and the
 * tokens frames carry the log-probabilities back. The kernels are
 * batch-invariant, so equal means bit-equal.
 */

let cleanup: () => Promise<void>;
let model: LoadedModel;
let embedded: ApiHarness;
let workerRt: RuntimeFixture;
let hub: WorkerHub;
let service: FleetService;
let agent: WorkerAgent;
let frontDoor: ApiFrontDoor;
let fleet: OpenAI;
let local: OpenAI;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  embedded = await startApi(model);
  workerRt = await startRuntime(model);
  hub = new WorkerHub({ host: "127.0.0.1", port: 0, clusterSecret: "s", ttlMs: 60_000, log: silentLogger });
  const port = await hub.start();
  service = new FleetService(hub, null, null, {
    model: {
      id: "tiny",
      fingerprint: model.fingerprint,
      maxContext: model.config.spec.maxPosition,
      codec: textCodec(model),
    },
    chunkTokens: 128,
    limits: defaultAssignmentLimits,
    policy: { ...defaultRouterPolicy, heartbeatTtlMs: 60_000 },
    maxActive: 64,
    tickMs: 20,
    log: silentLogger,
  });
  agent = new WorkerAgent(workerRt.runtime, {
    workerId: "w1" as WorkerId,
    controllerUrl: `ws://127.0.0.1:${port}`,
    clusterSecret: "s",
    fingerprint: model.fingerprint,
    maxContext: model.config.spec.maxPosition,
    pageTokens: 16,
    chunkTokens: 128,
    kvBytesPerToken: 256,
    durableTiers: [],
    stopTokenIds: model.eosTokenIds,
    constraints: new ConstraintCompiler(model.tokenizer.tokenBytes()),
    heartbeatIntervalMs: 50,
    reconnectBaseMs: 20,
    reconnectMaxMs: 200,
    fenceMemory: 64,
    maxQueuedBytes: 1 << 20,
    log: silentLogger,
  });
  // Engine loaded: warm (heartbeats say ready, or the router drops it as warming).
  agent.markReady();
  agent.start();
  await agent.connected;
  const deadline = Date.now() + 30_000;
  while (![...hub.view.entries.values()].some((e) => e.heartbeat)) {
    if (Date.now() > deadline) throw new Error("no heartbeat from the worker");
    await new Promise((r) => setTimeout(r, 20));
  }
  const config = resolveConfig({ controller: { host: "127.0.0.1", httpPort: 0 } }, {});
  frontDoor = openFrontDoor({ config, service, models: [{ id: "tiny", dir: model.dir }], log: silentLogger });
  const fleetPort = await frontDoor.server.start();
  fleet = new OpenAI({ baseURL: `http://127.0.0.1:${fleetPort}/v1`, apiKey: "unused", maxRetries: 0 });
  local = new OpenAI({ baseURL: `${embedded.url}/v1`, apiKey: "unused", maxRetries: 0 });
}, 120_000);

afterAll(async () => {
  await frontDoor?.close();
  service?.close();
  await agent?.stop();
  await hub?.close();
  await workerRt?.close();
  await embedded?.close();
  await cleanup?.();
});

/** The parts of a response that must agree between the two (ids and timestamps differ). */
const comparable = (r: { choices: unknown[]; usage?: unknown }) => JSON.parse(JSON.stringify(r.choices));

describe("the fleet controller carries issue 17's fields to the worker", () => {
  it("sampling fields, logprobs and prompt scoring answer as the embedded default", async () => {
    const body = {
      model: "tiny",
      prompt: "The quick brown fox",
      max_tokens: 12,
      temperature: 0.9,
      seed: 11,
      logprobs: 3,
      echo: true,
      min_p: 0.05,
      repetition_penalty: 1.3,
      presence_penalty: 0.5,
      frequency_penalty: 0.2,
      logit_bias: { "50": 5 },
      min_tokens: 4,
      priority: 2,
      stop_token_ids: [7],
    } as OpenAI.CompletionCreateParamsNonStreaming;
    const [a, b] = await Promise.all([fleet.completions.create(body), local.completions.create(body)]);
    expect(comparable(a)).toEqual(comparable(b));
    const lp = a.choices[0]!.logprobs!;
    // echo with logprobs scores the prompt: its positions after the first carry values.
    expect(lp.token_logprobs!.filter((x) => x !== null).length).toBeGreaterThan(12);
    expect(lp.top_logprobs!.at(-1)!).toSatisfy((t: object) => Object.keys(t).length >= 3);
    expect(a.usage).toEqual(b.usage);
  }, 60_000);

  it("streamed chat logprobs and a JSON-schema constraint answer as the embedded default", async () => {
    const schema = {
      type: "object",
      properties: { name: { type: "string", maxLength: 6 }, n: { type: "integer" } },
      required: ["name", "n"],
      additionalProperties: false,
    };
    const body = {
      model: "tiny",
      messages: [{ role: "user" as const, content: "Give me JSON" }],
      max_tokens: 60,
      temperature: 1,
      seed: 5,
      logprobs: true,
      top_logprobs: 2,
      response_format: { type: "json_schema" as const, json_schema: { name: "x", schema } },
      stream: true as const,
    };
    const collect = async (c: OpenAI) => {
      let text = "";
      const lps: unknown[] = [];
      for await (const chunk of await c.chat.completions.create(body)) {
        text += chunk.choices[0]?.delta?.content ?? "";
        lps.push(...(chunk.choices[0]?.logprobs?.content ?? []));
      }
      return { text, lps };
    };
    const [a, b] = await Promise.all([collect(fleet), collect(local)]);
    expect(a).toEqual(b);
    const parsed = JSON.parse(a.text) as { name: string; n: number };
    expect(typeof parsed.name).toBe("string");
    expect(Number.isInteger(parsed.n)).toBe(true);
    expect(a.lps.length).toBeGreaterThan(0);
  }, 60_000);

  it("a required tool call parses through the fleet", async () => {
    const r = await fleet.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Time?" }],
      tools: [
        {
          type: "function",
          function: { name: "get_time", parameters: { type: "object", properties: {} } },
        },
      ],
      tool_choice: "required",
      max_tokens: 60,
      seed: 3,
    });
    const call = r.choices[0]!.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.function.name).toBe("get_time");
    expect(JSON.parse(call.function.arguments)).toBeTypeOf("object");
  }, 60_000);
});
