import { type RawData, WebSocket } from "ws";
import {
  type AdmissionLimits,
  type AdmissionState,
  admit,
  cancel as cancelAdmission,
  checkAdmission,
  complete,
  freshAdmission,
  type PagePool,
} from "../../schema/admission.ts";
import {
  AcceptMessage,
  type Cancel,
  controllerToWorker,
  DeclineMessage,
  type FinishReason,
  type Heartbeat,
  HeartbeatMessage,
  MAX_RESIDENT_PREFIXES,
  MAX_TOKENS_PER_FRAME,
  type Offer,
  ResultMessage,
  type StoreTier,
  TokensMessage,
  type WorkerStatus,
} from "../../schema/control.ts";
import {
  type ModelFingerprint,
  type PrefixHash,
  type RequestId,
  TokenCount,
  type WorkerId,
} from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { backoffMs } from "../../schema/retry.ts";
import { encodeMessage, MAX_MESSAGE_BYTES, type MessageKind, WireError } from "../../schema/wire.ts";
import { PageHashChain } from "../pages/page-hashes.ts";
import type { WorkerRuntime } from "../runtime/runtime.ts";
import { type RuntimeGeneration, SubmitError } from "../runtime/runtime-api.ts";
import type { ConstraintCompiler } from "../structured/constraint.ts";
import { declineReason, measuredTerms, newAttempt, type RunningAttempt, submitRequest } from "./attempt.ts";
import { buildHeartbeat, pagePool } from "./heartbeat.ts";
import { ResidentLedger } from "./resident-ledger.ts";

/**
 * The worker agent: the worker's end of the control plane. It keeps one
 * WebSocket to the controller (reconnecting with bounded exponential
 * backoff), sends heartbeats on an interval, and runs fenced assignments:
 *
 *   offer  → re-run admission (schema/admission.ts) against the runtime's real
 *            pages → accept (then submit, stream tokens, result) or decline;
 *   cancel → fence the attempt: its generation stops and nothing more of it
 *            is sent.
 *
 * Every message carries (requestId, attempt); an attempt older than the one
 * held for a request is declined or ignored. When the connection drops, every
 * running attempt is cancelled: the controller has already failed them over,
 * and anything they sent later would be fenced anyway.
 *
 * Heartbeats are versioned (epoch = process start in ms since the Unix epoch,
 * sequence + 1 per heartbeat), so the controller drops reordered ones and a
 * restarted process always supersedes its previous incarnation.
 */

export interface AgentOptions {
  readonly workerId: WorkerId;
  /** ws://host:port of the controller's worker socket. */
  readonly controllerUrl: string;
  /**
   * Sent as a bearer token on the upgrade request (empty: none): this worker's
   * own token (worker.token) or else the shared cluster secret.
   */
  readonly clusterSecret: string;
  readonly fingerprint: ModelFingerprint;
  readonly maxContext: number;
  readonly pageTokens: number;
  readonly chunkTokens: number;
  readonly kvBytesPerToken: number;
  readonly durableTiers: readonly StoreTier[];
  /** Tokens that end generation (the model's end-of-sequence ids) unless an offer names its own. */
  readonly stopTokenIds: readonly number[];
  /** Compiles an offer's output constraint against this worker's vocabulary. */
  readonly constraints: ConstraintCompiler;
  readonly heartbeatIntervalMs: number;
  /** First reconnect delay; doubles per failed attempt up to `reconnectMaxMs`. */
  readonly reconnectBaseMs: number;
  readonly reconnectMaxMs: number;
  /** Requests whose fenced attempt is remembered. */
  readonly fenceMemory: number;
  /** Unsent bytes on the socket before the connection is dropped as stuck. */
  readonly maxQueuedBytes: number;
  readonly log: Logger;
  /** The worker's own figures for operators, sent with each heartbeat (absent: none sent). */
  readonly status?: () => WorkerStatus;
}

export interface AgentCounters {
  connects: number;
  heartbeats: number;
  offers: number;
  accepted: number;
  declined: number;
  cancels: number;
  completed: number;
  failed: number;
  badFrames: number;
}

export class WorkerAgent {
  private socket: WebSocket | null = null;
  private stopped = false;
  private failures = 0;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private readonly epoch = Date.now();
  private sequence = 0;
  private admission: AdmissionState;
  private readonly limits: AdmissionLimits;
  private readonly running = new Map<RequestId, RunningAttempt>();
  private readonly ledger: ResidentLedger;
  private connectedOnce: (() => void) | null = null;
  /** Heartbeats say `ready` from markReady() on (warm start: cli/commands/worker.ts). */
  private ready = false;
  readonly connected: Promise<void>;
  readonly counters: AgentCounters = {
    connects: 0,
    heartbeats: 0,
    offers: 0,
    accepted: 0,
    declined: 0,
    cancels: 0,
    completed: 0,
    failed: 0,
    badFrames: 0,
  };

