import { timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { ContentId, InvalidIdError } from "../../schema/ids.ts";
import { encodeHeader, type VerifiedChunk } from "../store/chunk.ts";

/**
 * Serves this worker's local chunks (RAM, then SSD) to other workers, so a
 * chunk on a neighbour is one hop away instead of an S3 round trip.
 *
 *   GET /v1/chunks/<content id>
 *   Authorization: Bearer <auth.clusterSecret>
 *   Range: bytes=a-b        (optional, one range)
 *
 * The body is the chunk in the store's framing (worker/store/chunk.ts: CCK1
 * header, canonical metadata, payload), so the receiver verifies the content
 * id exactly as a tier read does. Status: 200 whole object, 206 a range, 401
 * without the secret, 404 absent here, 400 a malformed id, 416 an unsatisfiable
 * range. Bytes are read from a verifying tier read, so a corrupt local copy is
 * never served (it answers 404 and the reader falls back).
 *
 *   GET /ready              200 once the worker said it is warm and connected (markReady), 503 before:
 *                           an orchestrator's readiness probe; no secret, no data.
 *
 * Bounded: at most `maxConcurrent` reads in flight; more are answered 503.
 */
export interface PeerChunkReader {
  /** The verified chunk, or undefined when absent (or corrupt) here. */
  get(id: ContentId): Promise<VerifiedChunk | undefined>;
}

export interface PeerServerOptions {
  readonly host: string;
  /** 0: any free port. */
  readonly port: number;
  /** The cluster secret; empty refuses every request (a peer must authenticate). */
  readonly secret: string;
  readonly chunks: PeerChunkReader;
  readonly maxConcurrent?: number;
}

export class PeerServer {
  private inFlight = 0;
  private served = 0;
  private ready = false;

  private constructor(
    private readonly server: Server,
    private readonly opts: PeerServerOptions,
  ) {}

  static async start(opts: PeerServerOptions): Promise<PeerServer> {
    let self: PeerServer | undefined;
    const server = createServer((req, res) => {
      self!.handle(req, res).catch((err) => {
        if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
        res.end(`peer read failed: ${(err as Error).message}`);
      });
    });
    self = new PeerServer(server, opts);
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(opts.port, opts.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    return self;
  }

  /** host:port as published in the catalog (worker/address). */
  get address(): string {
    const a = this.server.address() as AddressInfo;
    return `${a.address}:${a.port}`;
  }

  /** The worker is warm (worker/warm/: model, tiers, catalog, engine step, registration) and connected: GET /ready answers 200 from now on. */
  markReady(): void {
    this.ready = true;
  }

  get stats(): { served: number; inFlight: number } {
    return { served: this.served, inFlight: this.inFlight };
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private authorized(req: IncomingMessage): boolean {
    const secret = this.opts.secret;
    if (secret === "") return false;
    const got = Buffer.from(req.headers.authorization ?? "", "utf8");
    const want = Buffer.from(`Bearer ${secret}`, "utf8");
    return got.length === want.length && timingSafeEqual(got, want);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const text = (status: number, body: string) => {
      res.writeHead(status, { "content-type": "text/plain" });
      res.end(body);
    };
    if (req.method !== "GET") return text(405, "only GET is served");
    if (req.url === "/ready") return this.ready ? text(200, "ready\n") : text(503, "warming up\n");
    if (!this.authorized(req)) return text(401, "missing or wrong cluster secret");
    const m = /^\/v1\/chunks\/([^/?]+)$/.exec(req.url ?? "");
    if (!m) return text(404, "no such path; GET /v1/chunks/<content id>");
    let id: ContentId;
    try {
      id = ContentId(m[1]);
    } catch (err) {
      if (err instanceof InvalidIdError) return text(400, err.message);
      throw err;
    }
    if (this.inFlight >= (this.opts.maxConcurrent ?? 16)) return text(503, "too many reads in flight");
    this.inFlight++;
    let chunk: VerifiedChunk | undefined;
    try {
      chunk = await this.opts.chunks.get(id).catch(() => undefined);
    } finally {
      this.inFlight--;
    }
    if (chunk === undefined) return text(404, `chunk ${id} is not held here`);
    const header = encodeHeader(chunk.metaJson, chunk.bytes.byteLength);
    const total = header.byteLength + chunk.metaJson.byteLength + chunk.bytes.byteLength;
    const range = parseRange(req.headers.range, total);
    if (range === "bad") {
      res.writeHead(416, { "content-range": `bytes */${total}` });
      res.end();
      return;
    }
    const [from, to] = range ?? [0, total - 1];
    const parts = [header, chunk.metaJson, chunk.bytes];
    res.writeHead(range ? 206 : 200, {
      "content-type": "application/octet-stream",
      "content-length": String(to - from + 1),
      "accept-ranges": "bytes",
      ...(range && { "content-range": `bytes ${from}-${to}/${total}` }),
    });
    // Write the slice [from, to] of header ‖ meta ‖ payload without joining them.
    let at = 0;
    for (const p of parts) {
      const a = Math.max(from, at);
      const b = Math.min(to + 1, at + p.byteLength);
      if (a < b) res.write(p.subarray(a - at, b - at));
      at += p.byteLength;
    }
    this.served++;
    res.end();
  }
}

/** One `bytes=a-b`, `bytes=a-` or `bytes=-n` range; undefined when absent, "bad" when unsatisfiable. */
export function parseRange(h: string | undefined, total: number): [number, number] | undefined | "bad" {
  if (h === undefined) return undefined;
  const m = /^bytes=(\d*)-(\d*)$/.exec(h.trim());
  if (!m || (m[1] === "" && m[2] === "")) return "bad";
  let from: number;
  let to: number;
  if (m[1] === "") {
    const n = Number(m[2]);
    if (n === 0) return "bad";
    from = Math.max(0, total - n);
    to = total - 1;
  } else {
    from = Number(m[1]);
    to = m[2] === "" ? total - 1 : Math.min(Number(m[2]), total - 1);
  }
  if (from > to || from >= total) return "bad";
  return [from, to];
}
