import type { ContinuationId, PrefixHash } from "../../schema/ids.ts";
import type { Calibration, Sample } from "../calibration/calibration.ts";
import type { PageManager } from "./page-manager.ts";

/**
 * What the runtime loop hands its optional durable cache. Both calls are
 * synchronous and cheap (hashing, catalog index lookups, page bookkeeping);
 * bytes move afterwards, beside the loop.
 */
export interface RestoreRequest {
  /** The continuation's route in each layer group (GroupedRoutes.routes), group 0 first; all restore or none. */
  readonly routes: readonly ContinuationId[];
  /** Processed tokens: the prompt without its pending last token. */
  readonly tokens: readonly number[];
  /** The page-hash chain of `tokens`' full pages (the runtime holds it already): the restored pages' identities. */
  readonly pageHashes: readonly PrefixHash[];
  readonly salt: string | undefined;
  /** Rows already in every route's pages (adopted resident pages; page-aligned). */
  readonly residentTokens: number;
  /** Holds the routes; a restore fills no more pages of a route than its reservation. */
  readonly pages: PageManager;
  readonly calibration: Calibration;
  readonly record: (sample: Sample) => void;
}

export interface RestoreTicket {
  /** Rows every route holds once the loads complete. */
  readonly restoreTo: number;
  /**
   * Resolves true once every page of every route's load is uploaded and the
   * routes hold them (runnable); false when the restore gave up, in which
   * case every load was abandoned and the routes hold exactly their resident
   * rows again (recompute). Never rejects.
   */
  readonly done: Promise<boolean>;
}

export interface PrefixRestorer {
  /** Plans and, when a restore beats recompute, begins the loads on the routes; null: recompute. */
  begin(req: RestoreRequest): RestoreTicket | null;
}

export interface CheckpointOffer {
  /**
   * The page-hash chain of a sealed, immutable prefix (a retired request's
   * pages): captured wherever the pool holds them, by a route or cached.
   */
  readonly prefix: readonly PrefixHash[];
  /** The prefix's rows: tokens[i] is row i; only whole chunks of them are captured. */
  readonly tokens: readonly number[];
  readonly salt: string | undefined;
  /** Times this prefix was reused (expected-reuse input). */
  readonly hits: number;
  readonly pages: PageManager;
  readonly calibration: Calibration;
  /**
   * Called each time a capture of these pages ends: cached pages it read are
   * evictable again, so a request that waited for pages can be admitted now.
   */
  readonly released: () => void;
}

export interface RouteCheckpointer {
  /** Queues an optional capture; returns at once. A full queue or an oversized capture skips it. */
  offer(offer: CheckpointOffer): "queued" | "skipped" | "refused";
}
