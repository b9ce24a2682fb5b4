import { readFileSync } from "node:fs";
import { createServer } from "node:net";

/**
 * Ports for servers that a test starts in another process (a broker, an S3
 * server, a worker's peer listener): picked here, bound there later.
 *
 * Why not the kernel's pick (listen on 0, close, hand the number on): that
 * port comes from the ephemeral range, the same range the kernel draws the
 * local port of every outgoing connection from. Between the pick and the
 * child's bind, any client in the run (kafkajs, the S3 SDK, fetch) may
 * connect out from exactly that port, and the child then fails to bind. With
 * a few hundred connections per suite that is a rare but real flake. So ports
 * are drawn at random below the ephemeral range, where no outgoing connection
 * lands, checked bindable, and never handed out twice by one process.
 *
 * Bounds: at most MAX_TRIES draws per call; the range holds BAND ports.
 */

/** Ports drawn below the ephemeral range. */
const BAND = 12_000;
/** Lowest port ever drawn (above the well-known and registered services most hosts run). */
const FLOOR = 10_000;
const MAX_TRIES = 200;
const handedOut = new Set<number>();

/** The first port of the kernel's ephemeral range (Linux), else the IANA default. */
function ephemeralLow(): number {
  try {
    const [low] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/);
    const n = Number(low);
    if (Number.isInteger(n) && n > FLOOR + 1) return n;
  } catch {
    // not Linux: the IANA dynamic range starts at 49152
  }
  return 49_152;
}

const HIGH = ephemeralLow();
const LOW = Math.max(FLOOR, HIGH - BAND);

function canBind(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

/** `count` adjacent ports, the first returned, all free on 127.0.0.1 now and not handed out before. */
async function freeRun(count: number): Promise<number> {
  for (let i = 0; i < MAX_TRIES; i++) {
    const port = LOW + Math.floor(Math.random() * (HIGH - LOW - count));
    const run = Array.from({ length: count }, (_, k) => port + k);
    if (run.some((p) => handedOut.has(p))) continue;
    let ok = true;
    for (const p of run) if (!(await canBind(p))) ok = false;
    if (!ok) continue;
    for (const p of run) handedOut.add(p);
    return port;
  }
  throw new Error(
    `no ${count} free adjacent port(s) in [${LOW}, ${HIGH}) on 127.0.0.1 after ${MAX_TRIES} tries`,
  );
}

/** A port free on 127.0.0.1, outside the ephemeral range. */
export function freePort(): Promise<number> {
  return freeRun(1);
}

/** A port P with P and P+1 free (a broker and its KRaft controller, or two workers' peer listeners). */
export function freePortPair(): Promise<number> {
  return freeRun(2);
}
