import { randomUUID } from "node:crypto";
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";
import { type ApiError, badRequest } from "./errors.ts";

/**
 * Two per-request header policies of the front door.
 *
 * X-Request-Id: the client's, when it sends one that is 1–96 printable ASCII
 * characters without spaces (so it fits in a catalog name with the request's
 * prefix and suffix), else a fresh UUID. A malformed one is refused with a
 * 400 naming the header (answered under a fresh id); either way the id is on
 * every response and in every log line of the request.
 *
 * CORS: off unless `controller.corsOrigins` lists origins ("*" for any). A
 * listed origin gets Access-Control-Allow-Origin on every response and its
 * preflights answered; any other origin gets no CORS headers (the browser
 * then refuses the response), and with CORS off a preflight is a wrong method.
 */

export const REQUEST_ID_HEADER = "x-request-id";
const REQUEST_ID = /^[\x21-\x7e]{1,96}$/;

export interface RequestIdentity {
  /** The id this request is answered and logged under. */
  readonly id: string;
  /** Whether the client chose it. */
  readonly fromClient: boolean;
  /** Set when the client's header was malformed: the request is refused with it. */
  readonly error: ApiError | null;
}

export function requestIdentity(headers: IncomingHttpHeaders): RequestIdentity {
  const raw = headers[REQUEST_ID_HEADER];
  if (raw === undefined) return { id: randomUUID(), fromClient: false, error: null };
  if (typeof raw === "string" && REQUEST_ID.test(raw)) return { id: raw, fromClient: true, error: null };
  return {
    id: randomUUID(),
    fromClient: false,
    error: badRequest("X-Request-Id must be 1-96 printable ASCII characters without spaces", "x-request-id"),
  };
}

const PREFLIGHT_MAX_AGE_S = 600;
const ALLOWED_METHODS = "GET, HEAD, POST";
/** Longest Access-Control-Request-Headers value echoed back. */
const MAX_REQUEST_HEADERS_CHARS = 1024;

export class CorsPolicy {
  private readonly any: boolean;
  private readonly origins: ReadonlySet<string>;

  constructor(origins: readonly string[]) {
    this.any = origins.includes("*");
    this.origins = new Set(origins);
  }

  get enabled(): boolean {
    return this.any || this.origins.size > 0;
  }

  private allows(origin: string | undefined): origin is string {
    return origin !== undefined && (this.any || this.origins.has(origin));
  }

  /** Headers for a response to a request from `origin` (none when it is not allowed). */
  responseHeaders(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
    const origin = headers.origin;
    if (!this.allows(origin)) return {};
    return {
      "access-control-allow-origin": this.any ? "*" : origin,
      "access-control-expose-headers": "X-Request-Id, Retry-After",
      ...(this.any ? {} : { vary: "Origin" }),
    };
  }

  /** Whether a request is a CORS preflight this policy answers. */
  isPreflight(method: string | undefined, headers: IncomingHttpHeaders): boolean {
    return this.enabled && method === "OPTIONS" && headers["access-control-request-method"] !== undefined;
  }

  /** The preflight's answer: 204 with what may follow, or 403 for an origin not listed. */
  preflight(headers: IncomingHttpHeaders): { status: 204 | 403; headers: OutgoingHttpHeaders } {
    if (!this.allows(headers.origin)) return { status: 403, headers: {} };
    const asked = headers["access-control-request-headers"];
    return {
      status: 204,
      headers: {
        ...this.responseHeaders(headers),
        "access-control-allow-methods": ALLOWED_METHODS,
        "access-control-allow-headers":
          typeof asked === "string" && asked.length <= MAX_REQUEST_HEADERS_CHARS
            ? asked
            : "authorization, content-type, x-request-id",
        "access-control-max-age": String(PREFLIGHT_MAX_AGE_S),
      },
    };
  }
}
