import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

describe("process exit", () => {
  it("a process that ends with an engine still allocated exits cleanly (no abort in teardown)", () => {
    const script = join(import.meta.dirname, "exit-without-free.ts");
    const r = spawnSync(process.execPath, ["--import", "tsx", script], { encoding: "utf8", timeout: 60_000 });
    expect(r.stdout).toContain("engine ready");
    expect(r.signal, r.stderr).toBeNull();
    expect(r.status, r.stderr).toBe(0);
  });
});
