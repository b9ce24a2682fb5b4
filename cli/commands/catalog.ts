import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { embeddedLogPath } from "../../catalog/console.ts";
import { type RepairReport, repairLog } from "../../catalog/log-repair.ts";
import { lockFile } from "../../worker/store/dir-lock.ts";
import { type Command, UsageError } from "../command.ts";
import { lockDirs } from "../embedded/startup.ts";
import { parseRoleArgs } from "../options.ts";

const usage = [
  "Usage: continuum catalog repair [--dir DATA_DIR] [--config FILE] [--json]",
  "",
  "Repairs the embedded catalog log (<DATA_DIR>/catalog/embedded.log) that two processes",
  'appended to — the log a start-up refuses with "a second process appended to this log".',
  "Keeps every frame before the first commit at a stale proposal offset and every proposal",
  "after it (acknowledged proposals are never dropped: the next writer decides them again);",
  "drops the stale commits and a torn tail, and reports what it kept and dropped. The original",
  "file stays beside it as embedded.log.before-repair-<time>. A consistent log is left as it is.",
  "",
  "  --dir DATA_DIR  the data dir (default: store.dataDir of the configuration, .continuum)",
  "  --json          print the report as one JSON line",
  "",
  "It takes the data dir's lock first: it refuses (exit 1, naming the pid) while a process",
  "serves from that data dir.",
].join("\n");

function formatReport(r: RepairReport): string {
  const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;
  if (!r.repaired) {
    return [
      `${r.path}: consistent, nothing to repair`,
      r.dropped.tailBytes > 0 ? `  cut a torn tail of ${plural(r.dropped.tailBytes, "byte")}` : "",
      `  ${plural(r.kept.proposals, "proposal")}, ${plural(r.kept.tx, "transaction")}; ${plural(r.undecidedProposals, "proposal")} not yet decided`,
    ]
      .filter((l) => l !== "")
      .join("\n");
  }
  return [
    `${r.path}: repaired (a second process had appended to it; the first stale commit was at byte ${r.inconsistentAt})`,
    `  kept ${plural(r.kept.proposals, "proposal")}, ${plural(r.kept.tx, "transaction")}, ${plural(r.kept.rejections, "rejection")}`,
    `  dropped ${plural(r.dropped.commits, "commit")} made at a stale offset (${plural(r.dropped.tx, "transaction")}, ${plural(r.dropped.rejections, "rejection")})` +
      (r.dropped.tailBytes > 0 ? ` and a torn tail of ${plural(r.dropped.tailBytes, "byte")}` : ""),
    `  ${plural(r.requeuedProposals, "proposal")} after the stale commit kept; ${plural(r.undecidedProposals, "proposal")} will be decided by the writer on the next start`,
    `  ${r.bytesBefore} → ${r.bytesAfter} bytes; the original is kept as ${r.backup}`,
  ].join("\n");
}

const command: Command = {
  summary: "repair the embedded catalog log: continuum catalog repair [--dir DATA_DIR]",
  usage,
  async run(argv) {
    const [sub, ...rest] = argv;
    if (sub !== "repair")
      throw new UsageError(`unknown subcommand ${sub === undefined ? "(none)" : `'${sub}'`}`);
    const { config, values } = parseRoleArgs(rest, { dir: { type: "string" }, json: { type: "boolean" } });
    if (typeof values.dir === "string") config.store.dataDir = values.dir;
    const dataDir = resolve(config.store.dataDir);
    const path = embeddedLogPath(config);
    if (!existsSync(path)) {
      console.error(`continuum catalog repair: no embedded log at ${path}`);
      return 1;
    }
    let locks: { release(): void }[];
    try {
      locks = [...lockDirs([dataDir]), lockFile(`${path}.lock`, `catalog log ${path}`)];
    } catch (err) {
      console.error(`continuum catalog repair: ${(err as Error).message}`);
      return 1;
    }
    try {
      const report = await repairLog(path);
      console.log(values.json ? JSON.stringify(report) : formatReport(report));
      return 0;
    } finally {
      for (const l of locks.reverse()) l.release();
    }
  },
};
export default command;
