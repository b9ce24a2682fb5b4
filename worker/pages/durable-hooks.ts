import type { ContinuationId, PrefixHash } from "../../schema/ids.ts";
import type { Calibration, Sample } from "../calibration/calibration.ts";
import type { PageManager } from "./page-manager.ts";

/**
 * What the runtime loop hands its optional durable cache. Both calls are
 * synchronous and cheap (hashing, catalog index lookups, page bookkeeping);
 * bytes move afterwards, beside the loop.
 */
export interface RestoreRequest {
  readonly route: ContinuationId;
  /** Processed tokens: the prompt without its pending last token. */
  readonly tokens: readonly number[];
  /** The page-hash chain of `tokens`' full pages (the runtime holds it already): the restored pages' identities. */
  readonly pageHashes: readonly PrefixHash[];
  readonly salt: string | undefined;
  /** Rows already in the route's pages (adopted resident pages; page-aligned). */
  readonly residentTokens: number;
  readonly pages: PageManager;
  /** Pages the restore may fill: the route's reservation. */
  readonly availablePages: number;
  readonly calibration: Calibration;
  readonly record: (sample: Sample) => void;
}

export interface RestoreTicket {
  /** Rows the route holds once the load completes. */
  readonly restoreTo: number;
  /**
   * Resolves true once every page of the load is uploaded and the route
   * holds them (runnable); false when the restore gave up, in which case the
   * load was abandoned and the route holds exactly its resident rows again
   * (recompute). Never rejects.
   */
  readonly done: Promise<boolean>;
}

export interface PrefixRestorer {
  /** Plans and, when a restore beats recompute, begins the load on `route`; null: recompute. */
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
