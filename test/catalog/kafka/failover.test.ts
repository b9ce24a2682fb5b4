import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, describe, expect, it } from "vitest";
import { CatalogDb } from "../../../catalog/db.ts";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { CatalogWriter } from "../../../catalog/writer.ts";
import { ProposalMsg, TxMsg, type TxRecord } from "../../../schema/catalog.ts";
import { createLogger } from "../../../schema/log.ts";
import { decodeMessage, encodeMessage } from "../../../schema/wire.ts";
import { freePortPair } from "../../ports.ts";
import { startBroker } from "../../setup/kafka.ts";
import { collect, kafkaBrokers, leaseProposal, uniqueTopics, within } from "../log-helpers.ts";

/**
 * Faults with real processes and a real broker: kill -9 of the active writer
 * process (the standby takes over), and a broker stop/start under a running
 * writer and reader. In both, every acknowledged proposal must appear in
 * catalog.tx exactly once, numbered without gaps. Every wait is bounded and,
 * when it runs out, names what it waited for and shows the writers' last log
 * lines.
 */

const ROOT = new URL("../../../", import.meta.url).pathname;
const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

/** How long one step of a case may take: generous for a loaded 2-core machine, well inside the case's timeout. */
const STEP_MS = 90_000;
/** Log lines kept per process for a failure's message. */
const KEPT_LINES = 400;

function keep(lines: string[], line: string): void {
  lines.push(line.length > 600 ? `${line.slice(0, 600)}…` : line);
  if (lines.length > KEPT_LINES) lines.splice(0, lines.length - KEPT_LINES);
}

interface WriterProcess {
  readonly child: ChildProcess;
  readonly events: string[];
  /** Its last KEPT_LINES stderr lines. */
  readonly lines: string[];
}

function explain(writers: readonly WriterProcess[]): () => string {
  return () =>
    writers
      .map((w) => `--- writer pid ${w.child.pid}: ${w.events.join(", ")}\n${w.lines.slice(-60).join("\n")}`)
      .join("\n");
}

