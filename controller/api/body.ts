import type { IncomingMessage } from "node:http";
import { ApiError, badRequest } from "./errors.ts";

/**
 * A request body as JSON, checked in the order that costs least: the
 * declared content type (415 unless JSON, in UTF-8), the declared length
 * (413 before a byte is read when it is over the limit), the bytes read
 * (413 once they pass it), strict UTF-8 (400: a replacement character would
 * silently change the prompt), then JSON (400). JSON.parse takes any nesting
 * depth without recursion; values are described, never echoed, in errors.
 */

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json$/i;

/** 415 unless the content type is JSON (application/json or application/…+json) in UTF-8. */
export function checkJsonContentType(header: string | undefined): void {
  const [type = "", ...params] = (header ?? "").split(";").map((p) => p.trim());
  if (!JSON_TYPE.test(type))
    throw new ApiError(
      415,
      header === undefined
        ? "the request has no content-type; send the body as application/json"
        : `content-type ${JSON.stringify(type.slice(0, 64))} is not supported; send the body as application/json`,
      "invalid_request_error",
      null,
      "unsupported_media_type",
    );
  for (const p of params) {
    const [k, v = ""] = p.split("=").map((x) => x.trim().toLowerCase());
    if (k === "charset" && v.replace(/"/g, "") !== "utf-8" && v.replace(/"/g, "") !== "utf8")
      throw new ApiError(
        415,
        `charset ${JSON.stringify(v.slice(0, 32))} is not supported; send UTF-8`,
        "invalid_request_error",
        null,
        "unsupported_media_type",
      );
  }
}

const tooLarge = (maxBytes: number) =>
  new ApiError(
    413,
    `request body over ${maxBytes} bytes (controller.limits.maxBodyBytes)`,
    "invalid_request_error",
    null,
    "request_too_large",
  );

const utf8 = new TextDecoder("utf-8", { fatal: true });

export async function readJsonBody(req: IncomingMessage, maxBytes: number): Promise<unknown> {
  checkJsonContentType(req.headers["content-type"]);
  const declared = Number(req.headers["content-length"]);
  if (Number.isFinite(declared) && declared > maxBytes) throw tooLarge(maxBytes);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) throw tooLarge(maxBytes);
    chunks.push(chunk as Buffer);
  }
  return parseJsonBytes(Buffer.concat(chunks));
}

/** Strict UTF-8, then JSON; a 400 naming which failed. */
export function parseJsonBytes(bytes: Uint8Array): unknown {
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    throw badRequest("the request body is not valid UTF-8");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw badRequest(`malformed JSON: ${(err as Error).message.slice(0, 200)}`);
  }
}
