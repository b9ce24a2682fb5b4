import { createConnection, createServer, type Server, type Socket } from "node:net";

/**
 * A slow or paused S3 for tests and the chaos runs: a TCP relay in front of
 * a real server that holds every byte while paused and forwards it, in
 * order, when resumed. Real sockets both ways. What it holds is bounded by
 * what the clients send during one pause (their own request bounds).
 */
export class PausableRelay {
  private paused = false;
  private readonly held: (() => void)[] = [];
  private readonly sockets = new Set<Socket>();
  private constructor(private readonly server: Server) {}

  static async start(target: URL): Promise<PausableRelay> {
    let self: PausableRelay | undefined;
    const server = createServer((client) => {
      const upstream = createConnection({ host: target.hostname, port: Number(target.port) });
      for (const s of [client, upstream]) {
        self!.sockets.add(s);
        s.on("close", () => self!.sockets.delete(s));
        s.on("error", () => undefined);
      }
      const pipe = (from: Socket, to: Socket) =>
        from.on("data", (d) => {
          if (self!.paused) self!.held.push(() => to.write(d));
          else to.write(d);
        });
      pipe(client, upstream);
      pipe(upstream, client);
      client.on("close", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
    });
    self = new PausableRelay(server);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    return self;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${(this.server.address() as { port: number }).port}`;
  }
  pause(): void {
    this.paused = true;
  }
  resume(): void {
    this.paused = false;
    for (const f of this.held.splice(0)) f();
  }
  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}
