// The entry of every worker thread: sources are TypeScript, so a thread
// registers tsx (as bin/continuum.mjs does for the process) and then imports
// the module it was started for (workerData.entry, a file URL). Resolved from
// this file, so it works whatever the working directory.
import { workerData } from "node:worker_threads";
import { register } from "tsx/esm/api";

register();
await import(workerData.entry);
