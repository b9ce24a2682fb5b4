import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import {
  ConsoleError,
  describeAttributes,
  formatResult,
  openBrackets,
  runQuery,
} from "../../catalog/console.ts";
import type { Replica } from "../../catalog/replica.ts";
import { brokerList, withReplica } from "../catalog-source.ts";
import { type Command, parseUsage, UsageError } from "../command.ts";

const HELP = [
  "Type a Datalog query (it may span lines), e.g.",
  "  [:find ?node ?tier :where [?c :chunk/node ?node] [?r :replica/chunk ?c] [?r :replica/tier ?tier]]",
  "Rules given with --rules bind to % (write :in $ %).",
  ".attrs  list the catalog attributes    .offset  the replica's log offset",
  ".help   this text                      .quit    leave (or Ctrl-D)",
].join("\n");

const command: Command = {
  summary: "Datalog console on a catalog replica: continuum console [-e QUERY] [--json]",
  usage: [
    "Usage: continuum console [-e QUERY] [--json] [--rules RULES] [--brokers HOST:PORT,...] [--log FILE] [--config FILE]",
    "",
    "  -e, --eval QUERY  run one query, print the result, exit (1 on an error)",
    "  --json            print results as JSON",
    "  --rules RULES     Datalog rules bound to %: EDN text starting with '[' or a file holding it",
    "  --brokers         replicate from Kafka (topic catalog.tx) and keep following",
    "  --log FILE        replicate from this embedded log file, as of start",
    "                    (default: <dataDir>/catalog/embedded.log)",
    "  --config FILE     configuration (JSON or YAML)",
    "",
    "Attributes are written as keywords, e.g. :chunk/node; `.attrs` in the REPL lists them.",
  ].join("\n"),
  async run(argv) {
    const { values } = parseUsage(() =>
      parseArgs({
        args: [...argv],
        options: {
          eval: { type: "string", short: "e" },
          json: { type: "boolean" },
          rules: { type: "string" },
          brokers: { type: "string" },
          log: { type: "string" },
          config: { type: "string" },
        },
        strict: true,
      }),
    );
    const json = values.json ?? false;
    let rules: string | undefined;
    if (values.rules !== undefined) {
      const r = values.rules.trim();
      if (r.startsWith("[")) rules = r;
      else {
        try {
          rules = readFileSync(r, "utf8");
        } catch (err) {
          throw new UsageError(`cannot read rules file ${r}: ${(err as Error).message}`);
        }
      }
    }
    const catalog = { brokers: brokerList(values.brokers), log: values.log, config: values.config };
    return withReplica("console", catalog, async (replica, source) => {
      if (values.eval !== undefined) {
        console.log(formatResult(runQuery(replica.datalog(), values.eval, rules), json));
        return 0;
      }
      await repl(replica, rules, json, source.where);
      return 0;
    });
  },
};

async function repl(
  replica: Replica,
  rules: string | undefined,
  json: boolean,
  where: string,
): Promise<void> {
  const tty = process.stdin.isTTY === true;
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: tty });
  if (tty) console.log(`catalog replica of ${where} at offset ${replica.offset()}. .help for help.`);
  const prompt = (more: boolean) => {
    if (tty) {
      rl.setPrompt(more ? "   ... " : "catalog> ");
      rl.prompt();
    }
  };
  let buffer = "";
  prompt(false);
  for await (const line of rl) {
    const cmd = line.trim();
    if (buffer === "" && cmd.startsWith(".")) {
      if (cmd === ".quit" || cmd === ".exit") break;
      else if (cmd === ".help") console.log(HELP);
      else if (cmd === ".attrs") console.log(describeAttributes());
      else if (cmd === ".offset") console.log(String(replica.offset()));
      else console.log(`unknown command ${cmd}; .help lists them`);
      prompt(false);
      continue;
    }
    buffer += `${line}\n`;
    if (buffer.trim() === "") {
      buffer = "";
      prompt(false);
      continue;
    }
    try {
      if (openBrackets(buffer).length > 0) {
        prompt(true);
        continue;
      }
      console.log(formatResult(runQuery(replica.datalog(), buffer, rules), json));
    } catch (err) {
      if (!(err instanceof ConsoleError)) throw err;
      console.log(`error: ${err.message}`);
    }
    buffer = "";
    prompt(false);
  }
  if (buffer.trim() !== "") console.log("error: parse error: input ended inside a query");
  rl.close();
}

export default command;