  constructor(
    private readonly runtime: WorkerRuntime,
    private readonly opts: AgentOptions,
  ) {
    if (!(opts.heartbeatIntervalMs > 0)) throw new RangeError("heartbeat interval must be > 0 ms");
    if (!(opts.reconnectBaseMs > 0 && opts.reconnectMaxMs >= opts.reconnectBaseMs))
      throw new RangeError("reconnect delays must satisfy 0 < base ≤ max");
    this.admission = freshAdmission(this.epoch);
    this.limits = {
      workerId: opts.workerId,
      modelFingerprint: opts.fingerprint,
      maxContext: TokenCount(opts.maxContext),
      pageTokens: opts.pageTokens,
      fenceMemory: opts.fenceMemory,
    };
    this.ledger = new ResidentLedger(
      opts.fingerprint,
      opts.pageTokens,
      opts.chunkTokens,
      MAX_RESIDENT_PREFIXES,
    );
    this.connected = new Promise((resolve) => {
      this.connectedOnce = resolve;
    });
  }

  start(): void {
    this.connect();
  }

  /**
   * The worker is warm: heartbeats say `ready` from now on (one goes at once),
   * and the controller starts offering it work. Before this the worker is
   * connected and visible, but receives no offer.
   */
  markReady(): void {
    if (this.ready) return;
    this.ready = true;
    this.sendHeartbeat();
  }

  get isReady(): boolean {
    return this.ready;
  }

  /** Stops reconnecting, cancels every running attempt and closes the socket. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.stopHeartbeats();
    this.fenceAll("the worker is stopping");
    const s = this.socket;
    this.socket = null;
    if (s && s.readyState !== WebSocket.CLOSED) {
      await new Promise<void>((resolve) => {
        const cut = setTimeout(() => {
          s.terminate();
          resolve();
        }, 1000);
        s.once("close", () => {
          clearTimeout(cut);
          resolve();
        });
        s.close(1001, "worker stopping");
      });
    }
  }

  // ---- connection ------------------------------------------------------------

  private connect(): void {
    if (this.stopped) return;
    // The worker names itself on the upgrade so a token of another worker is refused before a socket exists.
    const headers: Record<string, string> = { "x-continuum-worker": this.opts.workerId };
    if (this.opts.clusterSecret !== "") headers.authorization = `Bearer ${this.opts.clusterSecret}`;
    const socket = new WebSocket(this.opts.controllerUrl, {
      headers,
      maxPayload: MAX_MESSAGE_BYTES,
      perMessageDeflate: false,
      handshakeTimeout: 10_000,
    });
    this.socket = socket;
    socket.on("open", () => {
      this.failures = 0;
      this.counters.connects++;
      this.opts.log.log("info", "agent.connected", { url: this.opts.controllerUrl });
      this.sendHeartbeat();
      this.heartbeatTimer = setInterval(() => this.sendHeartbeat(), this.opts.heartbeatIntervalMs);
      this.connectedOnce?.();
      this.connectedOnce = null;
    });
    socket.on("message", (data, isBinary) => this.onFrame(socket, data, isBinary));
    socket.on("unexpected-response", (_req, res) => {
      // The controller refused the upgrade (e.g. 401: wrong secret). With this
      // listener ws leaves the handshake open: abort it, so "close" follows and
      // the agent retries with backoff (the controller's tokens may change).
      this.opts.log.log("error", "agent.refused", { status: res.statusCode, message: res.statusMessage });
      res.resume();
      socket.terminate();
    });
    socket.on("error", (err) => {
      this.opts.log.log("warn", "agent.socket_error", { message: err.message });
    });
    socket.on("close", (code, reason) => {
      if (this.socket !== socket) return;
      this.socket = null;
      this.stopHeartbeats();
      this.fenceAll(`connection closed (${code})`);
      if (this.stopped) return;
      // Bounded exponential backoff: base × 2^failures, at most max.
      const delay = backoffMs(
        { baseMs: this.opts.reconnectBaseMs, capMs: this.opts.reconnectMaxMs },
        this.failures + 1,
      );
      this.failures = Math.min(this.failures + 1, 30);
      this.opts.log.log("warn", "agent.disconnected", { code, reason: reason.toString(), retryInMs: delay });
      this.reconnectTimer = setTimeout(() => this.connect(), delay);
    });
  }

  private stopHeartbeats(): void {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = null;
  }

  /** Sends one message; false (and the connection is dropped) when the socket is stuck. */
  private send<T extends object>(kind: MessageKind<T>, body: T): boolean {
    const s = this.socket;
    if (!s || s.readyState !== WebSocket.OPEN) return false;
    if (s.bufferedAmount > this.opts.maxQueuedBytes) {
      this.opts.log.log("error", "agent.send_queue_full", { bytes: s.bufferedAmount });
      s.terminate();
      return false;
    }
    s.send(encodeMessage(kind, body), { binary: true });
    return true;
  }

