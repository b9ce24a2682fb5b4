/**
 * Node flags for continuum's long-running processes (serve, writer,
 * controller, worker, and the catalog bench's writer).
 *
 * --initial-old-space-size=256: V8 otherwise sizes the old generation from
 * the live heap after each mark-compact. The catalog roles keep a small live
 * heap (~50 MB: the columnar entity store holds its data outside it) while
 * promoting a steady stream of short-lived request state, so V8 kept the
 * limit a few MB above the live size and ran a mark-compact every ~0.5–1 s
 * (12–28 in the writer over a 15 s lag run at 5,000 proposals/s, 3–25 ms
 * each), and each one stalls every proposal in flight. With 256 MB to fill
 * first: 2–3 in the writer and 1 in the replica's process over the same run;
 * lag p99 72–81 ms against 108–256 (catalog bench, interleaved rounds), and
 * ~15 % less writer CPU per publication. Cost: up to 256 MB of garbage held
 * per process before the first collection.
 *
 * V8 reads the flag when it creates the heap, so it must be on the command
 * line (Node refuses it in NODE_OPTIONS): bin/continuum.mjs's shebang and
 * package.json's start script carry the same flags (test/deploy/node-flags.test.ts
 * checks they agree), and processes this code spawns get them here.
 */
export const NODE_HEAP_FLAGS: readonly string[] = ["--initial-old-space-size=256"];
