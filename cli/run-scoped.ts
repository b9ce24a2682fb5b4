import { Cause, Effect, Exit, Fiber, type Scope } from "effect";

/**
 * Runs a long-lived role as one scoped Effect: its resources are acquired
 * with `resource` (schema/scope.ts), and SIGINT/SIGTERM interrupt the fiber
 * so every release runs in reverse order (sockets close, loops stop, native
 * memory is freed, children are stopped) before the process exits.
 */
export async function runScoped(program: Effect.Effect<void, unknown, Scope.Scope>): Promise<number> {
  const fiber = Effect.runFork(Effect.scoped(program));
  const stop = () => {
    Effect.runFork(Fiber.interrupt(fiber));
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  const exit = await Effect.runPromise(Fiber.await(fiber));
  process.off("SIGINT", stop);
  process.off("SIGTERM", stop);
  if (Exit.isSuccess(exit) || Cause.hasInterruptsOnly(exit.cause)) return 0;
  const err = Cause.squash(exit.cause);
  process.stderr.write(`${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}\n`);
  return 1;
}
