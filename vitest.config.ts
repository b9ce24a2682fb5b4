import { readdirSync } from "node:fs";
import { defineConfig } from "vitest/config";

// Each file in test/setup/ is a global setup that starts one real service
// (Kafka, the S3 server) unless it is already reachable, exports where it is
// through CONTINUUM_* environment variables, and stops what it started when
// the run ends. So `npm test` alone runs every integration suite for real.
const globalSetup = readdirSync(new URL("./test/setup/", import.meta.url))
  .filter((f) => f.endsWith(".ts"))
  .sort()
  .map((f) => `./test/setup/${f}`);

// test/ mirrors the source tree: test/<room>/... holds the tests of
// <room>/... (schema, catalog, controller, worker, native, cli, deploy, bench), whether
// they are pure-logic units, numeric oracles or in-process integration against
// the real Kafka and S3 that test/setup/ starts. test/e2e/ holds the
// process-level suites: `continuum serve` and `cluster up` as child processes
// (the OpenAI client against them, start-up, cache tiers, families, GGUF), the
// fleet's fault cases, the chaos suite (deploy/chaos/) and the operations suite
// (both web views in headless Chromium, Prometheus scraping /metrics).
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup,
    testTimeout: 60_000,
    hookTimeout: 180_000,
    pool: "forks",
    // One file at a time. The machine has two cores and the suites run real
    // brokers, servers, worker processes and native threads; files in
    // parallel starve each other's timing-sensitive checks (event-loop
    // liveness, deadlines, heartbeats) and race for ports picked as free.
    fileParallelism: false,
    maxWorkers: 1,
  },
});
