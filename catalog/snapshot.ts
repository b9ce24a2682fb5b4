import { createHash } from "node:crypto";
import { mkdir, open, readdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { CatalogDb } from "./db.ts";

/**
 * Catalog snapshots: the serialized db at a tx-log offset, so a new replica
 * starts from the newest one and replays only the txs after it.
 *
 * A snapshot at offset N holds exactly the txs at log offsets [0, N) (txNo 1..N);
 * its key sorts by offset. The object is `sha256(db bytes) ‖ db bytes`, so a
 * torn or corrupted object is detected and the next older one is used.
 *
 * Stores implement the minimal `SnapshotStore`: `DirSnapshotStore` here (a
 * local directory) and `S3SnapshotStore` in snapshot-s3.ts (the object
 * store, so a replica on any machine starts from the newest snapshot).
 */
export interface SnapshotStore {
  put(key: string, bytes: Uint8Array): Promise<void>;
  /** The object, or undefined when the key is absent. */
  get(key: string): Promise<Uint8Array | undefined>;
  list(): Promise<string[]>;
  delete(key: string): Promise<void>;
}

const PREFIX = "catalog-snapshot-";
const SUFFIX = ".bin";
/** `catalog-snapshot-<offset>[.p<position>].bin`, both 16 digits: keys sort by offset. */
const KEY = /^catalog-snapshot-(\d{16})(?:\.p(\d{16}))?\.bin$/;
/** Snapshots kept; older ones are deleted after a newer one is stored. */
export const SNAPSHOTS_KEPT = 3;

export class SnapshotError extends Error {
  override readonly name = "SnapshotError";
}

/**
 * The key of the snapshot at `offset`; `position` is the log's LogRecord.position
 * of the last tx it holds (where a replica starting from it resumes reading).
 */
export function snapshotKey(offset: number, position?: number): string {
  if (!Number.isSafeInteger(offset) || offset < 0) throw new SnapshotError(`bad snapshot offset ${offset}`);
  if (position !== undefined && (!Number.isSafeInteger(position) || position < 0))
    throw new SnapshotError(`bad snapshot log position ${position}`);
  const at = position === undefined ? "" : `.p${String(position).padStart(16, "0")}`;
  return `${PREFIX}${String(offset).padStart(16, "0")}${at}${SUFFIX}`;
}

export function snapshotOffset(key: string): number | undefined {
  const m = KEY.exec(key);
  return m ? Number(m[1]) : undefined;
}

/** The log position a snapshot key carries, or undefined (none recorded, or not a snapshot key). */
export function snapshotPosition(key: string): number | undefined {
  const m = KEY.exec(key);
  return m?.[2] === undefined ? undefined : Number(m[2]);
}

/** Files in one directory, written atomically (temp file, fsync, rename). */
export class DirSnapshotStore implements SnapshotStore {
  constructor(readonly dir: string) {}

  private path(key: string): string {
    if (!/^[A-Za-z0-9._-]{1,200}$/.test(key) || key.startsWith("."))
      throw new SnapshotError(`bad snapshot key ${JSON.stringify(key)}`);
    return join(this.dir, key);
  }

  async put(key: string, bytes: Uint8Array): Promise<void> {
    const path = this.path(key);
    await mkdir(this.dir, { recursive: true });
    const tmp = `${path}.tmp-${process.pid}`;
    const f = await open(tmp, "w");
    try {
      await f.writeFile(bytes);
      await f.sync();
    } finally {
      await f.close();
    }
    await rename(tmp, path);
  }

  async get(key: string): Promise<Uint8Array | undefined> {
    try {
      return new Uint8Array(await readFile(this.path(key)));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
  }

  async list(): Promise<string[]> {
    try {
      return (await readdir(this.dir)).filter((f) => !f.includes(".tmp-")).sort();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    await rm(this.path(key), { force: true });
  }
}

function seal(db: Uint8Array): Uint8Array {
  const out = new Uint8Array(32 + db.length);
  out.set(createHash("sha256").update(db).digest(), 0);
  out.set(db, 32);
  return out;
}

function unseal(key: string, bytes: Uint8Array): Uint8Array {
  if (bytes.length < 32) throw new SnapshotError(`${key}: truncated (${bytes.length} bytes)`);
  const body = bytes.subarray(32);
  const sum = createHash("sha256").update(body).digest();
  if (!sum.equals(bytes.subarray(0, 32))) throw new SnapshotError(`${key}: checksum mismatch`);
  return body;
}

/**
 * Stores the db as the snapshot at its offset (= txs applied), with the log
 * position of its last tx when the log has one, and keeps the newest SNAPSHOTS_KEPT.
 */
export async function writeSnapshot(store: SnapshotStore, db: CatalogDb, position?: number): Promise<string> {
  const key = snapshotKey(db.lastTxNo, position);
  await store.put(key, seal(db.serialize()));
  const keys = (await store.list()).filter((k) => snapshotOffset(k) !== undefined).sort();
  for (const old of keys.slice(0, Math.max(0, keys.length - SNAPSHOTS_KEPT))) await store.delete(old);
  return key;
}

/**
 * The newest readable snapshot, or undefined when there is none. A corrupted
 * one is reported through `warn` and skipped for the next older.
 */
export async function loadLatestSnapshot(
  store: SnapshotStore,
  warn: (msg: string) => void = () => {},
): Promise<{ offset: number; position?: number; db: CatalogDb } | undefined> {
  const keys = (await store.list())
    .filter((k) => snapshotOffset(k) !== undefined)
    .sort()
    .reverse();
  for (const key of keys) {
    const bytes = await store.get(key);
    if (bytes === undefined) continue;
    try {
      const db = CatalogDb.deserialize(unseal(key, bytes));
      const offset = snapshotOffset(key)!;
      if (db.lastTxNo !== offset) throw new SnapshotError(`${key}: holds ${db.lastTxNo} txs, not ${offset}`);
      const position = snapshotPosition(key);
      return position === undefined ? { offset, db } : { offset, position, db };
    } catch (err) {
      warn(`skipping catalog snapshot ${key}: ${(err as Error).message}`);
    }
  }
  return undefined;
}
