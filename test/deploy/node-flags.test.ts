import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { NODE_HEAP_FLAGS } from "../../deploy/node-flags.ts";

const ROOT = new URL("../../", import.meta.url);

/** The heap flags must be on every command line that starts a long-running process (V8 reads them at heap setup). */
describe("node heap flags", () => {
  it("bin/continuum.mjs's shebang and package.json's start script carry deploy/node-flags.ts's flags", () => {
    const shebang = readFileSync(new URL("bin/continuum.mjs", ROOT), "utf8").split("\n")[0]!;
    expect(shebang).toBe(`#!/usr/bin/env -S node ${NODE_HEAP_FLAGS.join(" ")}`);
    const pkg = JSON.parse(readFileSync(new URL("package.json", ROOT), "utf8")) as {
      scripts: Record<string, string>;
    };
    expect(pkg.scripts.start).toBe(`node ${NODE_HEAP_FLAGS.join(" ")} bin/continuum.mjs serve`);
  });

  it("node starts with them (an unknown or malformed flag ends it with 'bad option')", () => {
    const r = spawnSync(process.execPath, [...NODE_HEAP_FLAGS, "-e", "process.exit(0)"], {
      encoding: "utf8",
    });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
  });
});
