import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePortPair } from "../ports.ts";

/**
 * vitest global setup: a real Kafka broker for the suites that need one.
 *
 * If CONTINUUM_KAFKA_BROKERS is set, that cluster is used and nothing is
 * started. Otherwise deploy/kafka.sh starts a KRaft broker on a free port
 * (and the port above it for the controller) in a temporary directory,
 * polls it ready, creates the catalog topics, and exports
 * CONTINUUM_KAFKA_BROKERS to the test workers; teardown stops it and removes
 * the directory. The first run downloads the broker's jars from Maven Central
 * (bounded by START_TIMEOUT_MS).
 *
 * A run filtered to paths that cannot need Kafka (`vitest run test/unit`)
 * skips the broker, so narrow runs on a 2-core machine stay cheap: only
 * path-like filters (containing '/' or '.test') are read, and any of them that
 * mentions catalog, kafka, writer, e2e, cluster, fleet, restore, tail or
 * console starts it.
 */
const run = promisify(execFile);
const ROOT = new URL("../../", import.meta.url).pathname;
const START_TIMEOUT_MS = 15 * 60_000;
const NEEDS_KAFKA = /catalog|kafka|writer|e2e|cluster|fleet|restore|tail|console/i;

function needsKafka(argv: readonly string[]): boolean {
  const filters = argv.slice(2).filter((a) => !a.startsWith("-") && (a.includes("/") || a.includes(".test")));
  const paths = filters.filter((a) => !a.includes("node_modules") && !a.endsWith("vitest.mjs"));
  return paths.length === 0 || paths.some((a) => NEEDS_KAFKA.test(a));
}

/** Starts a broker with deploy/kafka.sh; returns its address and a stop function. */
export async function startBroker(
  port: number,
  dir: string,
): Promise<{ brokers: string; stop(): Promise<void> }> {
  const script = join(ROOT, "deploy/kafka.sh");
  try {
    await run(script, ["start", "--port", String(port), "--dir", dir], {
      cwd: ROOT,
      timeout: START_TIMEOUT_MS,
      maxBuffer: 16 << 20,
    });
  } catch (err) {
    // A broker that started but never became ready must not outlive the run.
    await run(script, ["stop", "--port", String(port), "--dir", dir], { cwd: ROOT, timeout: 60_000 }).catch(
      () => undefined,
    );
    throw err;
  }
  return {
    brokers: `127.0.0.1:${port}`,
    stop: async () => {
      await run(script, ["stop", "--port", String(port), "--dir", dir], { cwd: ROOT, timeout: 60_000 });
    },
  };
}

export default async function setup(): Promise<(() => Promise<void>) | undefined> {
  if (process.env.CONTINUUM_KAFKA_BROKERS) return undefined;
  if (!needsKafka(process.argv)) return undefined;
  const dir = await mkdtemp(join(tmpdir(), "continuum-kafka-"));
  const port = await freePortPair();
  let broker: Awaited<ReturnType<typeof startBroker>>;
  try {
    broker = await startBroker(port, dir);
  } catch (err) {
    const e = err as Error & { stderr?: string };
    throw new Error(`could not start the Kafka broker for the tests: ${e.message}\n${e.stderr ?? ""}`);
  }
  process.env.CONTINUUM_KAFKA_BROKERS = broker.brokers;
  return async () => {
    await broker.stop();
    await rm(dir, { recursive: true, force: true });
  };
}
