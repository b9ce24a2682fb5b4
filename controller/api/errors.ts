/**
 * An error answered to an HTTP client in OpenAI's shape:
 * `{"error": {"message", "type", "param", "code"}}`. Raised before anything
 * is queued, so a bad request changes nothing.
 *
 * Types follow OpenAI's: 401 authentication_error, 403 permission_error,
 * 429 rate_limit_exceeded, 5xx server_error, any other 4xx
 * invalid_request_error. A 429 or 503 tells the client when to try again
 * (`Retry-After`, seconds); the server sets the header from `retryAfterS`.
 */
export class ApiError extends Error {
  override readonly name = "ApiError";
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = defaultType(status),
    readonly param: string | null = null,
    readonly code: string | null = defaultCode(status),
    /** Seconds the client should wait before retrying (429 and 503 only). */
    readonly retryAfterS: number | null = status === 429 || status === 503 ? 1 : null,
  ) {
    super(message);
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

function defaultType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 429) return "rate_limit_exceeded";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

function defaultCode(status: number): string | null {
  if (status === 429) return "rate_limit_exceeded";
  if (status === 503) return "service_unavailable";
  return null;
}

export const badRequest = (
  message: string,
  param: string | null = null,
  code: string | null = null,
): ApiError => new ApiError(400, message, "invalid_request_error", param, code);

/** The server cannot take this now (a full queue, a worker stopping): retry after `retryAfterS`. */
export const unavailable = (message: string, retryAfterS = 1, code = "service_unavailable"): ApiError =>
  new ApiError(503, message, "server_error", null, code, retryAfterS);
