import type { WorkerStatus } from "../../schema/control.ts";
import { liveWorkers } from "../heartbeat-view.ts";
import { CounterView, Gauge, type Registry } from "../metrics.ts";
import type { HubCounters, WorkerHub } from "./hub.ts";
import type { FleetCounters } from "./service.ts";

/**
 * The fleet controller's own figures on /metrics, read from the counters the
 * hub and the fleet service keep where the events happen (no second count):
 *
 *   continuum_assignment_events_total{event}   offers, declines, timeouts,
 *       worker losses (crash fallbacks), late messages of old attempts
 *       ignored, requests completed / failed / refused for want of a worker;
 *   continuum_heartbeats_total{outcome}        accepted or stale (an older version);
 *   continuum_heartbeats_expired_total         workers whose heartbeat TTL ran out;
 *   continuum_worker_connections_total{outcome} accepted sockets, refused
 *       upgrades (bad credential, full), sockets closed for a bad frame;
 *   continuum_workers{state}                   live (fresh heartbeat) and connected now;
 *   continuum_catalog_offset                   transactions applied to the controller's replica;
 *
 * and the workers' own cache figures, from the status each sends with its
 * heartbeats (cumulative per worker process), summed over the workers whose
 * newest heartbeat the hub holds — so these are gauges: a worker that leaves
 * takes its counts with it:
 *
 *   continuum_fleet_restored_chunks{tier}      chunks restored into pages, by the tier that served them
 *   continuum_fleet_restored_bytes{tier}       their bytes
 *   continuum_fleet_prompt_tokens{source}      prompt tokens served from own resident pages, or computed
 *
 * (continuum_cache_tokens{source}, from the service, counts what the router
 * planned per completed request; these count what the workers did.)
 *
 * Every label value is one of the fixed names below, never a request or worker id.
 */

export interface FleetMetricSources {
  readonly hub: Pick<WorkerHub, "view" | "nowMs" | "connectedWorkers"> & { readonly counters: HubCounters };
  readonly service: { readonly counters: FleetCounters };
  readonly heartbeatTtlMs: number;
  /** The controller replica's applied offset (absent: no catalog attached). */
  readonly catalogOffset?: () => number;
}

/** Assignment event label → the service counter that holds it. */
const ASSIGNMENT_EVENTS: ReadonlyArray<readonly [string, keyof FleetCounters]> = [
  ["offered", "attempts"],
  ["declined", "declines"],
  ["timed_out", "timeouts"],
  ["worker_lost", "workerLost"],
  ["late_ignored", "lateIgnored"],
  ["completed", "completed"],
  ["failed", "failed"],
  ["refused_no_worker", "refusedNoWorker"],
];

const TIERS = ["ram", "ssd", "peer", "s3"] as const;

/** Statuses of the workers whose newest heartbeat the hub holds (and that report one). */
function statuses(hub: FleetMetricSources["hub"]): WorkerStatus[] {
  const out: WorkerStatus[] = [];
  for (const e of hub.view.entries.values()) if (e.heartbeat?.status) out.push(e.heartbeat.status);
  return out;
}

function sumByTier(
  list: readonly WorkerStatus[],
  pick: (s: WorkerStatus) => Readonly<Record<(typeof TIERS)[number], number>>,
): ReadonlyArray<readonly [{ tier: string }, number]> {
  return TIERS.map((tier) => [{ tier }, list.reduce((a, s) => a + pick(s)[tier], 0)] as const);
}

export function registerFleetMetrics(registry: Registry, src: FleetMetricSources): void {
  const { hub, service } = src;
  registry.add(
    new CounterView(
      "continuum_assignment_events_total",
      "Fenced assignment events: offered, declined, timed_out, worker_lost (crash fallback), late_ignored (a message of an old attempt), completed, failed, refused_no_worker.",
      () => ASSIGNMENT_EVENTS.map(([event, key]) => [{ event }, service.counters[key]] as const),
    ),
  );
  registry.add(
    new CounterView(
      "continuum_heartbeats_total",
      "Worker heartbeats received: accepted, or stale (an older epoch/sequence, dropped).",
      () => [
        [{ outcome: "accepted" }, hub.counters.heartbeatsAccepted],
        [{ outcome: "stale" }, hub.counters.heartbeatsStale],
      ],
    ),
  );
  registry.add(
    new CounterView(
      "continuum_heartbeats_expired_total",
      "Workers whose heartbeat was older than the TTL (taken offline, their work failed over).",
      () => [[{}, hub.counters.expired]],
    ),
  );
  registry.add(
    new CounterView(
      "continuum_worker_connections_total",
      "Worker socket upgrades: accepted, refused (bad or missing credential, too many), closed_bad_frame.",
      () => [
        [{ outcome: "accepted" }, hub.counters.connections],
        [{ outcome: "refused" }, hub.counters.refusedUpgrades],
        [{ outcome: "closed_bad_frame" }, hub.counters.closedForBadFrames],
      ],
    ),
  );
  registry.add(
    new Gauge("continuum_workers", "Workers now: live (heartbeat within the TTL) and connected.", () => [
      [{ state: "live" }, liveWorkers(hub.view, hub.nowMs(), src.heartbeatTtlMs).length],
      [{ state: "connected" }, hub.connectedWorkers().length],
    ]),
  );
  registry.add(
    new Gauge(
      "continuum_fleet_restored_chunks",
      "Chunks the workers restored into pages, by the tier that served them (sum of their heartbeat status).",
      () => sumByTier(statuses(hub), (s) => s.restoredChunks),
    ),
  );
  registry.add(
    new Gauge(
      "continuum_fleet_restored_bytes",
      "Bytes the workers restored into pages, by tier (sum of their heartbeat status).",
      () => sumByTier(statuses(hub), (s) => s.restoredBytes),
    ),
  );
  registry.add(
    new Gauge(
      "continuum_fleet_prompt_tokens",
      "Prompt tokens the workers served from their own resident pages or computed (sum of their heartbeat status).",
      () => {
        const list = statuses(hub);
        return [
          [{ source: "resident" }, list.reduce((a, s) => a + s.residentHitTokens, 0)],
          [{ source: "computed" }, list.reduce((a, s) => a + s.computedTokens, 0)],
        ];
      },
    ),
  );
  const offset = src.catalogOffset;
  if (offset)
    registry.add(
      new Gauge(
        "continuum_catalog_offset",
        "Catalog transactions applied to the controller's replica.",
        () => [[{}, offset()]],
      ),
    );
}
