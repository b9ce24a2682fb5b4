#!/usr/bin/env -S node --initial-old-space-size=256
// The `continuum` command. Sources are TypeScript; tsx compiles them on load so
// a clone runs without a separate build step. The shebang's heap flag: see
// deploy/node-flags.ts.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../cli/main.ts");
process.exitCode = await main(process.argv.slice(2));
