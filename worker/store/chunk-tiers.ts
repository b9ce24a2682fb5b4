import type { Config } from "../../schema/config.ts";
import type { ContentId } from "../../schema/ids.ts";
import type { StoreReporter, VerifiedChunk } from "./chunk.ts";
import { FileFullError } from "./errors.ts";
import type { FileTier } from "./file.ts";
import { openConfiguredTiers } from "./index.ts";
import type { RamTier } from "./ram.ts";
import type { S3Tier } from "./s3.ts";
import type { TieredChunkStore } from "./tiered.ts";

/**
 * The worker's chunk store with its tiers in reach: checkpoint writes through
 * the tiered store (local files, RAM, write-behind to S3); restore reads one
 * named tier at a time, because it chooses the source by measured cost rather
 * than taking whatever the read-through order finds first; the peer server
 * reads the local tiers only.
 */
export class ChunkTiers {
  constructor(
    readonly store: TieredChunkStore,
    readonly file: FileTier,
    readonly ram: RamTier | undefined,
    readonly s3: S3Tier | undefined,
  ) {}

  static async open(store: Config["store"], report?: StoreReporter): Promise<ChunkTiers> {
    const t = await openConfiguredTiers(store, report);
    return new ChunkTiers(t.store, t.file, t.ram, t.s3);
  }

  /** A verified local copy (RAM first, then SSD); corrupt or absent copies read as undefined. */
  async getLocal(id: ContentId): Promise<VerifiedChunk | undefined> {
    const inRam = await this.ram?.get(id).catch(() => undefined);
    if (inRam !== undefined) return inRam;
    return this.file.get(id).catch(() => undefined);
  }

  /**
   * Keeps a verified chunk fetched from elsewhere (a peer, S3) in the local
   * tiers, without another S3 upload: in the files unless they are full
   * (store.dir.maxBytes), in RAM when it fits. Returns the local tiers now
   * holding it.
   */
  async keepLocal(chunk: VerifiedChunk): Promise<("ram" | "ssd")[]> {
    const held: ("ram" | "ssd")[] = [];
    try {
      await this.file.putVerified(chunk);
      held.push("ssd");
    } catch (err) {
      if (!(err instanceof FileFullError)) throw err;
    }
    if (this.ram?.fits(chunk.bytes.byteLength)) {
      await this.ram.putVerified(chunk);
      held.push("ram");
    }
    return held;
  }

  close(): Promise<unknown> {
    return this.store.close();
  }
}
