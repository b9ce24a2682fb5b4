import { ensureTopics, waitForKafka } from "../../catalog/kafka/admin.ts";
import { defaultConfig } from "../../schema/config.ts";

/**
 * `node --import tsx deploy/kafka/ready.ts HOST:PORT [--wait-ms N] [--create-topics] [--broker-pid P]`
 *
 * Polls the broker through the admin client until it answers (at most N ms),
 * then optionally creates the catalog topics (names from the default
 * configuration). With --broker-pid, gives up as soon as that process exits
 * (a broker that failed to start) instead of waiting out the bound.
 */
async function main(argv: string[]): Promise<number> {
  const broker = argv[0];
  if (!broker || broker.startsWith("--")) {
    console.error("usage: ready.ts HOST:PORT [--wait-ms N] [--create-topics] [--broker-pid P]");
    return 2;
  }
  const flag = (name: string) => {
    const i = argv.indexOf(name);
    return i < 0 ? undefined : argv[i + 1];
  };
  const waitMs = Number(flag("--wait-ms") ?? "60000");
  const pid = flag("--broker-pid");
  const died = new Promise<never>((_, reject) => {
    if (pid === undefined) return;
    const timer = setInterval(() => {
      try {
        process.kill(Number(pid), 0);
      } catch {
        clearInterval(timer);
        reject(new Error(`broker process ${pid} exited`));
      }
    }, 200);
    timer.unref();
  });
  try {
    await Promise.race([waitForKafka([broker], waitMs), died]);
    if (argv.includes("--create-topics")) await ensureTopics([broker], defaultConfig.catalog.topics);
    return 0;
  } catch (err) {
    console.error(`kafka not ready: ${(err as Error).message}`);
    return 1;
  }
}

process.exitCode = await main(process.argv.slice(2));
