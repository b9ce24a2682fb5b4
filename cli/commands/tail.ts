import { parseArgs } from "node:util";
import { tailLog } from "../../catalog/tail.ts";
import { brokerList, withTxSource } from "../catalog-source.ts";
import { type Command, parseUsage, UsageError } from "../command.ts";

const command: Command = {
  summary: "print the catalog tx log decoded: continuum tail [--from N] [--json] [-f]",
  usage: [
    "Usage: continuum tail [--from N] [--json] [--follow] [--brokers HOST:PORT,...] [--log FILE] [--config FILE]",
    "",
    "  --from N      first log offset to print (default 0)",
    "  --json        one JSON object per tx: {offset, txNo, proposalId, clientId, time, datoms}",
    "  -f, --follow  keep printing new txs (Kafka only) until Ctrl-C",
    "  --brokers     read topic catalog.tx from these Kafka brokers",
    "  --log FILE    read this embedded log file (default: <dataDir>/catalog/embedded.log)",
    "  --config FILE configuration (JSON or YAML)",
    "",
    "The wire format is documented in catalog/WIRE.md.",
  ].join("\n"),
  async run(argv) {
    const { values } = parseUsage(() =>
      parseArgs({
        args: [...argv],
        options: {
          from: { type: "string" },
          json: { type: "boolean" },
          follow: { type: "boolean", short: "f" },
          brokers: { type: "string" },
          log: { type: "string" },
          config: { type: "string" },
        },
        strict: true,
      }),
    );
    const from = values.from === undefined ? 0 : Number(values.from);
    if (!Number.isSafeInteger(from) || from < 0)
      throw new UsageError(`--from must be a non-negative integer, got ${values.from}`);
    const brokers = brokerList(values.brokers);
    if (values.follow && !brokers)
      throw new UsageError("--follow needs --brokers (the embedded log is read as a copy)");
    return withTxSource("tail", { brokers, log: values.log, config: values.config }, async (source) => {
      const stop = new AbortController();
      const onSigint = () => stop.abort();
      process.once("SIGINT", onSigint);
      try {
        await tailLog(
          source.log,
          { from, follow: values.follow ?? false, json: values.json ?? false, signal: stop.signal },
          (l) => console.log(l),
        );
      } finally {
        process.off("SIGINT", onSigint);
      }
      return 0;
    });
  },
};
export default command;
