import { WebSocket } from "ws";
import type { TextCodec } from "../../../controller/api/service.ts";
import type { WorkerHub } from "../../../controller/fleet/hub.ts";
import {
  AcceptMessage,
  controllerToWorker,
  DeclineMessage,
  HeartbeatMessage,
  type Offer,
  ResultMessage,
  TokensMessage,
  type WorkerStatus,
} from "../../../schema/control.ts";
import { encodeMessage } from "../../../schema/wire.ts";
import { heartbeat, wid } from "../fixtures.ts";

/**
 * A fleet worker played by a raw WebSocket, for tests of the controller's
 * side: it records the offers it gets and declines, accepts or completes
 * them as the test says.
 */

/** A codec over token ids only (prompts are sent as ids). */
export const codec: TextCodec = {
  encode: () => [],
  decode: (ids) => ids.map((i) => String.fromCharCode(97 + (i % 26))).join(""),
  renderChat: () => "",
  tokenString: (id) => String(id),
  tokenBytes: () => null,
  checkConstraint: () => 0,
  toolParser: null,
  eosTokenIds: [],
  vocabSize: 1000,
};

export async function until(what: string, ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A worker played by a raw socket: it records the offers it gets and answers as told. */
export class FakeWorker {
  readonly offers: Offer[] = [];
  private seq = 0;
  private constructor(
    readonly id: string,
    readonly ws: WebSocket,
  ) {
    ws.on("message", (data) => {
      const m = controllerToWorker.decode(data as Buffer);
      if (m.kind === "control.offer") this.offers.push(m.message as Offer);
    });
  }

  /** Connects as `id` with the cluster secret and waits until the hub holds its first heartbeat. */
  static async connect(
    hub: WorkerHub,
    id: string,
    secret: string,
    sockets: WebSocket[],
  ): Promise<FakeWorker> {
    const ws = new WebSocket(`ws://127.0.0.1:${hub.port}`, {
      headers: { authorization: `Bearer ${secret}`, "x-continuum-worker": id },
    });
    sockets.push(ws);
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
    });
    const w = new FakeWorker(id, ws);
    w.heartbeat();
    await until(`${id}'s heartbeat`, () => hub.connectedWorkers().includes(wid(id)));
    return w;
  }

  heartbeat(status?: WorkerStatus): void {
    this.ws.send(
      encodeMessage(
        HeartbeatMessage,
        heartbeat(this.id, { sequence: ++this.seq, ...(status ? { status } : {}) }),
      ),
    );
  }
  decline(o: Offer): void {
    this.ws.send(
      encodeMessage(DeclineMessage, {
        requestId: o.requestId,
        attempt: o.attempt,
        workerId: wid(this.id),
        reason: "pages_short",
        detail: "test: no pages",
      }),
    );
  }
  accept(o: Offer): void {
    this.ws.send(
      encodeMessage(AcceptMessage, {
        requestId: o.requestId,
        attempt: o.attempt,
        workerId: wid(this.id),
        epoch: 1,
        reservedPages: 2 as never,
      }),
    );
  }
  /** Streams tokens of the offer without finishing it. */
  tokens(o: Offer, tokens: number[]): void {
    this.ws.send(
      encodeMessage(TokensMessage, {
        requestId: o.requestId,
        attempt: o.attempt,
        workerId: wid(this.id),
        index: 0,
        tokens,
      }),
    );
  }
  complete(o: Offer, tokens: number[]): void {
    this.tokens(o, tokens);
    this.ws.send(
      encodeMessage(ResultMessage, {
        requestId: o.requestId,
        attempt: o.attempt,
        workerId: wid(this.id),
        outcome: "completed",
        finishReason: "length",
        tokensTotal: tokens.length,
        measuredTtftMs: 1,
        reason: "",
      }),
    );
  }
}
