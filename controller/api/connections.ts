import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";

/**
 * Bounds on the HTTP server's connections, so silent, slow or piled-up
 * clients cannot hold the process's sockets and file descriptors:
 *
 * - a new connection must complete its first request's headers within
 *   `headersTimeoutMs`, or it is closed (silently: nothing was asked); later
 *   requests on a kept-alive connection get Node's `headersTimeout` (the same
 *   value: 408 and close);
 * - the whole request, headers and body, must arrive within
 *   `requestTimeoutMs` (Node's `requestTimeout`: 408 and close);
 * - a kept-alive connection with no request in flight is closed after
 *   `idleTimeoutMs` (Node's `keepAliveTimeout`);
 * - at most `maxConnections` are open. One more sheds the connection that
 *   has been idle longest (no request in flight); when every connection is
 *   busy, the new one is answered 503 with Retry-After and closed.
 *
 * A response being streamed is never timed out here: generation has its own
 * bounds. Sheds and refusals are counted and logged, at most one line per
 * second (with the count since the last line), so a flood cannot flood the log.
 */
export interface HttpBounds {
  readonly headersTimeoutMs: number;
  readonly requestTimeoutMs: number;
  readonly idleTimeoutMs: number;
  readonly maxConnections: number;
  /** Stream bytes a client may leave unread before it is cut off (completions.ts). */
  readonly maxUnsentBytes: number;
}

export const defaultHttpBounds: HttpBounds = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  idleTimeoutMs: 5_000,
  maxConnections: 1024,
  maxUnsentBytes: 4 * 1024 * 1024,
};

export const CONNECTION_CLOSE_REASONS = ["no_request", "shed_idle", "refused_full"] as const;
export type ConnectionCloseReason = (typeof CONNECTION_CLOSE_REASONS)[number];

interface Tracked {
  /** Requests received and not yet answered (more than one only with pipelining). */
  inFlight: number;
  /** Until the first request arrives: closes a connection that never sends one. */
  firstRequestTimer: NodeJS.Timeout | null;
}

/** How long a refused connection may linger to deliver its 503 before it is destroyed. */
const REFUSED_LINGER_MS = 1_000;
const LOG_INTERVAL_MS = 1_000;

const REFUSAL = (() => {
  const body = JSON.stringify({
    error: {
      message: "the server has too many open connections; retry shortly",
      type: "server_error",
      param: null,
      code: "too_many_connections",
    },
  });
  return (
    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n" +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`
  );
})();

export class ConnectionGuard {
  private readonly open = new Map<Socket, Tracked>();
  /** Connections with no request in flight, longest idle first (a Map keeps insertion order). */
  private readonly idle = new Map<Socket, true>();
  readonly closed: Record<ConnectionCloseReason, number> = { no_request: 0, shed_idle: 0, refused_full: 0 };
  private unlogged: Record<ConnectionCloseReason, number> = { no_request: 0, shed_idle: 0, refused_full: 0 };
  private lastLogAt = Number.NEGATIVE_INFINITY;
  private logTimer: NodeJS.Timeout | null = null;
  /** Connections answered 503 at the cap: their requests, if any arrive, are not served. */
  private readonly refused = new WeakSet<Socket>();

  constructor(
    server: Server,
    private readonly bounds: HttpBounds,
    private readonly log: (event: string, fields: Record<string, unknown>) => void,
  ) {
    if (bounds.headersTimeoutMs > bounds.requestTimeoutMs)
      throw new RangeError("controller.http.headersTimeoutMs must not exceed requestTimeoutMs");
    server.headersTimeout = bounds.headersTimeoutMs;
    server.requestTimeout = bounds.requestTimeoutMs;
    server.keepAliveTimeout = bounds.idleTimeoutMs;
    server.on("connection", (socket: Socket) => this.onConnection(socket));
    server.on("request", (req: IncomingMessage, res: ServerResponse) => this.onRequest(req, res));
  }

  /** How often Node should check header and request deadlines (its default, 30 s, is coarser than the bounds). */
  static checkIntervalMs(bounds: HttpBounds): number {
    return Math.max(50, Math.min(1_000, Math.floor(bounds.headersTimeoutMs / 4)));
  }

  get openConnections(): number {
    return this.open.size;
  }
  get idleConnections(): number {
    return this.idle.size;
  }

  private onConnection(socket: Socket): void {
    if (this.open.size >= this.bounds.maxConnections) {
      const oldest = this.idle.keys().next();
      if (oldest.done) {
        this.refuse(socket);
        return;
      }
      this.count("shed_idle");
      oldest.value.destroy();
      this.forget(oldest.value);
    }
    const t: Tracked = {
      inFlight: 0,
      firstRequestTimer: setTimeout(() => {
        this.count("no_request");
        socket.destroy();
      }, this.bounds.headersTimeoutMs),
    };
    this.open.set(socket, t);
    this.idle.set(socket, true);
    socket.once("close", () => this.forget(socket));
  }

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    const socket = req.socket;
    const t = this.open.get(socket);
    if (t === undefined) return;
    if (t.firstRequestTimer) clearTimeout(t.firstRequestTimer);
    t.firstRequestTimer = null;
    t.inFlight++;
    this.idle.delete(socket);
    res.once("close", () => {
      t.inFlight--;
      if (t.inFlight === 0 && this.open.has(socket)) this.idle.set(socket, true);
    });
  }

  /** Whether a socket was refused at the cap (the server must not answer its requests). */
  isRefused(socket: Socket): boolean {
    return this.refused.has(socket);
  }

  private refuse(socket: Socket): void {
    this.refused.add(socket);
    this.count("refused_full");
    socket.on("error", () => undefined);
    socket.end(REFUSAL);
    setTimeout(() => socket.destroy(), REFUSED_LINGER_MS).unref();
  }

  private forget(socket: Socket): void {
    const t = this.open.get(socket);
    if (t?.firstRequestTimer) clearTimeout(t.firstRequestTimer);
    this.open.delete(socket);
    this.idle.delete(socket);
  }

  private count(reason: ConnectionCloseReason): void {
    this.closed[reason]++;
    if (reason === "no_request") return; // routine (browsers pre-connect): counted, not logged
    this.unlogged[reason]++;
    if (this.logTimer) return;
    const wait = this.lastLogAt + LOG_INTERVAL_MS - performance.now();
    if (wait <= 0) this.flushLog();
    else this.logTimer = setTimeout(() => this.flushLog(), wait).unref();
  }

  private flushLog(): void {
    this.logTimer = null;
    this.lastLogAt = performance.now();
    this.log("http.connection_shed", {
      shedIdle: this.unlogged.shed_idle,
      refused: this.unlogged.refused_full,
      open: this.open.size,
      idle: this.idle.size,
      maxConnections: this.bounds.maxConnections,
    });
    this.unlogged = { no_request: 0, shed_idle: 0, refused_full: 0 };
  }

  /** Stops the log timer (the server closes its sockets itself). */
  close(): void {
    if (this.logTimer) clearTimeout(this.logTimer);
    this.logTimer = null;
  }
}
