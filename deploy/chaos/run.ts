import { Prng } from "../../controller/sim/prng.ts";
import { sleep } from "../../schema/abort.ts";
import { call } from "./client.ts";
import { type FdProfile, fdProfile } from "./fds.ts";
import { probeVerdict, requestVerdicts, type Verdict } from "./invariants.ts";
import { type Fault, type FaultKind, planFaults } from "./plan.ts";
import type { ChaosTarget } from "./target.ts";
import { Workload, type WorkloadFigures } from "./workload.ts";

/**
 * One chaos run against a target: a clean probe run, then a steady workload
 * (good, malformed, slow and idle clients) while the seeded plan's faults
 * hit (kill -9 of each role, a second process on a data dir, a full disk, a
 * paused S3), then the invariants once everything has healed. The report
 * carries the figures an operator reads (`continuum soak`) and the verdicts
 * a test asserts (test/e2e/chaos.test.ts).
 */

export interface ChaosOptions {
  readonly seed: number;
  /** The faulty phase; the probes and the checks come on top. */
  readonly durationMs: number;
  /** Faults in the plan (≥ kinds + roles covers every kind and every role's kill). */
  readonly faults: number;
  readonly clients: number;
  readonly progress: (line: string) => void;
}

export interface ChaosReport {
  readonly target: string;
  readonly seed: number;
  readonly durationMs: number;
  readonly requests: WorkloadFigures;
  readonly kills: Record<string, number>;
  readonly faults: Record<string, number>;
  /** Fault kinds this target could not apply here, and why. */
  readonly skipped: Readonly<Record<string, string>>;
  readonly verdicts: readonly Verdict[];
  readonly ok: boolean;
}

/** Greedy probes: the same token ids and settings in the clean run and after the chaos. */
function probeBodies(model: string, vocab: number): string[] {
  const rng = new Prng(7);
  const tokens = (n: number) => Array.from({ length: n }, () => rng.int(1, vocab - 1));
  const long = tokens(530);
  return [tokens(12), long, [...long.slice(0, 300), ...tokens(40)]].map((prompt) =>
    JSON.stringify({ model, prompt, max_tokens: 8, temperature: 0 }),
  );
}

async function runProbes(t: ChaosTarget): Promise<string[]> {
  const out: string[] = [];
  for (const body of probeBodies(t.model, t.vocab)) {
    const r = await call({ url: t.url, method: "POST", path: "/v1/completions", body, deadlineMs: 120_000 });
    if (r.kind !== "ok") throw new Error(`probe failed: ${r.kind === "failed" ? r.reason : "hung"}`);
    out.push((JSON.parse(r.body) as { choices: { text: string }[] }).choices[0]!.text);
  }
  return out;
}

/**
 * Bounds of "back to baseline", per process: every file descriptor that is
 * not a socket (chunk files, logs, pipes) as many as at the start plus
 * FILE_SLACK (the embedded log and lock files are held for life; a chunk
 * file open at the instant of the reading), and sockets at most
 * SOCKET_SLACK more — the S3 client keeps up to 32 idle keep-alive
 * connections (worker/store/s3.ts maxSockets) and Kafka clients one per
 * broker connection, so a fixed count would flake without showing a leak.
 */
const FILE_SLACK = 2;
const SOCKET_SLACK = 34;
const FD_SETTLE_MS = 20_000;

async function fdVerdict(
  t: ChaosTarget,
  base: Readonly<Record<string, FdProfile | undefined>>,
): Promise<Verdict> {
  const deadline = Date.now() + FD_SETTLE_MS;
  let worst = "";
  for (;;) {
    worst = "";
    for (const [role, pid] of Object.entries(t.pids())) {
      const b = base[role];
      const now = fdProfile(pid);
      if (b === undefined || now === undefined) continue;
      if (now.files > b.files + FILE_SLACK || now.sockets > b.sockets + SOCKET_SLACK)
        worst += `${role}: files ${b.files}→${now.files}, sockets ${b.sockets}→${now.sockets}; `;
    }
    if (worst === "" || Date.now() > deadline) break;
    await sleep(500);
  }
  const detail = Object.entries(t.pids())
    .map(([role, pid]) => {
      const b = base[role];
      const n = fdProfile(pid);
      return `${role} files ${b?.files}→${n?.files} sockets ${b?.sockets}→${n?.sockets}`;
    })
    .join(", ");
  return { name: "file descriptors back to baseline", ok: worst === "", detail: worst || detail };
}

