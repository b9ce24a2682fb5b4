/**
 * Typed reads of config.json values, each refusing a wrong value with a
 * ModelConfigError that names the key (its path, for nested keys).
 */
export type Json = Record<string, unknown>;

export class ModelConfigError extends Error {
  override readonly name = "ModelConfigError";
  constructor(
    readonly key: string,
    message: string,
  ) {
    super(`config.json: ${key}: ${message}`);
  }
}

const absent = (v: unknown) => v === undefined || v === null;

export function posInt(obj: Json, key: string, path = key): number {
  const v = obj[key];
  if (absent(v)) throw new ModelConfigError(path, "missing (a positive integer)");
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0)
    throw new ModelConfigError(path, `must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}

export function optPosInt(obj: Json, key: string, fallback: number, path = key): number {
  return absent(obj[key]) ? fallback : posInt(obj, key, path);
}

export function nonNegInt(obj: Json, key: string, fallback: number): number {
  const v = obj[key];
  if (absent(v)) return fallback;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0)
    throw new ModelConfigError(key, `must be a non-negative integer, got ${JSON.stringify(v)}`);
  return v;
}

export function posFloat(obj: Json, key: string, fallback: number | undefined, path = key): number {
  const v = obj[key];
  if (absent(v)) {
    if (fallback === undefined) throw new ModelConfigError(path, "missing (a positive number)");
    return fallback;
  }
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0)
    throw new ModelConfigError(path, `must be a positive finite number, got ${JSON.stringify(v)}`);
  return v;
}

/**
 * A positive number where null means "off" (soft-capping): absent takes the
 * architecture's default, which may itself be off.
 */
export function posFloatOrOff(obj: Json, key: string, fallback: number | null): number | null {
  const v = obj[key];
  if (v === undefined) return fallback;
  if (v === null) return null;
  return posFloat(obj, key, undefined);
}

export function optBool(obj: Json, key: string, fallback: boolean): boolean {
  const v = obj[key];
  if (absent(v)) return fallback;
  if (typeof v !== "boolean")
    throw new ModelConfigError(key, `must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

export function optString(obj: Json, key: string, fallback: string, path = key): string {
  const v = obj[key];
  if (absent(v)) return fallback;
  if (typeof v !== "string") throw new ModelConfigError(path, `must be a string, got ${JSON.stringify(v)}`);
  return v;
}

/** A list of positive finite numbers of exactly `length` entries. */
export function posFloats(obj: Json, key: string, length: number, path = key): number[] {
  const v = obj[key];
  if (!Array.isArray(v)) throw new ModelConfigError(path, `must be a list of ${length} positive numbers`);
  if (v.length !== length)
    throw new ModelConfigError(path, `must have ${length} entries (head_dim / 2), got ${v.length}`);
  for (const [i, x] of v.entries())
    if (typeof x !== "number" || !Number.isFinite(x) || x <= 0)
      throw new ModelConfigError(
        `${path}[${i}]`,
        `must be a positive finite number, got ${JSON.stringify(x)}`,
      );
  return v as number[];
}

export function tokenId(v: unknown, key: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0)
    throw new ModelConfigError(key, `must be a token id (a non-negative integer), got ${JSON.stringify(v)}`);
  return v;
}

export function tokenIds(cfg: Json, key: string): number[] {
  const v = cfg[key];
  if (absent(v)) return [];
  if (Array.isArray(v)) return v.map((x, i) => tokenId(x, `${key}[${i}]`));
  return [tokenId(v, key)];
}

/** Refuses `key` when present with anything but `allowed` (or null). */
export function onlyValue(obj: Json, key: string, allowed: unknown, why: string): void {
  const v = obj[key];
  if (!absent(v) && v !== allowed)
    throw new ModelConfigError(key, `${JSON.stringify(v)} is not supported (${why})`);
}
