import type { Verdict } from "./invariants.ts";
import type { FaultKind } from "./plan.ts";

/**
 * What a chaos run needs of the system under test: its front door, the
 * roles it may kill, and the faults it can apply. Two implementations: the
 * embedded default (one `continuum serve`) and the local fleet (`cluster up`).
 */
export interface ChaosTarget {
  readonly name: string;
  /** The HTTP front door (stable across restarts: the same port). */
  readonly url: string;
  readonly model: string;
  readonly vocab: number;
  /** Roles a kill may target. */
  readonly roles: readonly string[];
  /** The role whose data dir a second process is started on. */
  readonly ownerRole: string;
  /** Fault kinds this target can apply; `skipped` says why any other is not. */
  readonly kinds: readonly FaultKind[];
  readonly skipped: Readonly<Record<string, string>>;
  /** kill -9 of one role's process, then its restart; resolves once it serves again. */
  kill(role: string): Promise<void>;
  /** A second process on `role`'s data dir: whether it was refused at once, naming the owner's pid. */
  secondOwner(role: string): Promise<{ readonly refused: boolean; readonly detail: string }>;
  fillDisk(): void;
  freeDisk(): void;
  pauseS3(): void;
  resumeS3(): void;
  /** The live process of each role. */
  pids(): Readonly<Record<string, number>>;
  /** Waits (bounded) until every role is up and the front door answers. */
  settle(): Promise<void>;
  /** A request that needs most of a worker's page pool is admitted and completes (no page leaked). */
  pagesVerdicts(): Promise<Verdict[]>;
  /** The catalog and store invariants (the embedded target stops its process first, to read the log at rest). */
  stateVerdicts(): Promise<Verdict[]>;
  /** Stops everything it started; idempotent. */
  close(): Promise<void>;
  /** Log files of every process life, for a failure's post-mortem. */
  logs(): readonly string[];
}
