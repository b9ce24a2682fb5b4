import { execFileSync } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmdirSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * A real, small file system for full-disk tests and chaos runs: a tmpfs of
 * `bytes` mounted on a fresh directory (or on `at`, which must exist and be
 * empty). Mounting needs root (the tests run as root here and in CI); where
 * it is not allowed, `smallFs` says why and the caller skips its disk cases.
 * `fill()` writes a filler file until the file system answers ENOSPC;
 * `free()` removes it.
 */
export interface SmallFs {
  readonly dir: string;
  fill(): void;
  free(): void;
  unmount(): void;
}

export function smallFs(bytes: number, at?: string): SmallFs | { readonly unavailable: string } {
  const dir = at ?? mkdtempSync(join(tmpdir(), "continuum-smallfs-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${bytes}`, "tmpfs", dir], { stdio: "pipe" });
  } catch (err) {
    if (at === undefined) rmdirSync(dir);
    const msg = (err as { stderr?: Buffer }).stderr?.toString().trim() || (err as Error).message;
    return { unavailable: `cannot mount a tmpfs here (${msg})` };
  }
  const filler = join(dir, "filler");
  return {
    dir,
    fill() {
      const fd = openSync(filler, "a");
      const block = Buffer.alloc(64 << 10, 0xee);
      try {
        // Bounded: the file system holds `bytes`; a byte at a time at the end fills the last page.
        for (let i = 0; i < 2 * Math.ceil(bytes / block.length) + 2; i++) writeSync(fd, block);
        throw new Error(`${dir} never filled`);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
        try {
          for (let i = 0; i < 4096; i++) writeSync(fd, block, 0, 1);
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== "ENOSPC") throw e;
        }
      } finally {
        closeSync(fd);
      }
    },
    free() {
      rmSync(filler, { force: true });
    },
    unmount() {
      execFileSync("umount", ["-l", dir], { stdio: "pipe" });
      if (at === undefined) rmdirSync(dir);
    },
  };
}