  private onFrame(socket: WebSocket, data: RawData, isBinary: boolean): void {
    if (socket !== this.socket) return;
    let decoded: ReturnType<typeof controllerToWorker.decode>;
    try {
      if (!isBinary) throw new WireError("text frames are not accepted");
      const bytes = Array.isArray(data)
        ? Buffer.concat(data)
        : data instanceof ArrayBuffer
          ? new Uint8Array(data)
          : data;
      decoded = controllerToWorker.decode(bytes);
    } catch (err) {
      if (!(err instanceof WireError)) throw err;
      // The controller speaks another protocol: reconnecting is the only way to resync.
      this.counters.badFrames++;
      this.opts.log.log("error", "agent.bad_frame", { message: err.message });
      socket.close(1007, err.message.slice(0, 120));
      return;
    }
    if (decoded.kind === "control.offer") this.onOffer(decoded.message as Offer);
    else this.onCancel(decoded.message as Cancel);
  }

  // ---- heartbeats ------------------------------------------------------------

  /** The worker's observation now (also used by tests). */
  heartbeat(): Heartbeat {
    const o = this.opts;
    return buildHeartbeat(
      this.runtime,
      {
        workerId: o.workerId,
        epoch: this.epoch,
        sequence: ++this.sequence,
        fingerprint: o.fingerprint,
        maxContext: o.maxContext,
        pageTokens: o.pageTokens,
        kvBytesPerToken: o.kvBytesPerToken,
        durableTiers: o.durableTiers,
        ready: this.ready,
        ...(o.status ? { status: o.status } : {}),
      },
      this.admission.reservedPages,
      this.running.values(),
      this.ledger,
    );
  }

  private sendHeartbeat(): void {
    if (this.send(HeartbeatMessage, this.heartbeat())) this.counters.heartbeats++;
  }

  private pagePool(promptHashes: readonly PrefixHash[]): PagePool {
    return pagePool(this.runtime, this.admission.reservedPages, promptHashes);
  }

  // ---- assignments -----------------------------------------------------------

  private onOffer(offer: Offer): void {
    this.counters.offers++;
    const salt = offer.cacheSalt === "" ? undefined : offer.cacheSalt;
    const processed = offer.prompt.slice(0, Math.max(0, offer.prompt.length - 1));
    const hashes = new PageHashChain(this.opts.pageTokens, salt).extend(processed, processed.length);
    const pool = this.pagePool(hashes);
    const step = admit(this.admission, { ...offer, promptTokens: offer.prompt.length }, pool, this.limits);
    const fields = { requestId: offer.requestId, attempt: offer.attempt };
    if (step.decision.type === "decline") {
      this.counters.declined++;
      this.opts.log.log("info", "agent.declined", {
        ...fields,
        reason: step.decision.msg.reason,
        detail: step.decision.msg.detail,
      });
      this.send(DeclineMessage, step.decision.msg);
      return;
    }
    const held = this.running.get(offer.requestId);
    if (held && held.attempt === offer.attempt) {
      // A repeated offer of the attempt already running: answer again, start nothing.
      this.send(AcceptMessage, step.decision.msg);
      return;
    }
    this.admission = step.state;
    if (held) this.fence(held, `superseded by attempt ${offer.attempt}`);
    let generation: RuntimeGeneration;
    try {
      generation = this.runtime.submit(
        submitRequest(offer, salt, this.opts.stopTokenIds, (spec) => this.compile(spec)),
      );
    } catch (err) {
      if (!(err instanceof SubmitError)) throw err;
      this.admission = complete(this.admission, offer.requestId, offer.attempt, this.limits).state;
      const reason = declineReason(err.status);
      this.counters.declined++;
      this.opts.log.log("info", "agent.declined", { ...fields, reason, detail: err.message });
      this.send(DeclineMessage, { ...fields, workerId: this.opts.workerId, reason, detail: err.message });
      return;
    }
    checkAdmission(this.admission);
    const run = newAttempt(offer, generation, salt, pool.sharedPages, this.opts.pageTokens);
    this.running.set(offer.requestId, run);
    this.counters.accepted++;
    this.opts.log.log("info", "agent.accepted", {
      ...fields,
      reservedPages: step.decision.msg.reservedPages,
    });
    this.send(AcceptMessage, step.decision.msg);
    void this.pump(run);
  }

