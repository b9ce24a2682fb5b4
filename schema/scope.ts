import { Cause, Effect, Exit, Scope } from "effect";

/**
 * The one way to own a long-lived resource (README, "Owning resources"):
 * acquire it in an Effect Scope together with its release. A scope releases
 * in the reverse order of acquisition, every release runs even when one
 * fails, and a failed acquisition releases what was taken before it; so the
 * close order of anything built this way is its build order, reversed.
 */

/** An acquired resource with an async release, as an Effect in a scope. */
export function resource<A>(
  acquire: () => Promise<A> | A,
  release: (a: A) => unknown,
): Effect.Effect<A, unknown, Scope.Scope> {
  return Effect.acquireRelease(Effect.tryPromise({ try: async () => acquire(), catch: (e) => e }), (a) =>
    Effect.promise(async () => {
      await release(a);
    }),
  );
}

/** A resource made of others, built in a scope of its own and handed to a caller that awaits. */
export interface Scoped<A> {
  readonly value: A;
  /** Closes the scope: every release, in reverse order; then throws a release's error, if one failed. */
  close(): Promise<void>;
}

/**
 * Builds `program` in a fresh scope. When it fails, the scope closes at once
 * (what it acquired is released, release errors dropped) and the build's
 * error is thrown; otherwise the value is returned with the scope's close.
 */
export async function openScoped<A>(program: Effect.Effect<A, unknown, Scope.Scope>): Promise<Scoped<A>> {
  const scope = Scope.makeUnsafe();
  const exit = await Effect.runPromiseExit(Scope.provide(scope)(program));
  if (Exit.isFailure(exit)) {
    await Effect.runPromiseExit(Scope.close(scope, exit));
    throw Cause.squash(exit.cause);
  }
  return {
    value: exit.value,
    async close() {
      const closed = await Effect.runPromiseExit(Scope.close(scope, Exit.void));
      if (Exit.isFailure(closed)) throw Cause.squash(closed.cause);
    },
  };
}
