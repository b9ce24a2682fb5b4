import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { type RawData, WebSocket, WebSocketServer } from "ws";
import {
  type Accept,
  type Cancel,
  CancelMessage,
  type Decline,
  type Heartbeat,
  type Offer,
  OfferMessage,
  type Result,
  type Tokens,
  workerToController,
} from "../../schema/control.ts";
import { WorkerId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { encodeMessage, WireError } from "../../schema/wire.ts";
import { disconnect, emptyView, expire, type HeartbeatView, observe } from "../heartbeat-view.ts";

/**
 * The heartbeat hub: the controller's WebSocket server for workers.
 *
 * One connection per worker. The upgrade request must carry a bearer token
 * (`Authorization: Bearer <token>`): a worker's own token (`workerTokens`,
 * worker id → token) or the shared cluster secret; otherwise it is refused
 * with 401 before a socket exists. A worker's own token pins the connection
 * to that worker: its first heartbeat must name it, and an upgrade whose
 * `x-continuum-worker` header names another worker is refused. The shared
 * secret admits only workers that have no token of their own, so a worker
 * holding the secret cannot speak for one that has a token. A refused upgrade
 * or a heartbeat naming a worker the credential does not admit changes
 * nothing (the real worker's connection and view entry stay as they were).
 *
 * Every frame must be one binary
 * wire message a worker may send (schema/control.ts); a text frame, a frame
 * that does not decode, a frame over `maxFrameBytes`, or a message naming
 * another worker than the one the connection is bound to closes the
 * connection and changes nothing (the frame is dropped whole).
 *
 * A connection binds to a worker id with its first heartbeat; an assignment
 * message before that closes it. A second connection for the same worker
 * replaces the first (the old one is closed, its worker is reported lost).
 *
 * Heartbeats feed a versioned view (controller/heartbeat-view.ts): an older
 * (epoch, sequence) is dropped; an observation expires after `ttlMs` (the
 * expiry sweep runs every ttlMs / 4) or at once when its connection closes.
 * Heartbeats are never written to the catalog.
 *
 * Sending is bounded: a connection whose socket buffers more than
 * `maxQueuedBytes` unsent bytes is too slow to be given work; it is closed
 * and `send` returns false, so the caller fails the assignment over.
 */

export interface HubOptions {
  readonly host: string;
  /** 0 picks a free port (see `port` after start). */
  readonly port: number;
  /** The cluster secret; empty (and no workerTokens): no authentication (a local, single-user setup). */
  readonly clusterSecret: string;
  /** Worker id → that worker's own token (controller.workerTokens). Tokens must be distinct and non-empty. */
  readonly workerTokens?: Readonly<Record<string, string>>;
  readonly ttlMs: number;
  /** Largest frame a worker may send (default 1 MiB: a full heartbeat is ≈ 330 KiB). */
  readonly maxFrameBytes?: number;
  /** Unsent bytes a connection may buffer before it is dropped as too slow (default 8 MiB). */
  readonly maxQueuedBytes?: number;
  /** At most this many worker connections at once (default 4,096). */
  readonly maxConnections?: number;
  readonly log: Logger;
  /** Milliseconds on a monotonic clock (injectable for tests). */
  readonly now?: () => number;
}

export type AssignmentMessage =
  | { readonly type: "accept"; readonly msg: Accept }
  | { readonly type: "decline"; readonly msg: Decline }
  | { readonly type: "tokens"; readonly msg: Tokens }
  | { readonly type: "result"; readonly msg: Result };

export interface HubListener {
  /** An assignment message from a live, bound connection. */
  onAssignment(message: AssignmentMessage): void;
  /** The worker's connection closed, was replaced, or its heartbeat expired. */
  onWorkerLost(workerId: WorkerId, reason: string): void;
}

export interface HubCounters {
  connections: number;
  refusedUpgrades: number;
  closedForBadFrames: number;
  heartbeatsAccepted: number;
  heartbeatsStale: number;
  expired: number;
  sendsRefused: number;
}

/** WebSocket close codes (RFC 6455 §7.4.1). */
const CLOSE_POLICY = 1008;
const CLOSE_BAD_DATA = 1007;
const CLOSE_TRY_AGAIN = 1013;
const CLOSE_GOING_AWAY = 1001;

const KIND_TO_TYPE: Readonly<Record<string, AssignmentMessage["type"]>> = {
  "control.accept": "accept",
  "control.decline": "decline",
  "control.tokens": "tokens",
  "control.result": "result",
};

/** The header a worker names itself in on the upgrade (checked against its token before a socket exists). */
export const WORKER_ID_HEADER = "x-continuum-worker";

/** What an accepted upgrade's credential admits. */
type Credential =
  /** A worker's own token: the connection may only ever speak for this worker. */
  | { readonly kind: "worker"; readonly workerId: WorkerId }
  /** The shared secret (or no authentication): any worker without a token of its own. */
  | { readonly kind: "shared" };

interface Conn {
  readonly socket: WebSocket;
  readonly remote: string;
  readonly credential: Credential;
  workerId: WorkerId | null;
}

/** sha256 of a token: lookups by digest, so the time a lookup takes says nothing about the token. */
function tokenDigest(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

export class WorkerHub {
  private server: WebSocketServer | null = null;
  private viewValue: HeartbeatView = emptyView;
  private readonly conns = new Set<Conn>();
  private readonly byWorker = new Map<WorkerId, Conn>();
  private sweep: NodeJS.Timeout | null = null;
  private listener: HubListener | null = null;
  private readonly now: () => number;
  private readonly maxFrameBytes: number;
  private readonly maxQueuedBytes: number;
  private readonly maxConnections: number;
  /** Digest of each worker's own token → that worker. */
  private readonly tokenOwners = new Map<string, WorkerId>();
  /** Workers that have a token of their own (the shared secret does not admit them). */
  private readonly tokenHolders = new Set<WorkerId>();
  /** Credentials of upgrades accepted by verifyClient, read once by accept(). */
  private readonly credentials = new WeakMap<IncomingMessage, Credential>();
  readonly counters: HubCounters = {
    connections: 0,
    refusedUpgrades: 0,
    closedForBadFrames: 0,
    heartbeatsAccepted: 0,
    heartbeatsStale: 0,
    expired: 0,
    sendsRefused: 0,
  };
  private boundPort = 0;

  constructor(private readonly opts: HubOptions) {
    if (!(opts.ttlMs > 0)) throw new RangeError(`heartbeat TTL must be > 0 ms, got ${opts.ttlMs}`);
    this.now = opts.now ?? (() => performance.now());
    this.maxFrameBytes = opts.maxFrameBytes ?? 1 << 20;
    this.maxQueuedBytes = opts.maxQueuedBytes ?? 8 << 20;
    this.maxConnections = opts.maxConnections ?? 4096;
    const secretDigest = opts.clusterSecret === "" ? null : tokenDigest(opts.clusterSecret);
    for (const [id, token] of Object.entries(opts.workerTokens ?? {})) {
      if (id === "") throw new RangeError("controller.workerTokens: a worker id is empty");
      if (token === "") throw new RangeError(`controller.workerTokens.${id}: the token is empty`);
      const digest = tokenDigest(token);
      const other = this.tokenOwners.get(digest);
      if (other !== undefined)
        throw new RangeError(`controller.workerTokens: ${other} and ${id} have the same token`);
      if (digest === secretDigest)
        throw new RangeError(`controller.workerTokens.${id}: the token equals auth.clusterSecret`);
      this.tokenOwners.set(digest, WorkerId(id));
      this.tokenHolders.add(WorkerId(id));
    }
  }

  /** True when no credential is asked for: no cluster secret and no worker tokens. */
  private get open(): boolean {
    return this.opts.clusterSecret === "" && this.tokenOwners.size === 0;
  }

  /** The heartbeat view now (expired observations already swept at the last sweep). */
  get view(): HeartbeatView {
    return this.viewValue;
  }

  get port(): number {
    return this.boundPort;
  }

  /** Milliseconds on the hub's clock (the view's time base). */
  nowMs(): number {
    return this.now();
  }

  setListener(listener: HubListener): void {
    this.listener = listener;
  }

  /** Workers with an open, bound connection. */
  connectedWorkers(): WorkerId[] {
    return [...this.byWorker.keys()].sort();
  }

  async start(): Promise<number> {
    if (this.server) throw new Error("hub already started");
    const server = new WebSocketServer({
      host: this.opts.host,
      port: this.opts.port,
      maxPayload: this.maxFrameBytes,
      perMessageDeflate: false,
      verifyClient: (info, done) => {
        const why = this.refuse(info.req);
        if (why === null) return done(true);
        this.counters.refusedUpgrades++;
        this.opts.log.log("warn", "hub.upgrade_refused", {
          remote: info.req.socket.remoteAddress,
          reason: why.reason,
        });
        done(false, why.status, why.reason);
      },
    });
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("listening", resolve);
      server.once("error", reject);
    });
    server.on("error", (err) => this.opts.log.log("error", "hub.error", { message: err.message }));
    server.on("connection", (socket, req) => this.accept(socket, req));
    this.boundPort = (server.address() as { port: number }).port;
    const every = Math.max(10, Math.floor(this.opts.ttlMs / 4));
    this.sweep = setInterval(() => this.expireNow(), every);
    this.opts.log.log("info", "hub.listening", { host: this.opts.host, port: this.boundPort });
    if (this.open) {
      this.opts.log.log("warn", "hub.unauthenticated", {
        message: "auth.clusterSecret is empty: any process that reaches this port can join as a worker",
      });
    }
    return this.boundPort;
  }

  /** Closes every connection and the server. */
  async close(): Promise<void> {
    if (this.sweep) clearInterval(this.sweep);
    this.sweep = null;
    const server = this.server;
    this.server = null;
    if (!server) return;
    // Closing is not a loss the owner must act on: nothing is reported from here on.
    this.listener = null;
    for (const c of this.conns) c.socket.close(CLOSE_GOING_AWAY, "controller stopping");
    // Sockets that do not finish the closing handshake promptly are cut.
    const cut = setTimeout(() => {
      for (const c of this.conns) c.socket.terminate();
    }, 1000);
    await new Promise<void>((resolve) => server.close(() => resolve()));
    clearTimeout(cut);
  }

  /** Offers an assignment; false when the worker cannot be reached (see `sendTo`). */
  sendOffer(workerId: WorkerId, offer: Offer): boolean {
    return this.sendTo(workerId, () => encodeMessage(OfferMessage, offer));
  }

  /** Cancels (fences) an attempt on a worker; false when the worker cannot be reached. */
  sendCancel(workerId: WorkerId, cancel: Cancel): boolean {
    return this.sendTo(workerId, () => encodeMessage(CancelMessage, cancel));
  }

  /**
   * Sends one message to a worker's current connection. False when the worker
   * has no open connection or its send queue is over the bound (it is then
   * closed and reported lost).
   */
  private sendTo(workerId: WorkerId, encode: () => Uint8Array): boolean {
    const conn = this.byWorker.get(workerId);
    if (!conn || conn.socket.readyState !== WebSocket.OPEN) {
      this.counters.sendsRefused++;
      return false;
    }
    if (conn.socket.bufferedAmount > this.maxQueuedBytes) {
      this.counters.sendsRefused++;
      this.drop(conn, CLOSE_TRY_AGAIN, `send queue over ${this.maxQueuedBytes} bytes`);
      return false;
    }
    conn.socket.send(encode(), { binary: true });
    return true;
  }

  /** Sweeps expired observations now (also runs on a timer); returns the workers that expired. */
  expireNow(): WorkerId[] {
    const { view, expired } = expire(this.viewValue, this.now(), this.opts.ttlMs);
    this.viewValue = view;
    for (const id of expired) {
      this.counters.expired++;
      this.opts.log.log("warn", "hub.heartbeat_expired", { workerId: id, ttlMs: this.opts.ttlMs });
      const conn = this.byWorker.get(id);
      // A connection that stopped heartbeating is hung: it is given no more work.
      if (conn) this.drop(conn, CLOSE_TRY_AGAIN, "heartbeat expired");
      else this.listener?.onWorkerLost(id, "heartbeat expired");
    }
    return expired;
  }

  // ---- connections -----------------------------------------------------------

  /** Null when the upgrade may proceed (its credential is then remembered for accept()). */
  private refuse(req: IncomingMessage): { status: number; reason: string } | null {
    if (this.conns.size >= this.maxConnections) {
      return { status: 503, reason: `at most ${this.maxConnections} worker connections` };
    }
    const header = req.headers[WORKER_ID_HEADER];
    let named: WorkerId | undefined;
    try {
      named = header === undefined ? undefined : WorkerId(header);
    } catch {
      return { status: 400, reason: `${WORKER_ID_HEADER} must name one worker` };
    }
    const credential = this.credentialOf(req);
    if (credential === null) return { status: 401, reason: "missing or unknown bearer token" };
    if (named !== undefined) {
      const wrong = this.admits(credential, named);
      if (wrong !== null) return { status: 401, reason: wrong };
    }
    this.credentials.set(req, credential);
    return null;
  }

  /** The credential a request's bearer token is; null when it is missing or matches nothing. */
  private credentialOf(req: IncomingMessage): Credential | null {
    if (this.open) return { kind: "shared" };
    const header = req.headers.authorization;
    if (typeof header !== "string" || !header.startsWith("Bearer ")) return null;
    const token = header.slice("Bearer ".length);
    const owner = this.tokenOwners.get(tokenDigest(token));
    if (owner !== undefined) return { kind: "worker", workerId: owner };
    const secret = this.opts.clusterSecret;
    if (secret === "") return null;
    const given = Buffer.from(tokenDigest(token), "hex");
    return timingSafeEqual(given, Buffer.from(tokenDigest(secret), "hex")) ? { kind: "shared" } : null;
  }

  /** Null when the credential may speak for `workerId`; otherwise why not. */
  private admits(credential: Credential, workerId: WorkerId): string | null {
    if (credential.kind === "worker") {
      return credential.workerId === workerId ? null : `the token is not ${workerId}'s`;
    }
    return this.tokenHolders.has(workerId) ? `${workerId} must present its own token` : null;
  }

  private accept(socket: WebSocket, req: IncomingMessage): void {
    const credential = this.credentials.get(req);
    this.credentials.delete(req);
    if (credential === undefined) {
      // verifyClient runs before every accepted upgrade; a socket without a credential is a bug.
      this.opts.log.log("error", "hub.bug", { message: "an upgrade was accepted without a credential" });
      socket.terminate();
      return;
    }
    const conn: Conn = {
      socket,
      remote: `${req.socket.remoteAddress}:${req.socket.remotePort}`,
      credential,
      workerId: null,
    };
    this.conns.add(conn);
    this.counters.connections++;
    socket.on("message", (data, isBinary) => this.onFrame(conn, data, isBinary));
    socket.on("close", (code, reason) => this.onClose(conn, code, reason.toString()));
    socket.on("error", (err) => {
      // ws reports oversized frames here (and closes with 1009).
      this.opts.log.log("warn", "hub.socket_error", {
        remote: conn.remote,
        workerId: conn.workerId,
        message: err.message,
      });
    });
  }

  private onFrame(conn: Conn, data: RawData, isBinary: boolean): void {
    if (!this.conns.has(conn)) return;
    if (!isBinary) {
      this.badFrame(conn, CLOSE_BAD_DATA, "text frames are not accepted");
      return;
    }
    const bytes = Array.isArray(data)
      ? Buffer.concat(data)
      : data instanceof ArrayBuffer
        ? new Uint8Array(data)
        : data;
    let decoded: ReturnType<typeof workerToController.decode>;
    try {
      decoded = workerToController.decode(bytes);
    } catch (err) {
      if (err instanceof WireError) {
        this.badFrame(conn, CLOSE_BAD_DATA, err.message);
        return;
      }
      throw err;
    }
    if (decoded.kind === "control.heartbeat") {
      this.onHeartbeat(conn, decoded.message as Heartbeat);
      return;
    }
    const msg = decoded.message as Accept | Decline | Tokens | Result;
    if (conn.workerId === null) {
      this.badFrame(conn, CLOSE_POLICY, `${decoded.kind} before the first heartbeat`);
      return;
    }
    if (msg.workerId !== conn.workerId) {
      this.badFrame(conn, CLOSE_POLICY, `message names ${msg.workerId} on ${conn.workerId}'s connection`);
      return;
    }
    if (this.byWorker.get(conn.workerId) !== conn) return; // replaced: its messages no longer count
    this.listener?.onAssignment({ type: KIND_TO_TYPE[decoded.kind]!, msg } as AssignmentMessage);
  }

  private onHeartbeat(conn: Conn, hb: Heartbeat): void {
    if (conn.workerId !== null && hb.workerId !== conn.workerId) {
      this.badFrame(conn, CLOSE_POLICY, `heartbeat names ${hb.workerId} on ${conn.workerId}'s connection`);
      return;
    }
    if (conn.workerId === null) {
      const refused = this.admits(conn.credential, hb.workerId);
      if (refused !== null) {
        this.badFrame(conn, CLOSE_POLICY, `heartbeat names ${hb.workerId}: ${refused}`);
        return;
      }
      const prev = this.byWorker.get(hb.workerId);
      conn.workerId = hb.workerId;
      this.byWorker.set(hb.workerId, conn);
      this.opts.log.log("info", "hub.worker_connected", { workerId: hb.workerId, remote: conn.remote });
      if (prev) {
        // The worker dropped whatever the old connection carried: its attempts are lost.
        this.drop(prev, CLOSE_POLICY, "replaced by a newer connection of the same worker");
        this.listener?.onWorkerLost(hb.workerId, "reconnected: work of the old connection is gone");
      }
    }
    const { view, outcome } = observe(this.viewValue, hb, this.now());
    this.viewValue = view;
    if (outcome === "accepted") this.counters.heartbeatsAccepted++;
    else this.counters.heartbeatsStale++;
  }

  private badFrame(conn: Conn, code: number, reason: string): void {
    this.counters.closedForBadFrames++;
    this.opts.log.log("warn", "hub.bad_frame", { remote: conn.remote, workerId: conn.workerId, reason });
    this.drop(conn, code, reason);
  }

  /**
   * Closes a connection and forgets it at once (so nothing more it sends
   * counts); if it was its worker's current connection the worker is lost.
   */
  private drop(conn: Conn, code: number, reason: string, lost = true): void {
    if (!this.conns.delete(conn)) return;
    // Close reasons are limited to 123 bytes.
    conn.socket.close(code, reason.slice(0, 120));
    const cut = setTimeout(() => conn.socket.terminate(), 1000);
    cut.unref();
    this.forget(conn, reason, lost);
  }

  private onClose(conn: Conn, code: number, reason: string): void {
    if (!this.conns.delete(conn)) return;
    this.forget(conn, `connection closed (${code}${reason ? ` ${reason}` : ""})`, true);
  }

  private forget(conn: Conn, reason: string, lost: boolean): void {
    const id = conn.workerId;
    if (id === null || this.byWorker.get(id) !== conn) return;
    this.byWorker.delete(id);
    this.viewValue = disconnect(this.viewValue, id);
    this.opts.log.log("warn", "hub.worker_lost", { workerId: id, reason });
    if (lost) this.listener?.onWorkerLost(id, reason);
  }
}