async function apply(
  t: ChaosTarget,
  f: Fault,
  counts: { kills: Record<string, number>; faults: Record<string, number> },
  verdicts: Verdict[],
  progress: (l: string) => void,
): Promise<void> {
  progress(
    `fault ${f.kind}${f.kind === "kill" || f.kind === "second_owner" ? ` ${f.role}` : ` for ${f.holdMs} ms`}`,
  );
  counts.faults[f.kind] = (counts.faults[f.kind] ?? 0) + 1;
  switch (f.kind) {
    case "kill":
      counts.kills[f.role] = (counts.kills[f.role] ?? 0) + 1;
      await t.kill(f.role);
      return;
    case "second_owner": {
      const r = await t.secondOwner(f.role);
      if (!r.refused)
        verdicts.push({
          name: "a second process on a data dir is refused at once",
          ok: false,
          detail: r.detail,
        });
      return;
    }
    case "disk_full":
      t.fillDisk();
      await sleep(f.holdMs);
      t.freeDisk();
      return;
    case "s3_pause":
      t.pauseS3();
      await sleep(f.holdMs);
      t.resumeS3();
      return;
  }
}

export async function runChaos(t: ChaosTarget, opts: ChaosOptions): Promise<ChaosReport> {
  const began = performance.now();
  const o = {
    ...opts,
    progress: (l: string) => opts.progress(`[${((performance.now() - began) / 1000).toFixed(1)} s] ${l}`),
  };
  const rng = new Prng(o.seed);
  const planRng = rng.fork();
  const workRng = rng.fork();
  o.progress(`chaos ${t.name}: seed ${o.seed} (CONTINUUM_CHAOS_SEED=${o.seed} reproduces the plan)`);
  const clean = await runProbes(t);
  const base: Record<string, FdProfile | undefined> = {};
  for (const [role, pid] of Object.entries(t.pids())) base[role] = fdProfile(pid);
  const kinds = t.kinds.filter((k): k is FaultKind => k !== undefined);
  const plan = planFaults(planRng, {
    durationMs: o.durationMs,
    count: o.faults,
    kinds,
    roles: t.roles,
    ownerRole: t.ownerRole,
  });
  o.progress(
    `plan: ${plan.map((f) => `${f.atMs}ms ${f.kind}${f.kind === "kill" ? `:${f.role}` : ""}`).join(", ")}`,
  );
  const work = new Workload(
    {
      url: () => t.url,
      model: t.model,
      vocab: t.vocab,
      clients: o.clients,
      malformedEvery: 5,
      deadlineMs: 60_000,
      idle: 32,
    },
    workRng,
  );
  const verdicts: Verdict[] = [];
  const counts = { kills: {} as Record<string, number>, faults: {} as Record<string, number> };
  const t0 = performance.now();
  work.start();
  let figures: WorkloadFigures;
  try {
    for (const f of plan) {
      const wait = t0 + f.atMs - performance.now();
      if (wait > 0) await sleep(wait);
      await apply(t, f, counts, verdicts, o.progress);
    }
    const rest = t0 + o.durationMs - performance.now();
    if (rest > 0) await sleep(rest);
  } finally {
    figures = await work.stop();
  }
  if (!verdicts.some((v) => v.name.startsWith("a second process")) && (counts.faults.second_owner ?? 0) > 0)
    verdicts.push({
      name: "a second process on a data dir is refused at once",
      ok: true,
      detail: `${counts.faults.second_owner} refused, naming the owner's pid`,
    });
  o.progress("faults over; settling");
  await t.settle();
  verdicts.push(...requestVerdicts(figures));
  o.progress("probes");
  verdicts.push(probeVerdict(clean, await runProbes(t)));
  o.progress("file descriptors");
  verdicts.push(await fdVerdict(t, base));
  o.progress("pages");
  verdicts.push(...(await t.pagesVerdicts()));
  o.progress("catalog and replicas");
  verdicts.push(...(await t.stateVerdicts()));
  o.progress("done");
  return {
    target: t.name,
    seed: o.seed,
    durationMs: o.durationMs,
    requests: figures,
    kills: counts.kills,
    faults: counts.faults,
    skipped: t.skipped,
    verdicts,
    ok: verdicts.every((v) => v.ok),
  };
}

/** The report as an operator reads it: figures first, then each verdict. */
export function formatReport(r: ChaosReport): string {
  const g = r.requests.good;
  const lines = [
    `chaos ${r.target}, seed ${r.seed}, ${Math.round(r.durationMs / 1000)} s of faults: ${r.ok ? "all invariants hold" : "INVARIANTS VIOLATED"}`,
    `  requests: ${g.count} good (${g.ok} ok, ${Object.values(g.failed).reduce((a, b) => a + b, 0)} failed with a reason, ${g.hung} hung); ` +
      `${r.requests.malformed.count} malformed (${r.requests.malformed.rejected} refused clearly); ` +
      `${r.requests.slow.count} slow (${r.requests.slow.ok} answered); ${r.requests.idle.opened} idle connections (${r.requests.idle.endedByServer} closed or refused by the server)`,
    `  failures by reason: ${JSON.stringify(g.failed)}`,
    `  kills: ${JSON.stringify(r.kills)}; faults: ${JSON.stringify(r.faults)}${Object.keys(r.skipped).length ? `; skipped: ${JSON.stringify(r.skipped)}` : ""}`,
    ...r.verdicts.map((v) => `  ${v.ok ? "ok  " : "FAIL"} ${v.name}: ${v.detail}`),
  ];
  return lines.join("\n");
}
