import type { Engine } from "../../native/engine.ts";
import type { CatalogOp } from "../../schema/catalog.ts";
import { type ChainNode, catalogNodeId, prefixChain } from "../../schema/identity.ts";
import type { ContentId, NodeId, PageId, PrefixHash } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { type Calibration, type Estimate, smooth } from "../calibration/calibration.ts";
import type { LayerGroups } from "../model/layout.ts";
import type { CheckpointOffer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import { groupHashes } from "../pages/layer-groups.ts";
import type { PageManager } from "../pages/page-manager.ts";
import { PageError } from "../pages/page-state.ts";
import { residencyCosts } from "../residency/residency.ts";
import type { ChunkTiers } from "../store/chunk-tiers.ts";
import type { PutResult } from "../store/tiered.ts";
import { captureDecision } from "./admission.ts";
import type { CatalogLink } from "./catalog-link.ts";
import { type ChunkDescriptor, describeChunk, type KvGeometry, packChunk } from "./chunk-format.ts";
import { type GroupChunks, groupChain, groupChunksOf } from "./group-chunks.ts";

const DEFAULT_PROBE_EVERY = 8;

export interface CheckpointerOptions {
  readonly engine: Pick<Engine, "downloadPages">;
  /** The pool's geometry: its slots are `groups.slots`. */
  readonly geometry: KvGeometry;
  /** The layer groups the runtime holds pages in (layerGroups): each is checkpointed as chunks of its own layers. */
  readonly groups: LayerGroups;
  readonly tiers: ChunkTiers;
  readonly catalog: CatalogLink;
  readonly pageTokens: number;
  readonly chunkTokens: number;
  /** Captures (offered prefixes) waiting at once; one more is skipped. */
  readonly maxQueued: number;
  /** Host staging for one chunk; an offer whose chunk is larger is refused before it queues. */
  readonly maxStagingBytes: number;
  /** Capture cost per byte before the first measurement (download + re-pack + local store writes). */
  readonly capturePerByteMs: number;
  /** Offers declined on value in a row before one is captured as a probe (default 8; see admission.ts). */
  readonly probeEvery?: number;
  /** How long a publication may take to reach this worker's replica before the pages stay non-durable. */
  readonly publishTimeoutMs: number;
  readonly logger: Logger;
  /**
   * Runs after the store confirmed a chunk and before its facts are proposed:
   * the window in which a killed worker must leave no visible chunk (a test seam
   * for exactly that crash; a rejection ends the capture there).
   */
  readonly beforePublish?: (node: NodeId) => Promise<void>;
}

export interface CheckpointStats {
  readonly queued: number;
  readonly skippedFull: number;
  readonly skippedValue: number;
  readonly refusedStaging: number;
  readonly chunksStored: number;
  readonly chunksPublished: number;
  readonly failed: number;
  /** Offered prefixes whose pages were all published and marked durable. */
  readonly durablePrefixes: number;
  /** Captures taken as probes (EV ≤ 0) to re-measure the capture cost. */
  readonly probes: number;
  /** Capture cost per byte: download, re-pack and the local tiers' writes (what admission charges). */
  readonly capturePerByteMs: Estimate;
  /** Per chunk, from the local writes to the most durable tier's confirmation (the S3 upload when configured). */
  readonly confirmWaitMs: Estimate;
}

/** A chunk in the store (local tiers written), waiting for its remote confirmation and its proposal. */
interface StoredChunk {
  readonly group: number;
  readonly descriptor: ChunkDescriptor;
  readonly id: ContentId;
  readonly put: Extract<PutResult, { status: "stored" }>;
  readonly storeMs: number;
  /** performance.now() when the local writes ended. */
  readonly storedAt: number;
}

/** One layer group's part of a capture: its chunks' chain nodes still to capture, over its own page hashes. */
interface GroupJob {
  readonly chunks: GroupChunks;
  /** The group's page hashes of the offered prefix (groupHashes). */
  readonly prefix: readonly PrefixHash[];
  readonly nodes: readonly ChainNode[];
}

interface CaptureJob {
  /** The plain page-hash chain of the offered prefix: its pages are captured wherever the pool holds them. */
  readonly prefix: readonly PrefixHash[];
  readonly pages: PageManager;
  /** Group 0 first; a group with nothing to capture is absent. */
  readonly groups: readonly GroupJob[];
  readonly calibration: Calibration;
  readonly released: () => void;
}

/**
 * Turns sealed, immutable page ranges of a prefix into durable, published chunks.
 *
 * Per layer group (GroupChunks): group g's pages become chunks holding group
 * g's layers, published on group g's chain (group-tagged hashes), so a
 * uniform model is one group and one chain. A sliding group's pages go once
 * outside its window and stay findable only while cached; its chain is
 * captured from the root as far as its pages are still held (a published
 * chunk needs its parent published).
 *
 *   offer (sync, in the loop) ─▶ bounded queue ─▶ one capture at a time:
 *     1. store, for each chunk of the prefix in chain order, while its pages
 *        are held (by a route, or cached in the pool):
 *        beginCapturePrefix (its pages cannot be reused) ─▶ downloadPages
 *        (transfer thread) ─▶ endCapture ─▶ re-pack token-major ─▶ store put
 *        (files, RAM, write-behind to S3)
 *     2. publish, for each stored chunk in chain order:
 *        wait for the store's confirmation ─▶ propose chunk.published + replica.ready
 *     then wait for this worker's replica to apply the last one and mark the
 *     pages the published chunks cover durable (cheaper to evict).
 *
 * Two phases so that the pages are needed only for the local work
 * (milliseconds): the S3 confirmations (tens of ms each, seconds while S3
 * retries) used to sit between the chunks' downloads, and a burst of
 * requests could evict the pages meanwhile and cut the capture short.
 *
 * Confirmation: a put's `durable` promise, which resolves once the most
 * durable configured tier holds the chunk — the S3 upload acknowledged when S3
 * is configured, the fsync'd local file otherwise. A chunk whose confirmation
 * fails is never proposed, nor is any later chunk of the prefix (a child needs
 * its parent published).
 *
 * Bounds: at most `maxQueued` prefixes wait; staging is one chunk's host copy
 * (the next download starts after the previous payload is stored; stored
 * payloads waiting for S3 are the write-behind queue's, bounded by its jobs
 * and bytes); a store whose write-behind queue is full refuses the optional
 * put and the capture's store phase ends there. The loop never waits on any
 * of it.
 */
export class Checkpointer implements RouteCheckpointer {
  private readonly queue: CaptureJob[] = [];
  /** Nodes queued or in capture, so a prefix offered twice is captured once. */
  private readonly pending = new Set<NodeId>();
  private running: Promise<void> | null = null;
  private closed = false;
  private capturePerByte: Estimate;
  private confirmWait: Estimate = { value: 0, samples: 0 };
  /** Offers declined on value since capturePerByte was last measured (admission's re-probe). */
  private declinedSinceSample = 0;
  private readonly groups: readonly GroupChunks[];
  private counters = {
    queued: 0,
    skippedFull: 0,
    skippedValue: 0,
    refusedStaging: 0,
    chunksStored: 0,
    chunksPublished: 0,
    failed: 0,
    durablePrefixes: 0,
    probes: 0,
  };

  constructor(private readonly opts: CheckpointerOptions) {
    if (!Number.isSafeInteger(opts.maxQueued) || opts.maxQueued < 1)
      throw new RangeError(`checkpoint maxQueued must be a positive integer, got ${opts.maxQueued}`);
    if (opts.probeEvery !== undefined && (!Number.isSafeInteger(opts.probeEvery) || opts.probeEvery < 1))
      throw new RangeError(`checkpoint probeEvery must be a positive integer, got ${opts.probeEvery}`);
    if (opts.groups.slots !== opts.geometry.slots)
      throw new RangeError(
        `checkpoint geometry holds ${opts.geometry.slots} layers a page, the groups ${opts.groups.slots}`,
      );
    this.groups = groupChunksOf(opts.groups);
    this.capturePerByte = { value: opts.capturePerByteMs, samples: 0 };
  }

  stats(): CheckpointStats {
    return { ...this.counters, capturePerByteMs: this.capturePerByte, confirmWaitMs: this.confirmWait };
  }

  offer(o: CheckpointOffer): "queued" | "skipped" | "refused" {
    const { chunkTokens: C, geometry, catalog } = this.opts;
    if (this.closed) return "skipped";
    // Staging is one chunk of one group at a time.
    const staging = Math.max(...this.groups.map((gc) => geometry.chunkBytes(C, gc.held)));
    if (staging > this.opts.maxStagingBytes) {
      this.counters.refusedStaging++;
      return "refused";
    }
    const fp = catalog.id.fingerprint;
    const chain = prefixChain(o.tokens, C, o.salt);
    // Per group: nodes a restore can read (published, with a ready replica somewhere) are skipped;
    // the rest is captured: unpublished ones (their parents are published or precede them here), and
    // published ones whose every replica went bad or was removed — so a damaged durable prefix heals
    // on the next request over it instead of ending every later restore at the damage.
    const servable = (n: ChainNode) => this.servable(catalogNodeId(fp, n.hash));
    const groups: GroupJob[] = [];
    for (const gc of this.groups) {
      const gchain = groupChain(chain, gc.group);
      let first = 0;
      while (first < gchain.length && servable(gchain[first]!)) first++;
      const nodes = gchain
        .slice(first)
        .filter((n) => !this.pending.has(catalogNodeId(fp, n.hash)) && !servable(n));
      if (nodes.length === 0 || nodes[0]!.start !== (gchain[first]?.start ?? -1)) continue;
      groups.push({ chunks: gc, prefix: groupHashes(o.prefix, gc.group), nodes });
    }
    if (groups.length === 0) return "skipped";
    const chunkBytes = groups.reduce((n, j) => n + geometry.chunkBytes(C, j.chunks.held), 0);
    const c = o.calibration;
    const decision = captureDecision(
      { tokens: C, bytes: chunkBytes, hits: o.hits },
      {
        prefillPerTokenMs: c.prefillPerTokenMs.value,
        capturePerByteMs: this.capturePerByte.value,
        restorePerByteMs: c.restorePerByteMs.ssd.value,
      },
      {
        declinedSinceSample: this.declinedSinceSample,
        probeEvery: this.opts.probeEvery ?? DEFAULT_PROBE_EVERY,
      },
    );
    this.opts.logger.log("debug", "checkpoint.offer", {
      prefix: o.prefix[o.prefix.length - 1],
      chunks: groups.reduce((n, j) => n + j.nodes.length, 0),
      groups: groups.length,
      hits: o.hits,
      capture: decision.capture,
      probe: decision.probe,
      expectedValueMs: decision.expectedValueMs,
      prefillPerTokenMs: c.prefillPerTokenMs.value,
      restorePerByteMs: c.restorePerByteMs.ssd.value,
      capturePerByteMs: this.capturePerByte.value,
      declinedSinceSample: this.declinedSinceSample,
      queued: this.queue.length,
    });
    if (!decision.capture) {
      this.counters.skippedValue++;
      this.declinedSinceSample++;
      return "skipped";
    }
    if (this.queue.length >= this.opts.maxQueued) {
      this.counters.skippedFull++;
      return "skipped";
    }
    if (decision.probe) {
      this.counters.probes++;
      // One probe in flight at a time: the count restarts, and the probe's measurement resets it too.
      this.declinedSinceSample = 0;
    }
    for (const j of groups) for (const n of j.nodes) this.pending.add(catalogNodeId(fp, n.hash));
    this.queue.push({
      prefix: o.prefix,
      pages: o.pages,
      groups,
      calibration: o.calibration,
      released: o.released,
    });
    this.counters.queued++;
    this.running ??= this.pump();
    return "queued";
  }

  /** Whether the catalog has `node` published with at least one ready replica (any worker, any tier). */
  private servable(node: NodeId): boolean {
    const db = this.opts.catalog.db;
    const c = db.eidOf("chunk/node", node);
    if (c === undefined) return false;
    for (const r of db.replicasOf(c)) if (db.get(r, "replica/state") === "ready") return true;
    return false;
  }

  /** Resolves when every queued capture has finished (stored and published, or given up). */
  async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  /** Takes no more offers; drops queued captures and waits for the one in progress. */
  async close(): Promise<void> {
    this.closed = true;
    this.queue.length = 0;
    await this.idle();
  }

  private async pump(): Promise<void> {
    try {
      for (let job = this.queue.shift(); job; job = this.queue.shift()) {
        try {
          await this.capture(job);
        } catch (err) {
          this.counters.failed++;
          this.opts.logger.log("warn", "checkpoint.failed", {
            prefix: job.prefix[job.prefix.length - 1],
            message: (err as Error).message,
          });
        } finally {
          for (const j of job.groups)
            for (const n of j.nodes)
              this.pending.delete(catalogNodeId(this.opts.catalog.id.fingerprint, n.hash));
        }
      }
    } finally {
      this.running = null;
    }
  }

  /**
   * Phase 1: each group's chunks of the prefix, group 0 first and each
   * group in chain order, downloaded from the
   * device, re-packed and put in the store, while its pages are held. The
   * local writes take milliseconds; the remote confirmation (an S3 upload:
   * tens of ms, seconds while S3 retries) is awaited in phase 2, so the
   * pages are needed only for this short phase and a later request evicting
   * them no longer cuts a capture short while it waits on S3. A group stops
   * at its first chunk whose pages are gone (what was stored before it is
   * still published, a chain's prefix) and the next group goes on; a store
   * refusal ends the phase.
   */
  private async store(job: CaptureJob): Promise<StoredChunk[]> {
    const { catalog, tiers, geometry, pageTokens: P } = this.opts;
    const stored: StoredChunk[] = [];
    for (const group of job.groups) {
      const { chunks: gc } = group;
      for (const node of group.nodes) {
        const end = node.start + node.count;
        const firstPage = Math.floor(node.start / P);
        const pageCount = Math.ceil(end / P) - firstPage;
        const t0 = performance.now();
        let capture: ReturnType<PageManager["beginCapturePrefix"]>;
        try {
          capture = job.pages.beginCapturePrefix(group.prefix, firstPage, pageCount);
        } catch (err) {
          if (!(err instanceof PageError)) throw err;
          this.opts.logger.log("debug", "checkpoint.pages_gone", {
            prefix: job.prefix[job.prefix.length - 1],
            group: gc.group,
            start: node.start,
            reason: err.message,
          });
          break;
        }
        let pageBytes: Uint8Array;
        try {
          pageBytes = await this.opts.engine.downloadPages(capture.pages.map((t) => t.page as PageId));
        } finally {
          job.pages.endCapture(capture.id);
          job.released();
        }
        const payload = packChunk(
          geometry,
          { bytes: pageBytes, firstPageRow: firstPage * P, pageTokens: P },
          node.start,
          node.count,
          gc.held,
        );
        const { descriptor, meta, id } = describeChunk(
          catalog.id.fingerprint,
          catalog.id.layout,
          gc.mask,
          node,
          payload,
        );
        const put = await tiers.store.put(id, payload, meta, "optional");
        if (put.status === "refused") {
          this.counters.skippedFull++;
          this.opts.logger.log("debug", "checkpoint.refused", {
            prefix: job.prefix[job.prefix.length - 1],
            reason: put.reason,
          });
          return stored;
        }
        // The capture's own cost ends with the local writes; the remote tier's
        // confirmation is measured apart (admission.ts says why).
        const storedAt = performance.now();
        this.capturePerByte = smooth(this.capturePerByte, (storedAt - t0) / payload.byteLength, 0.2);
        this.declinedSinceSample = 0;
        stored.push({ group: gc.group, descriptor, id, put, storeMs: storedAt - t0, storedAt });
      }
    }
    return stored;
  }

  /**
   * Phase 2: in chain order, each stored chunk's confirmation awaited, then
   * its facts proposed. A failed confirmation ends the capture there (it
   * throws): neither that chunk nor any later one is proposed, since a child
   * needs its parent published. Returns each group's last chunk proposed.
   */
  private async publish(
    job: CaptureJob,
    stored: readonly StoredChunk[],
  ): Promise<Map<number, ChunkDescriptor>> {
    const { catalog, tiers } = this.opts;
    const me = catalog.id.workerId;
    const last = new Map<number, ChunkDescriptor>();
    for (const { group, descriptor, id, put, storeMs, storedAt } of stored) {
      await put.durable;
      const confirmed = performance.now();
      this.confirmWait = smooth(this.confirmWait, confirmed - storedAt, 0.2);
      this.counters.chunksStored++;
      await this.opts.beforePublish?.(descriptor.node);
      const verifiedAt = Date.now();
      const ops: CatalogOp[] = [
        {
          op: "chunk.published",
          node: descriptor.node,
          prefix: descriptor.prefix,
          parent: descriptor.parent,
          model: catalog.id.fingerprint,
          start: descriptor.start,
          tokens: descriptor.tokens,
          content: id,
          bytes: descriptor.bytes,
          layout: descriptor.layout,
          created: verifiedAt,
        },
      ];
      if (put.files)
        ops.push({ op: "replica.ready", node: descriptor.node, worker: me, tier: "ssd", verifiedAt });
      if (tiers.ram !== undefined && (await tiers.ram.has(id)))
        ops.push({ op: "replica.ready", node: descriptor.node, worker: me, tier: "ram", verifiedAt });
      if (put.remote === "queued")
        ops.push({ op: "replica.ready", node: descriptor.node, worker: me, tier: "s3", verifiedAt });
      const proposing = performance.now();
      await catalog.propose(ops);
      this.counters.chunksPublished++;
      this.opts.logger.log("debug", "checkpoint.published", {
        prefix: job.prefix[job.prefix.length - 1],
        node: descriptor.node,
        start: descriptor.start,
        storeMs,
        confirmMs: confirmed - storedAt,
        proposeMs: performance.now() - proposing,
      });
      last.set(group, descriptor);
    }
    return last;
  }

  private async capture(job: CaptureJob): Promise<void> {
    const { catalog } = this.opts;
    const stored = await this.store(job);
    const last = await this.publish(job, stored);
    const final = stored[stored.length - 1];
    if (final === undefined) return;
    // Pages become durable (restorable, so cheaper to evict) only once their chunks are visible here;
    // the replica applies proposals in order, so the last one proposed applied means all did.
    const applied = await catalog.waitUntil(
      () => catalog.db.eidOf("chunk/node", final.descriptor.node) !== undefined,
      this.opts.publishTimeoutMs,
    );
    if (!applied) return;
    const P = this.opts.pageTokens;
    const costs = residencyCosts(job.calibration, P, this.opts.geometry.pageBytes(P));
    for (const group of job.groups) {
      const l = last.get(group.chunks.group);
      if (l !== undefined)
        job.pages.markDurable(group.prefix.slice(0, Math.floor((l.start + l.tokens) / P)), costs);
    }
    if (stored.length === job.groups.reduce((n, j) => n + j.nodes.length, 0)) this.counters.durablePrefixes++;
  }
}
