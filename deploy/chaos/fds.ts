import { readdirSync, readlinkSync } from "node:fs";

/**
 * Open file descriptors of a process (Linux /proc), split into sockets and
 * the rest (files, pipes, event descriptors): a leaked chunk file or log
 * handle shows in `files`, a connection never closed in `sockets`.
 */
export interface FdProfile {
  readonly files: number;
  readonly sockets: number;
}

export function fdProfile(pid: number): FdProfile | undefined {
  let names: string[];
  try {
    names = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return undefined;
  }
  let sockets = 0;
  let files = 0;
  for (const n of names) {
    let target = "";
    try {
      target = readlinkSync(`/proc/${pid}/fd/${n}`);
    } catch {
      continue; // closed meanwhile
    }
    if (target.startsWith("socket:")) sockets++;
    else files++;
  }
  return { files, sockets };
}
