/**
 * An error answered to an HTTP client in OpenAI's shape:
 * `{"error": {"message", "type", "param", "code"}}`. Raised before anything
 * is queued, so a bad request changes nothing.
 */
export class ApiError extends Error {
  override readonly name = "ApiError";
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = status === 401
      ? "authentication_error"
      : status >= 500
        ? "server_error"
        : "invalid_request_error",
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export const badRequest = (message: string, param: string | null = null): ApiError =>
  new ApiError(400, message, "invalid_request_error", param);
