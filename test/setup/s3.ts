import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type RunningS3Proxy,
  S3_ACCESS_KEY_ID,
  S3_SECRET_ACCESS_KEY,
  startS3Proxy,
} from "../worker/store/s3proxy.ts";

/**
 * Global setup: a real S3-compatible server for the integration suites.
 * When CONTINUUM_S3_ENDPOINT is set, that server is used as it is (with
 * CONTINUUM_S3_ACCESS_KEY_ID / CONTINUUM_S3_SECRET_ACCESS_KEY, defaulting to
 * the deploy script's test credentials). Otherwise S3Proxy is started on a
 * free port through deploy/s3proxy.sh (the first run downloads it from Maven
 * Central) and stopped at teardown. Test files run in forked workers started
 * after this, so they inherit the variables set here.
 */
export default async function setup(): Promise<(() => Promise<void>) | undefined> {
  process.env.CONTINUUM_S3_ACCESS_KEY_ID ??= S3_ACCESS_KEY_ID;
  process.env.CONTINUUM_S3_SECRET_ACCESS_KEY ??= S3_SECRET_ACCESS_KEY;
  process.env.CONTINUUM_S3_REGION ??= "us-east-1";
  if (process.env.CONTINUUM_S3_ENDPOINT) return undefined;
  const dataDir = await mkdtemp(join(tmpdir(), "continuum-s3-"));
  let server: RunningS3Proxy;
  try {
    server = await startS3Proxy(dataDir);
  } catch (err) {
    await rm(dataDir, { recursive: true, force: true });
    throw err;
  }
  process.env.CONTINUUM_S3_ENDPOINT = server.endpoint;
  return async () => {
    await server.stop();
    await rm(dataDir, { recursive: true, force: true });
    delete process.env.CONTINUUM_S3_ENDPOINT;
  };
}
