#!/usr/bin/env node
// Builds the native addon (native/build/Release/continuum_native.node) with
// node-gyp. Run by `npm install`, and before `npm test` with --if-missing
// (which builds only when the addon is absent). When this Node
// installation ships its own headers (e.g. /usr/include/node from a distro
// package), they are used, so the build needs no download.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const addon = join(here, "build", "Release", "continuum_native.node");
if (process.argv.includes("--if-missing") && existsSync(addon)) process.exit(0);
const require = createRequire(import.meta.url);
const gyp = join(dirname(require.resolve("node-gyp/package.json")), "bin", "node-gyp.js");

const args = [gyp, "rebuild", "--directory", here, `--jobs=${process.env.JOBS ?? "max"}`];
const prefix = dirname(dirname(process.execPath));
if (existsSync(join(prefix, "include", "node", "node_api.h")) && !process.env.npm_config_nodedir) {
  args.push(`--nodedir=${prefix}`);
}
const r = spawnSync(process.execPath, args, { stdio: "inherit" });
process.exit(r.status ?? 1);
