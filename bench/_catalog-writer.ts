import { CatalogDb } from "../catalog/db.ts";
import { KafkaLog } from "../catalog/kafka/log.ts";
import { CatalogWriter } from "../catalog/writer.ts";
import { silentLogger } from "../schema/log.ts";

/**
 * The catalog writer as its own process, for `bench catalog` on Kafka (as in
 * a fleet: writer, replica and proposers do not share a thread).
 * argv: BROKERS (comma-separated) TOPICS (JSON {proposals, tx, rejections}).
 * Prints "ready" once running; stops on SIGTERM.
 */
const [brokers, topicsJson] = process.argv.slice(2);
if (!brokers || !topicsJson) {
  console.error("usage: _catalog-writer.ts BROKERS TOPICS_JSON");
  process.exit(2);
}
const log = await KafkaLog.open({
  brokers: brokers.split(","),
  clientId: "bench-writer",
  topics: JSON.parse(topicsJson),
});
const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
const running = writer.run();
process.once("SIGTERM", () => {
  void writer
    .stop()
    .then(() => running)
    .then(() => log.close())
    .then(() => process.exit(0));
});
console.log("ready");
await running;
