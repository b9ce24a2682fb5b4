import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { afterAll, describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { ProposalMsg } from "../../../schema/catalog.ts";
import { encodeMessage } from "../../../schema/wire.ts";
import { collect, kafkaBrokers, leaseProposal, startWriter, uniqueTopics } from "../log-helpers.ts";

/**
 * catalog/WIRE.md promises that a third party reads catalog.tx with kcat and
 * any msgpack decoder. This runs the reader printed there, word for word but
 * for the broker address and topic name, against records our writer wrote to
 * the real broker. Debian's packages provide the tools (`kcat`,
 * `python3-msgpack`; .ci/run installs them); the shell puts /usr/bin first so
 * the python3 is the one that package serves.
 */
const WIRE = new URL("../../../catalog/WIRE.md", import.meta.url);
const SHELL_PATH = `/usr/bin:/bin:${process.env.PATH ?? ""}`;

function toolsPresent(): boolean {
  const kcat = spawnSync("kcat", ["-V"], { env: { ...process.env, PATH: SHELL_PATH } });
  const msgpack = spawnSync("python3", ["-c", "import msgpack"], {
    env: { ...process.env, PATH: SHELL_PATH },
  });
  return kcat.status === 0 && msgpack.status === 0;
}

/** The shell command under "one line per tx" in WIRE.md. */
function documentedReader(): string {
  const doc = readFileSync(WIRE, "utf8");
  const m = /# one line per tx, with kcat and Python's msgpack:\n([\s\S]*?)\n```/.exec(doc);
  if (!m) throw new Error("catalog/WIRE.md no longer prints the kcat reader");
  return m[1]!;
}

describe.skipIf(!toolsPresent())("the kcat + msgpack reader of catalog/WIRE.md (real Kafka)", () => {
  const topics = uniqueTopics();
  const cleanups: Array<() => Promise<void>> = [];
  afterAll(async () => {
    for (const c of cleanups.reverse()) await c();
  });

  it("prints every committed tx of packed records, in order", async () => {
    const reader = documentedReader();
    expect(reader).toContain("-b 127.0.0.1:9092 -t catalog.tx ");
    const log = await KafkaLog.open({ brokers: kafkaBrokers(), clientId: "wire-doc-test", topics });
    cleanups.push(() => log.close());
    cleanups.push(startWriter(log).stop);
    // Proposed in one turn, so they travel packed (a proposal batch, then tx batches).
    const n = 5;
    await Promise.all(
      Array.from({ length: n }, (_, i) =>
        log.propose(encodeMessage(ProposalMsg, leaseProposal(`doc-${i}`, `lease-${i}`))),
      ),
    );
    // Read back through our own reader first: then the commit markers are written and kcat (-e) sees all n.
    await collect(log, 0, n);

    const command = reader
      .replace("-b 127.0.0.1:9092", `-b ${kafkaBrokers()[0]}`)
      .replace("-t catalog.tx ", `-t ${topics.tx} `);
    const out = execFileSync("bash", ["-o", "pipefail", "-c", command], {
      env: { ...process.env, PATH: SHELL_PATH },
      encoding: "utf8",
      timeout: 60_000,
    });
    const lines = out.trim().split("\n");
    expect(lines).toHaveLength(n);
    lines.forEach((line, i) => {
      expect(line).toContain("'kind': 'catalog.tx'");
      expect(line).toContain(`'txNo': ${i + 1},`);
      expect(line).toContain(`'proposalId': 'doc-${i}'`);
    });
  }, 120_000);
});
