import { request } from "node:http";
import { connect, type Socket } from "node:net";

/**
 * The chaos runs' clients, on plain sockets (node:http, no keep-alive pool,
 * so a run leaves no connection of its own open on the server): one call,
 * one connection, one outcome, under a deadline that tells a hang from a
 * slow answer.
 */

export type Outcome =
  /** A 2xx whose body is complete (a non-streamed JSON answer, or a stream that ended with [DONE]). */
  | { readonly kind: "ok"; readonly status: number; readonly body: string; readonly ms: number }
  /** Ended with a reason the client can see: an HTTP error with a body, a refused or reset connection, a cut stream. */
  | { readonly kind: "failed"; readonly reason: string; readonly status?: number; readonly ms: number }
  /** No end within the deadline: what must never happen. */
  | { readonly kind: "hung"; readonly ms: number };

export interface Call {
  readonly url: string;
  readonly method: string;
  readonly path: string;
  readonly body?: string;
  readonly headers?: Record<string, string>;
  readonly deadlineMs: number;
}

/** One HTTP call. A 4xx/5xx is "failed" with reason `HTTP <status> <error.type>` (the body must name it). */
export function call(c: Call): Promise<Outcome> {
  const t0 = performance.now();
  const ms = () => performance.now() - t0;
  return new Promise((resolve) => {
    let settled = false;
    const done = (o: Outcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.destroy();
      resolve(o);
    };
    const u = new URL(c.path, c.url);
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname + u.search,
        method: c.method,
        agent: false,
        headers: {
          ...(c.body !== undefined ? { "content-type": "application/json" } : {}),
          ...c.headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (d: Buffer) => chunks.push(d));
        res.on("error", (err) => done({ kind: "failed", reason: `response: ${describe(err)}`, ms: ms() }));
        res.on("aborted", () =>
          done({ kind: "failed", reason: "response cut: connection closed", ms: ms() }),
        );
        res.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8");
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) {
            const streamed = (res.headers["content-type"] ?? "").includes("text/event-stream");
            if (streamed && !body.includes("data: [DONE]"))
              done({ kind: "failed", reason: streamError(body), status, ms: ms() });
            else done({ kind: "ok", status, body, ms: ms() });
            return;
          }
          done({ kind: "failed", reason: `HTTP ${status} ${errorType(body)}`, status, ms: ms() });
        });
      },
    );
    req.on("error", (err) => done({ kind: "failed", reason: describe(err), ms: ms() }));
    const timer = setTimeout(() => done({ kind: "hung", ms: ms() }), c.deadlineMs);
    if (c.body !== undefined) req.end(c.body);
    else req.end();
  });
}

function describe(err: unknown): string {
  const e = err as NodeJS.ErrnoException;
  return e.code ?? e.message ?? String(err);
}

/**
 * The OpenAI-style error type of an error body, marked "(internal error)"
 * when the server answered an exception it did not handle ("internal
 * error: …"), and "(no error body)" when it named no error at all: both
 * findings, unlike a failure the server explains (a worker lost mid-request).
 */
function errorType(body: string): string {
  try {
    const e = (JSON.parse(body) as { error?: { type?: unknown; message?: unknown } }).error;
    if (typeof e?.message === "string" && e.message !== "")
      return `${String(e.type ?? "error")}${e.message.startsWith("internal error") ? " (internal error)" : ""}`;
  } catch {
    // not JSON
  }
  return "(no error body)";
}

/** Why a 200 stream ended without [DONE]: its error event, or a cut connection. */
function streamError(body: string): string {
  const m = /"error":\{"message":"([^"]{0,80})/.exec(body);
  return m ? `stream error: ${m[1]}` : "stream cut before [DONE]";
}

/**
 * A slow client: the request head at once, then the body one byte every
 * `gapMs`. Resolves with how it ended: the server answered (its status),
 * closed the connection, or neither within `deadlineMs` after the last byte.
 */
export function slowCall(
  url: string,
  path: string,
  body: string,
  gapMs: number,
  deadlineMs: number,
): Promise<Outcome> {
  const t0 = performance.now();
  const u = new URL(url);
  return new Promise((resolve) => {
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    let tick: NodeJS.Timeout | undefined;
    const sock: Socket = connect({ host: u.hostname, port: Number(u.port) });
    let answer = "";
    const done = (o: Outcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearInterval(tick);
      sock.destroy();
      resolve(o);
    };
    const ms = () => performance.now() - t0;
    sock.on("error", (err) => done({ kind: "failed", reason: describe(err), ms: ms() }));
    sock.on("data", (d) => {
      answer += String(d);
      const m = /^HTTP\/1\.1 (\d{3})/.exec(answer);
      if (m && answer.includes("\r\n\r\n")) {
        const status = Number(m[1]);
        if (status < 300) done({ kind: "ok", status, body: answer, ms: ms() });
        else done({ kind: "failed", reason: `HTTP ${status}`, status, ms: ms() });
      }
    });
    sock.on("close", () => done({ kind: "failed", reason: "closed by the server", ms: ms() }));
    sock.on("connect", () => {
      const bytes = Buffer.from(body);
      sock.write(
        `POST ${path} HTTP/1.1\r\nhost: ${u.host}\r\ncontent-type: application/json\r\ncontent-length: ${bytes.length}\r\nconnection: close\r\n\r\n`,
      );
      let at = 0;
      tick = setInterval(() => {
        if (at >= bytes.length) {
          clearInterval(tick);
          timer = setTimeout(() => done({ kind: "hung", ms: ms() }), deadlineMs);
          return;
        }
        sock.write(bytes.subarray(at, at + 1));
        at++;
      }, gapMs);
    });
  });
}

/**
 * Idle connections: `n` sockets that connect and send nothing. `endedByServer`
 * counts those the server ended: closed (an idle timeout, a process killed)
 * or refused (while it was down); close() ends the rest.
 */
export class IdleConnections {
  private readonly sockets = new Set<Socket>();
  endedByServer = 0;
  private closing = false;

  open(url: string, n: number): void {
    const u = new URL(url);
    for (let i = 0; i < n; i++) {
      const s = connect({ host: u.hostname, port: Number(u.port) });
      this.sockets.add(s);
      s.on("error", () => undefined);
      s.on("close", () => {
        this.sockets.delete(s);
        if (!this.closing) this.endedByServer++;
      });
    }
  }

  get openCount(): number {
    return this.sockets.size;
  }

  close(): void {
    this.closing = true;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }
}
