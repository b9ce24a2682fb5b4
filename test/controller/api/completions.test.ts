import { IncomingMessage, ServerResponse } from "node:http";
import { Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedService } from "../../../cli/embedded/service.ts";
import { Completions } from "../../../controller/api/completions.ts";
import { parseCompletionRequest } from "../../../controller/api/request.ts";
import { Counter, Histogram, LATENCY_BUCKETS_S } from "../../../controller/metrics.ts";
import { TenantId } from "../../../schema/ids.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { type RuntimeFixture, startRuntime, tinyModel } from "../../worker/runtime/fixture.ts";

/**
 * A stream whose reader stalls: output piles up in the process (the kernel's
 * socket buffers on loopback hold tens of MB, more than the tiny model can
 * generate, so the stall is played by a socket that accepts no write), and
 * once more than `maxUnsentBytes` wait the request is cancelled and its
 * connection destroyed. The runtime, service and ServerResponse are real.
 */

/** A socket whose writes never complete: a client that stopped reading. */
class StalledSocket extends Socket {
  override _write(_chunk: unknown, _enc: BufferEncoding, _done: (err?: Error | null) => void): void {}
}

let model: LoadedModel;
let cleanup: () => Promise<void>;
let rt: RuntimeFixture;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  rt = await startRuntime(model);
});
afterAll(async () => {
  await rt?.close();
  await cleanup?.();
});

describe("a client that stops reading its stream", () => {
  it("is cut off once its unread output passes the bound, and its choices are cancelled", async () => {
    const service = new EmbeddedService(rt.runtime, model, "tiny");
    const logs: Record<string, unknown>[] = [];
    const completions = new Completions(
      service,
      {
        ttft: new Histogram("a", "a", LATENCY_BUCKETS_S),
        itl: new Histogram("b", "b", LATENCY_BUCKETS_S),
        tokensOut: new Counter("c", "c"),
        promptTokens: new Counter("d", "d"),
      },
      (_level, event, fields) => logs.push({ event, ...fields }),
      16 * 1024,
    );
    const socket = new StalledSocket();
    const res = new ServerResponse(new IncomingMessage(socket));
    res.assignSocket(socket);
    const parsed = parseCompletionRequest({
      model: "tiny",
      prompt: "Once upon a time",
      n: 4,
      max_tokens: 1500,
      temperature: 1,
      seed: 3,
      stream: true,
    });
    let countedAs: string | null = null;
    await completions.run(
      { res, xRequestId: "slow-1", fromClient: true, countAs: (s) => (countedAs = s) },
      parsed,
      { ids: [model.tokenizer.encode("Once upon a time")], rendered: null },
      service.models()[0]!,
      TenantId("default"),
      performance.now(),
    );
    const cancelled = logs.find((l) => l.event === "request.cancelled");
    expect(cancelled?.reason).toBe("client_too_slow");
    expect(logs.some((l) => l.event === "request.done")).toBe(false);
    expect(countedAs).toBe("499");
    expect(socket.destroyed).toBe(true);
    expect(rt.runtime.stats().running).toBe(0);
  }, 60_000);
});
