import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConsoleError, prepareEdn, runQuery } from "../../catalog/console.ts";
import { CatalogDb } from "../../catalog/db.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import { ProposalMsg } from "../../schema/catalog.ts";
import { silentLogger } from "../../schema/log.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { CatalogGen, randomCatalog } from "./gen.ts";

const run = promisify(execFile);
const BIN = new URL("../../bin/continuum.mjs", import.meta.url).pathname;

describe("console query preparation", () => {
  const { db } = randomCatalog(9, 300);
  const ddb = db.datalog();

  it("rewrites catalog keywords to attribute strings and leaves others alone", () => {
    expect(prepareEdn('[:find ?n :where [?c :chunk/node ?n] [(= ?n ":chunk/x")]]', "query")).toBe(
      '[:find ?n :where [?c "chunk/node" ?n] [(= ?n ":chunk/x")]]',
    );
    expect(prepareEdn("[:find (pull ?e [:db/id :model/name]) :where [?e :model/name]]", "query")).toBe(
      '[:find (pull ?e [:db/id "model/name"]) :where [?e "model/name"]]',
    );
  });

  it("answers a query with rules", () => {
    const rules =
      '[[(ready ?c ?w) [?r :replica/chunk ?c] [?r :replica/state "ready"] [?r :replica/worker ?we] [?we :worker/id ?w]]]';
    const viaRules = runQuery(ddb, "[:find ?c ?w :in $ % :where (ready ?c ?w)]", rules) as unknown[];
    const direct = runQuery(
      ddb,
      '[:find ?c ?w :where [?r :replica/chunk ?c] [?r :replica/state "ready"] [?r :replica/worker ?we] [?we :worker/id ?w]]',
    ) as unknown[];
    expect(viaRules.length).toBeGreaterThan(0);
    expect(new Set(viaRules.map((x) => JSON.stringify(x)))).toEqual(
      new Set(direct.map((x) => JSON.stringify(x))),
    );
  });

  it("names an unknown attribute, a parse error and a misuse clearly", () => {
    expect(() => runQuery(ddb, "[:find ?n :where [?c :chunk/nod ?n]]")).toThrow(
      /^unknown attribute :chunk\/nod; chunk has :chunk\/node .*:chunk\/created$/,
    );
    expect(() => runQuery(ddb, "[:find ?n :where [?c :chunk/node ?n]")).toThrow(
      /^parse error: query ends before '\]'$/,
    );
    expect(() => runQuery(ddb, "[:find ?n :where [?c :chunk/node ?n)]")).toThrow(
      /^parse error: unexpected '\)' at character 36 \(expected '\]'\)$/,
    );
    expect(() => runQuery(ddb, "hello")).toThrow(/^parse error: a query is an EDN vector/);
    expect(() => runQuery(ddb, "[:find ?n :where [?c :chunk/node ?x]]")).toThrow(ConsoleError);
    expect(() => runQuery(ddb, "[:find ?c :where (ready ?c)]", "[[(ready ?c) [?c :chunk/node _]]]")).toThrow(
      /rules given but the query has no % in its :in clause/,
    );
    expect(() => runQuery(ddb, '[:find ?n :where [?c :chunk/node ?n] [(= ?n "x]]')).toThrow(
      /parse error: unterminated string/,
    );
  });
});

