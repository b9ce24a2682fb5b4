import type { Kafka, Producer, ProducerConfig } from "kafkajs";
import { CatalogLogError } from "../log.ts";

/**
 * A transactional kafkajs producer that remembers its coordinators.
 *
 * Why: kafkajs 2.2.4 asks the cluster for the transaction coordinator before
 * every AddPartitionsToTxn, AddOffsetsToTxn and EndTxn, and for the group
 * coordinator before every TxnOffsetCommit, and never caches the answer: four
 * FindCoordinator round trips in each writer transaction of about ten, each
 * on every proposal's apply lag and on the broker's CPU (measurements:
 * bench/catalog.md).
 *
 * What: the producer's cluster answers FindCoordinator from a cache of at
 * most MAX_ENTRIES entries, each trusted for `ttlMs`. A coordinator only moves
 * when a broker fails or partition leadership changes; then a request to the
 * stale coordinator fails with NOT_COORDINATOR, kafkajs retries it, and the
 * retries reach the new coordinator once the entry expires — so a move costs
 * at most ttlMs of retries (the retry budget is about a minute). A lookup that
 * fails is not cached.
 *
 * How: kafkajs builds a producer's cluster through the Kafka instance's
 * private `private:Kafka:createCluster` function, synchronously inside
 * `kafka.producer()`. We wrap that function for the one call and wrap the
 * cluster's findGroupCoordinator. kafkajs is pinned (package.json), and
 * test/catalog/kafka/coordinators.test.ts counts the FindCoordinator
 * requests of real transactions, so an upgrade that moves these internals
 * fails that test, or this function throws, instead of silently losing the
 * cache.
 */
export function producerWithCachedCoordinators(
  kafka: Kafka,
  config: ProducerConfig,
  ttlMs: number,
): Producer {
  if (!Number.isFinite(ttlMs) || ttlMs <= 0) {
    throw new CatalogLogError(`coordinator cache ttlMs must be a positive number, got ${ttlMs}`);
  }
  const k = kafka as unknown as Record<symbol, unknown>;
  const key = Object.getOwnPropertySymbols(kafka).find((s) => s.description === CREATE_CLUSTER);
  const create = key === undefined ? undefined : k[key];
  if (key === undefined || typeof create !== "function") {
    throw new CatalogLogError(
      `kafkajs internals changed: no ${CREATE_CLUSTER} on the Kafka client (the coordinator cache is written for kafkajs 2.2.4)`,
    );
  }
  let wrapped = 0;
  k[key] = (opts: unknown) => {
    const cluster = create(opts) as Cluster;
    if (typeof cluster.findGroupCoordinator !== "function") {
      throw new CatalogLogError("kafkajs internals changed: the cluster has no findGroupCoordinator");
    }
    cacheCoordinators(cluster, ttlMs);
    wrapped++;
    return cluster;
  };
  try {
    const producer = kafka.producer(config);
    if (wrapped !== 1) {
      throw new CatalogLogError(
        `kafkajs internals changed: producer() built ${wrapped} clusters, expected 1`,
      );
    }
    return producer;
  } finally {
    k[key] = create;
  }
}

const CREATE_CLUSTER = "private:Kafka:createCluster";

/** Distinct (coordinator type, group or transactional id) keys one producer asks about: its transactional id and the writer's group; the bound only guards against misuse. */
const MAX_ENTRIES = 16;

interface CoordinatorQuery {
  readonly groupId: string;
  readonly coordinatorType?: number;
}

interface Cluster {
  findGroupCoordinator(q: CoordinatorQuery): Promise<unknown>;
}

function cacheCoordinators(cluster: Cluster, ttlMs: number): void {
  const lookup = cluster.findGroupCoordinator.bind(cluster);
  const cache = new Map<string, { readonly at: number; readonly broker: Promise<unknown> }>();
  cluster.findGroupCoordinator = (q: CoordinatorQuery) => {
    const id = `${q.coordinatorType ?? 0}:${q.groupId}`;
    const now = performance.now();
    const hit = cache.get(id);
    if (hit !== undefined && now - hit.at < ttlMs) return hit.broker;
    const broker = lookup(q);
    cache.delete(id);
    if (cache.size >= MAX_ENTRIES) cache.delete(cache.keys().next().value!);
    cache.set(id, { at: now, broker });
    broker.catch(() => {
      if (cache.get(id)?.broker === broker) cache.delete(id);
    });
    return broker;
  };
}
