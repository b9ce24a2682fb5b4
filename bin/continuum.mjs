#!/usr/bin/env node
// The `continuum` command. Sources are TypeScript; tsx compiles them on load so
// a clone runs without a separate build step.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../cli/main.ts");
process.exitCode = await main(process.argv.slice(2));
