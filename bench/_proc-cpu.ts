import { readFileSync } from "node:fs";

/**
 * CPU seconds spent, read from Linux's /proc: by the machine (all cores, busy
 * time) and by named processes, so a bench can say who used the cores during
 * a phase. On a host without /proc every reading is null.
 *
 * Clock ticks are USER_HZ, which Linux fixes at 100 on every architecture we run.
 */
const TICKS_PER_S = 100;

/** Busy ticks of the whole machine: every /proc/stat cpu field but idle and iowait. */
function machineTicks(): number | null {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!;
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    const total = f.slice(0, 8).reduce((a, b) => a + b, 0);
    return total - (f[3] ?? 0) - (f[4] ?? 0);
  } catch {
    return null;
  }
}

/** utime + stime of one process (its own, not its children's), or null when it is gone. */
function processTicks(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the parenthesised command name, which may itself hold spaces: state is field 3, utime 14, stime 15.
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return Number(rest[11]) + Number(rest[12]);
  } catch {
    return null;
  }
}

export interface CpuReading {
  readonly machine: number | null;
  readonly byName: ReadonlyMap<string, number | null>;
}

/** Ticks now, of the machine and of each named pid. */
export function readCpu(pids: ReadonlyMap<string, number>): CpuReading {
  const byName = new Map<string, number | null>();
  for (const [name, pid] of pids) byName.set(name, processTicks(pid));
  return { machine: machineTicks(), byName };
}

/**
 * CPU seconds between two readings: `machine` (busy, all cores), each name's,
 * and `other` = machine − Σ named (the services and the bench itself).
 */
export function cpuSecondsBetween(a: CpuReading, b: CpuReading): Record<string, number | null> {
  const out: Record<string, number | null> = {};
  let named = 0;
  let complete = true;
  for (const [name, t0] of a.byName) {
    const t1 = b.byName.get(name);
    const d = t0 === null || t1 === null || t1 === undefined ? null : (t1 - t0) / TICKS_PER_S;
    out[name] = d;
    if (d === null) complete = false;
    else named += d;
  }
  const machine = a.machine === null || b.machine === null ? null : (b.machine - a.machine) / TICKS_PER_S;
  out.machine = machine;
  out.other = machine === null || !complete ? null : Math.max(0, machine - named);
  return out;
}
