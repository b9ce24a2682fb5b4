import { Effect } from "effect";
import { describe, expect, it } from "vitest";
import { openScoped, resource } from "../../schema/scope.ts";

/** A resource that records its open and close in `log`; `failClose` makes its release reject. */
function tracked(log: string[], name: string, failClose = false) {
  return resource(
    async () => {
      log.push(`open ${name}`);
      return name;
    },
    async () => {
      log.push(`close ${name}`);
      if (failClose) throw new Error(`close ${name} failed`);
    },
  );
}

describe("openScoped", () => {
  it("closes in the reverse order of acquisition, once", async () => {
    const log: string[] = [];
    const opened = await openScoped(
      Effect.gen(function* () {
        const a = yield* tracked(log, "a");
        const b = yield* tracked(log, "b");
        const c = yield* tracked(log, "c");
        return [a, b, c];
      }),
    );
    expect(opened.value).toEqual(["a", "b", "c"]);
    expect(log).toEqual(["open a", "open b", "open c"]);
    await opened.close();
    await opened.close();
    expect(log).toEqual(["open a", "open b", "open c", "close c", "close b", "close a"]);
  });

  it("a failed build releases what it took, in reverse, and throws the build's error (not a release's)", async () => {
    const log: string[] = [];
    const boom = new Error("the third open failed");
    const build = openScoped(
      Effect.gen(function* () {
        yield* tracked(log, "a");
        yield* tracked(log, "b", true);
        yield* resource(
          () => Promise.reject(boom),
          () => {
            log.push("close never-opened");
          },
        );
        return "unreached";
      }),
    );
    await expect(build).rejects.toBe(boom);
    expect(log).toEqual(["open a", "open b", "close b", "close a"]);
  });

  it("a release that fails does not stop the others; close then throws its error", async () => {
    const log: string[] = [];
    const opened = await openScoped(
      Effect.gen(function* () {
        yield* tracked(log, "a");
        yield* tracked(log, "b", true);
        yield* tracked(log, "c");
      }),
    );
    await expect(opened.close()).rejects.toThrow("close b failed");
    expect(log.slice(3)).toEqual(["close c", "close b", "close a"]);
  });

  it("a synchronous acquire and release work as well", async () => {
    const log: string[] = [];
    const opened = await openScoped(
      resource(
        () => 7,
        (n) => {
          log.push(`release ${n}`);
        },
      ),
    );
    expect(opened.value).toBe(7);
    await opened.close();
    expect(log).toEqual(["release 7"]);
  });
});