/** Starts `continuum writer --config F` and records the event names of its JSON log lines (and the lines). */
function spawnWriter(configPath: string): WriterProcess {
  const child = spawn(process.execPath, ["bin/continuum.mjs", "writer", "--config", configPath], {
    cwd: ROOT,
    env: { ...process.env, CONTINUUM_LOG_LEVEL: "info" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const events: string[] = [];
  const lines: string[] = [];
  createInterface({ input: child.stderr! }).on("line", (line) => {
    keep(lines, line);
    try {
      const ev = (JSON.parse(line) as { event?: string }).event;
      if (ev) events.push(ev);
    } catch {
      // kafkajs or Node lines that are not ours.
    }
  });
  cleanups.push(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await new Promise((r) => child.once("exit", r));
    }
  });
  return { child, events, lines };
}

function checkExactlyOnce(txs: readonly TxRecord[], acked: ReadonlySet<string>): void {
  expect(txs.map((t) => t.txNo)).toEqual(Array.from({ length: txs.length }, (_, i) => i + 1));
  const ids = txs.map((t) => t.proposalId);
  expect(new Set(ids).size).toBe(ids.length);
  for (const id of acked) expect(ids).toContain(id);
}

describe("catalog writer faults (real Kafka, real processes)", () => {
  it("kill -9 of the active writer mid-stream: the standby takes over and every acknowledged proposal is in catalog.tx exactly once", async () => {
    const topics = uniqueTopics();
    const dir = await mkdtemp(join(tmpdir(), "continuum-failover-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const configPath = join(dir, "config.json");
    await writeFile(
      configPath,
      JSON.stringify({ catalog: { log: "kafka", brokers: kafkaBrokers(), clientId: "failover", topics } }),
    );
    const started: WriterProcess[] = [];
    const why = explain(started);
    const a = spawnWriter(configPath);
    started.push(a);
    await within(STEP_MS, "writer a active", () => a.events.includes("writer.active"), why);
    const b = spawnWriter(configPath);
    started.push(b);
    await within(STEP_MS, "writer b standby", () => b.events.includes("writer.standby"), why);

    const client = await KafkaLog.open({ brokers: kafkaBrokers(), clientId: "failover-client", topics });
    cleanups.push(() => client.close());
    const total = 2_000;
    const wave = 100;
    const acked = new Set<string>();
    let killed = false;
    for (let i = 0; i < total; i += wave) {
      await Promise.all(
        Array.from({ length: wave }, async (_, j) => {
          const id = `f-${i + j}`;
          await client.propose(encodeMessage(ProposalMsg, leaseProposal(id, `key-${i + j}`)));
          acked.add(id);
        }),
      );
      // Mid-stream whatever the machine's speed: once 600 are proposed, wait
      // for the active writer to have appended 300, then kill it while the
      // remaining 1,400 are still to come.
      if (!killed && i + wave >= 600) {
        await within(STEP_MS, "300 txs before the kill", async () => (await client.endOffset()) >= 300, why);
        a.child.kill("SIGKILL");
        killed = true;
      }
    }
    expect(killed).toBe(true);
    await within(STEP_MS, "writer b active", () => b.events.includes("writer.active"), why);
    await within(STEP_MS, `${total} txs`, async () => (await client.endOffset()) >= total, why);
    const txs = (await collect(client, 0, total)).map((r) => decodeMessage(TxMsg, r.bytes));
    expect(txs.length).toBe(total);
    checkExactlyOnce(txs, acked);
    expect(a.events).not.toContain("writer.failed");
    b.child.kill("SIGTERM");
    const code = await new Promise((r) => b.child.once("exit", r));
    expect(code).toBe(0);
  }, 180_000);

  it("broker stop and start: the writer and a tx reader reconnect and nothing acknowledged is lost", async () => {
    const port = await freePortPair();
    const dir = await mkdtemp(join(tmpdir(), "continuum-kafka-restart-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    let broker = await startBroker(port, dir);
    cleanups.push(() => broker.stop());
    const topics = uniqueTopics();
    const log = await KafkaLog.open({
      brokers: [broker.brokers],
      clientId: "restart",
      topics,
      logLevel: "nothing",
    });
    cleanups.push(() => log.close());
    const lines: string[] = [];
    const logger = createLogger({ level: "info", write: (l) => keep(lines, l) });
    const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger });
    const running = writer.run();
    const seen: TxRecord[] = [];
    const sub = await log.subscribe(0, async (records) => {
      for (const r of records) seen.push(decodeMessage(TxMsg, r.bytes));
    });
    const acked = new Set<string>();
    const proposeRange = async (from: number, to: number) => {
      await Promise.all(
        Array.from({ length: to - from }, async (_, j) => {
          const id = `r-${from + j}`;
          await log.propose(encodeMessage(ProposalMsg, leaseProposal(id, `key-${from + j}`)));
          acked.add(id);
        }),
      );
    };
    const why = () =>
      `seen ${seen.length}, acknowledged ${acked.size}; the writer's log:\n${lines.join("\n")}`;
    await proposeRange(0, 200);
    await within(STEP_MS, "200 txs seen", () => seen.length >= 200, why);

    await broker.stop();
    broker = await startBroker(port, dir);

    await proposeRange(200, 400);
    await within(STEP_MS, "400 txs seen after the restart", () => seen.length >= 400, why);
    checkExactlyOnce(seen, acked);
    expect(seen.length).toBe(400);
    await sub.stop();
    await writer.stop();
    await running;
  }, 240_000);

  it("two writer processes at once, the active one frozen and thawed twice: they never interleave — the thawed zombie is fenced, and every acknowledged proposal is in catalog.tx exactly once", async () => {
    const topics = uniqueTopics();
    const dir = await mkdtemp(join(tmpdir(), "continuum-zombie-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const configPath = join(dir, "config.json");
    await writeFile(
      configPath,
      JSON.stringify({ catalog: { log: "kafka", brokers: kafkaBrokers(), clientId: "zombie", topics } }),
    );
    // Started together: both race for the lease, as two `continuum writer` started by mistake would.
    const writers = [spawnWriter(configPath), spawnWriter(configPath)];
    const count = (w: WriterProcess, ev: string) => w.events.filter((e) => e === ev).length;
    // Active: its last role event is writer.active (a loss logs lease_lost, then standby).
    const isActive = (w: WriterProcess) =>
      w.events
        .filter((e) => e === "writer.active" || e === "writer.standby" || e === "writer.lease_lost")
        .at(-1) === "writer.active";
    const why = explain(writers);
    await within(STEP_MS, "an active writer", () => writers.some(isActive), why);
    await within(
      STEP_MS,
      "both writers through standby",
      () => writers.every((w) => w.events.includes("writer.standby")),
      why,
    );
    const client = await KafkaLog.open({ brokers: kafkaBrokers(), clientId: "zombie-client", topics });
    cleanups.push(() => client.close());
    const acked = new Set<string>();
    let next = 0;
    const wave = async () => {
      await Promise.all(
        Array.from({ length: 100 }, async () => {
          const id = `z-${next++}`;
          await client.propose(encodeMessage(ProposalMsg, leaseProposal(id, `key-${id}`)));
          acked.add(id);
        }),
      );
    };
    for (let round = 0; round < 2; round++) {
      await wave();
      await within(STEP_MS, `round ${round}: an active writer`, () => writers.some(isActive), why);
      const active = writers.find(isActive)!;
      const other = writers.find((w) => w !== active)!;
      const activations = count(other, "writer.active");
      // Frozen mid-stream: its session expires, the other takes over and fences it.
      active.child.kill("SIGSTOP");
      const during = wave();
      await within(
        STEP_MS,
        `round ${round}: the other writer takes over`,
        () => count(other, "writer.active") > activations,
        why,
      );
      await during;
      const lost = count(active, "writer.lease_lost");
      // Thawed: it finds itself fenced and goes back to standby instead of appending at its old position.
      active.child.kill("SIGCONT");
      await within(
        STEP_MS,
        `round ${round}: the thawed zombie notices its loss`,
        () => count(active, "writer.lease_lost") > lost,
        why,
      );
      await wave();
    }
    const total = next;
    await within(STEP_MS, `${total} txs`, async () => (await client.endOffset()) >= total, why);
    // A reader stops at a logical offset written twice (two writers interleaving): collect then fails.
    const txs = (await collect(client, 0, total)).map((r) => decodeMessage(TxMsg, r.bytes));
    expect(txs.length).toBe(total);
    checkExactlyOnce(txs, acked);
    expect(await client.endOffset()).toBe(total);
    for (const w of writers) expect(w.child.exitCode).toBeNull();
  }, 240_000);
});