describe("continuum console and tail (real processes on an embedded log file)", () => {
  let dir: string;
  let logPath: string;
  let accepted = 0;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "continuum-console-test-"));
    logPath = join(dir, "embedded.log");
    const log = await EmbeddedLog.open({ path: logPath });
    const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
    const running = writer.run();
    const gen = new CatalogGen(21);
    const ps = [gen.setup()];
    for (let i = 0; i < 200; i++) ps.push(gen.next());
    await Promise.all(ps.map((p) => log.propose(encodeMessage(ProposalMsg, p))));
    while (log.proposalsEnd() < ps.length || (await log.endOffset()) + countRejections(log) < ps.length)
      await new Promise((r) => setTimeout(r, 20));
    accepted = await log.endOffset();
    await writer.stop();
    await running;
    await log.close();
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const cli = (...args: string[]) =>
    run(process.execPath, [BIN, ...args], { encoding: "utf8" }).then(
      (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
      (e: { code: number; stdout: string; stderr: string }) => ({
        code: e.code,
        stdout: e.stdout,
        stderr: e.stderr,
      }),
    );

  it("answers -e with --json", async () => {
    const r = await cli(
      "console",
      "--log",
      logPath,
      "--json",
      "-e",
      "[:find (count ?c) . :where [?c :chunk/node]]",
    );
    expect(r.code).toBe(0);
    const n = JSON.parse(r.stdout.trim().split("\n").pop()!) as number;
    expect(n).toBeGreaterThan(10);
  });

  it("prints a clear error and no stack trace for an unknown attribute or a parse error", async () => {
    const bad = await cli("console", "--log", logPath, "-e", "[:find ?x :where [?c :replica/tierz ?x]]");
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/^continuum console: unknown attribute :replica\/tierz; replica has /);
    expect(bad.stderr).not.toMatch(/\n\s+at /);
    const parse = await cli("console", "--log", logPath, "-e", "[:find ?x :where [?c :chunk/node ?x]");
    expect(parse.code).toBe(1);
    expect(parse.stderr.trim()).toBe("continuum console: parse error: query ends before ']'");
    const missing = await cli(
      "console",
      "--log",
      join(dir, "nope.log"),
      "-e",
      "[:find ?x :where [?x :chunk/node]]",
    );
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/no embedded catalog log at .*nope.log/);
  });

  it("runs a REPL over stdin: multi-line queries, errors that do not end the session", async () => {
    const child = execFile(process.execPath, [BIN, "console", "--log", logPath], { encoding: "utf8" });
    let out = "";
    child.stdout!.on("data", (d: string) => {
      out += d;
    });
    child.stdin!.end(
      [
        "[:find (count ?w) .",
        " :where [?w :worker/id]]",
        "[:find ?x :where [?x :worker/idd]]",
        ".offset",
        "[:find ?id :where [_ :worker/id ?id]]",
        "",
      ].join("\n"),
    );
    const code = await new Promise<number>((resolve) => child.on("exit", (c) => resolve(c ?? -1)));
    expect(code).toBe(0);
    const lines = out.trim().split("\n");
    expect(lines[0]).toBe("4");
    expect(lines[1]).toMatch(/^error: unknown attribute :worker\/idd/);
    expect(lines[2]).toBe(String(accepted));
    expect(lines.slice(3)).toEqual(['"w0"', '"w1"', '"w2"', '"w3"', "(4 rows)"]);
  });

  it("tail prints the decoded tx log as JSON lines from an offset", async () => {
    const r = await cli("tail", "--log", logPath, "--json", "--from", "1");
    expect(r.code).toBe(0);
    const txs = r.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { offset: number; txNo: number; datoms: unknown[] });
    expect(txs).toHaveLength(accepted - 1);
    expect(txs[0]!.offset).toBe(1);
    expect(txs.every((t, i) => t.txNo === i + 2 && Array.isArray(t.datoms))).toBe(true);
    const text = await cli("tail", "--log", logPath, "--from", String(accepted - 1));
    expect(text.stdout).toMatch(
      new RegExp(
        `^#${accepted - 1} tx ${accepted} proposal \\S+ client gen at \\S+ \\(\\d+ datoms\\)(\\n  [+-] \\d+ :\\S+ .+)*\\n$`,
      ),
    );
    const bad = await cli("tail", "--log", logPath, "--from=-3");
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--from must be a non-negative integer/);
    const unknown = await cli("tail", "--log", logPath, "--frm", "3");
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/Unknown option '--frm'/);
  });
});

function countRejections(log: EmbeddedLog): number {
  return (log as unknown as { rejections: unknown[] }).rejections.length;
}
