import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import type { CheckpointOffer, RouteCheckpointer } from "../../../worker/pages/durable-hooks.ts";
import { collect, greedyRequest, prompt, startRuntime, tinyModel } from "./fixture.ts";

/**
 * The sequences' pages in the real runtime and engine: what a request leaves
 * cached when it ends, is cancelled or waits on a capture.
 */
let model: LoadedModel;
let cleanup: () => Promise<void>;
beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
});
afterAll(async () => {
  await cleanup();
});

const request = (id: string, tokens: number[], maxTokens: number) => greedyRequest(id, tokens, maxTokens);

/** A checkpoint hook that holds a capture of every offered prefix open until `finish()`, as a slow download would. */
class HeldCapture implements RouteCheckpointer {
  private readonly open: { offer: CheckpointOffer; id: number }[] = [];
  offer(o: CheckpointOffer): "queued" {
    this.open.push({ offer: o, id: o.pages.beginCapturePrefix(o.prefix, 0, o.prefix.length).id });
    return "queued";
  }
  get holding(): number {
    return this.open.length;
  }
  finish(): void {
    for (const { offer, id } of this.open.splice(0)) {
      offer.pages.endCapture(id as never);
      offer.released();
    }
  }
}

describe("sequence pages", () => {
  it("a request waiting for cached pages a capture reads is admitted as soon as the capture gives them back", async () => {
    const capture = new HeldCapture();
    // 24 pages: A leaves 18 cached, all read by the capture; B needs 19.
    const f = await startRuntime(model, { physicalPages: 24, checkpoint: capture });
    try {
      const a = await collect(f.runtime.submit(request("a", prompt(1, 300), 1)).events);
      expect(a.end).toMatchObject({ type: "end", reason: "length" });
      expect(capture.holding).toBe(1);
      expect(f.runtime.pages.evictablePages).toBe(0);
      const b = collect(f.runtime.submit(request("b", prompt(2, 300), 1)).events);
      // B cannot be admitted while the capture reads A's pages; nothing else will wake the loop.
      await new Promise((r) => setTimeout(r, 50));
      expect(f.runtime.stats()).toMatchObject({ waiting: 1, generatedTokens: 1 });
      capture.finish();
      expect((await b).end).toMatchObject({ type: "end", reason: "length" });
      expect(f.runtime.stats().evictedPages).toBeGreaterThan(0);
    } finally {
      capture.finish();
      await f.close();
    }
  });

  it("a cancelled request's computed pages stay cached for the next request with its prefix", async () => {
    const f = await startRuntime(model);
    try {
      const p = prompt(3, 200);
      const gen = f.runtime.submit(request("c1", p, 400));
      for await (const ev of gen.events) {
        // Cancel once decoding: every prompt page is sealed by then.
        if (ev.type === "token") gen.cancel();
      }
      const again = await collect(f.runtime.submit(request("c2", p, 1)).events);
      expect(again.end).toMatchObject({ type: "end", cachedTokens: Math.floor(199 / 16) * 16 });
      expect(f.runtime.pages.snapshot().reservedPages).toBe(0);
      f.runtime.pages.checkInvariants();
    } finally {
      await f.close();
    }
  });
});