  /** An offer's constraint as this vocabulary's token machine; one it cannot compile is a 400 decline. */
  private compile(spec: NonNullable<Offer["constraint"]>) {
    try {
      return this.opts.constraints.machine(spec);
    } catch (err) {
      throw new SubmitError(400, `the output constraint does not compile: ${(err as Error).message}`);
    }
  }

  private onCancel(msg: Cancel): void {
    this.counters.cancels++;
    this.admission = cancelAdmission(this.admission, msg, this.limits).state;
    const run = this.running.get(msg.requestId);
    if (run && run.attempt <= msg.attempt) this.fence(run, `cancelled: ${msg.reason}`);
    this.opts.log.log("info", "agent.cancelled", {
      requestId: msg.requestId,
      attempt: msg.attempt,
      reason: msg.reason,
    });
  }

  /** Stops an attempt at once; its stream ends with "cancelled" and nothing more of it is sent. */
  private fence(run: RunningAttempt, why: string): void {
    if (run.fenced) return;
    run.fenced = true;
    run.generation.cancel();
    this.opts.log.log("info", "agent.fenced", { requestId: run.requestId, attempt: run.attempt, why });
  }

  private fenceAll(why: string): void {
    for (const run of this.running.values()) this.fence(run, why);
  }

  /** Streams one attempt's tokens (batched per event-loop turn) and then its result. */
  private async pump(run: RunningAttempt): Promise<void> {
    let finish: FinishReason = "error";
    let outcome: "completed" | "failed" = "failed";
    let reason = "";
    try {
      for await (const ev of run.generation.events) {
        if (ev.type === "token") {
          run.firstTokenAt ??= performance.now();
          run.generated.push(ev.token);
          if (run.fenced) continue;
          run.pending.push(ev.token);
          if (ev.logprob) run.pendingLogprobs?.push(ev.logprob);
          if (ev.promptLogprobs) run.promptLogprobs = ev.promptLogprobs;
          if (run.pending.length >= MAX_TOKENS_PER_FRAME) this.flush(run);
          else if (!run.flushScheduled) {
            run.flushScheduled = true;
            setImmediate(() => this.flush(run));
          }
        } else if (ev.type === "end") {
          finish = ev.reason;
          outcome = ev.reason === "cancelled" ? "failed" : "completed";
          reason = ev.reason === "cancelled" ? "cancelled" : "";
        } else {
          reason = ev.message;
        }
      }
    } catch (err) {
      reason = `stream failed: ${(err as Error).message}`;
    }
    this.flush(run);
    if (this.running.get(run.requestId) === run) this.running.delete(run.requestId);
    this.admission = complete(this.admission, run.requestId, run.attempt, this.limits).state;
    this.ledger.record([...run.prompt, ...run.generated], run.salt);
    if (outcome === "completed") this.counters.completed++;
    else this.counters.failed++;
    if (run.fenced) return;
    const ttft = run.firstTokenAt === null ? null : run.firstTokenAt - run.acceptedAt;
    this.send(ResultMessage, {
      requestId: run.requestId,
      attempt: run.attempt,
      workerId: this.opts.workerId,
      outcome,
      finishReason: finish,
      tokensTotal: run.sent,
      measuredTtftMs: ttft,
      ...(ttft === null ? {} : { measuredTerms: measuredTerms(ttft, run.generation.timing()) }),
      reason,
    });
    this.opts.log.log("info", "agent.result", {
      requestId: run.requestId,
      attempt: run.attempt,
      outcome,
      tokens: run.sent,
    });
    // Residency changed: tell the controller now rather than at the next tick.
    this.sendHeartbeat();
  }

  private flush(run: RunningAttempt): void {
    run.flushScheduled = false;
    if (run.fenced || run.pending.length === 0) {
      run.pending.length = 0;
      return;
    }
    const tokens = run.pending.splice(0, run.pending.length);
    const logprobs = run.pendingLogprobs?.splice(0, run.pendingLogprobs.length);
    const scores = run.promptLogprobs;
    run.promptLogprobs = null;
    this.send(TokensMessage, {
      requestId: run.requestId,
      attempt: run.attempt,
      workerId: this.opts.workerId,
      index: run.sent,
      tokens,
      ...(logprobs === undefined ? {} : { logprobs }),
      ...(scores === null ? {} : { promptLogprobs: scores }),
    });
    run.sent += tokens.length;
  }
}
