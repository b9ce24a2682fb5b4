import type { TextCodec, TokenLogprob } from "./service.ts";

/**
 * Log-probabilities in the response shapes clients parse: OpenAI's legacy
 * completions object, the chat `logprobs.content` list, and vLLM's
 * `prompt_logprobs`. Token text is each id decoded alone with special tokens
 * kept (vLLM's convert_ids_list_to_tokens), or "token_id:N" with
 * return_tokens_as_token_ids. −∞ is reported as −9999.0, as vLLM does. Pure.
 */

const FLOOR = -9999;
const clamp = (x: number) => Math.max(x, FLOOR);

export type TokenText = (id: number) => string;

export function tokenText(codec: TextCodec, asIds: boolean): TokenText {
  return asIds ? (id) => `token_id:${id}` : (id) => codec.decode([id], { skipSpecialTokens: false });
}

export type TokenBytes = (id: number) => number[];

/**
 * The chat shape's `bytes`: the token's own output bytes, as OpenAI returns
 * them, so a token that is part of a UTF-8 sequence shows its bytes, not
 * U+FFFD's (which its text decodes to alone); a special token (no output
 * bytes) and "token_id:N" show their text's UTF-8.
 */
export function tokenBytes(codec: TextCodec, text: TokenText, asIds: boolean): TokenBytes {
  if (asIds) return (id) => utf8(text(id));
  return (id) => {
    const b = codec.tokenBytes(id);
    return b === null ? utf8(text(id)) : [...b];
  };
}

export interface LegacyLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

/**
 * The completions shape for `ids` with `entries[i]` the log-probabilities of
 * ids[i] (null: none, as for a prompt's first token). top_logprobs holds the
 * chosen token and the `topN` most likely (so up to topN + 1 keys, vLLM's
 * rule); text_offset counts characters of the token texts from `offset`.
 */
export function legacyLogprobs(
  ids: readonly number[],
  entries: readonly (TokenLogprob | null)[],
  topN: number,
  text: TokenText,
  offset: number,
): LegacyLogprobs {
  const out: LegacyLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let at = offset;
  for (const [i, id] of ids.entries()) {
    const t = text(id);
    const e = entries[i] ?? null;
    out.tokens.push(t);
    out.text_offset.push(at);
    at += t.length;
    out.token_logprobs.push(e ? clamp(e.logprob) : null);
    if (!e) {
      out.top_logprobs.push(null);
      continue;
    }
    const top: Record<string, number> = { [t]: clamp(e.logprob) };
    for (const [alt, lp] of e.top.slice(0, topN)) {
      const key = text(alt);
      if (!(key in top)) top[key] = clamp(lp);
    }
    out.top_logprobs.push(top);
  }
  return out;
}

export interface ChatLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

const utf8 = (s: string) => [...Buffer.from(s, "utf8")];

/** The chat shape: one entry per generated token, with its `topN` most likely alternatives in rank order. */
export function chatLogprobs(
  entries: readonly TokenLogprob[],
  topN: number,
  text: TokenText,
  bytes: TokenBytes,
): ChatLogprob[] {
  return entries.map((e) => ({
    token: text(e.token),
    logprob: clamp(e.logprob),
    bytes: bytes(e.token),
    top_logprobs: e.top
      .slice(0, topN)
      .map(([id, lp]) => ({ token: text(id), logprob: clamp(lp), bytes: bytes(id) })),
  }));
}

export interface VllmLogprob {
  logprob: number;
  rank: number;
  decoded_token: string;
}

/**
 * vLLM's prompt_logprobs: one entry per prompt token, null for the first;
 * each maps token ids (the prompt's own and its `topN` most likely) to their
 * log-probability, rank (1 = most likely) and text.
 */
export function promptLogprobsJson(
  prompt: readonly number[],
  scored: readonly TokenLogprob[],
  topN: number,
  text: TokenText,
): (Record<string, VllmLogprob> | null)[] {
  const out: (Record<string, VllmLogprob> | null)[] = [null];
  for (let p = 1; p < prompt.length; p++) {
    const e = scored[p - 1];
    if (!e) {
      out.push(null);
      continue;
    }
    const entry: Record<string, VllmLogprob> = {
      [e.token]: { logprob: clamp(e.logprob), rank: e.rank, decoded_token: text(e.token) },
    };
    e.top.slice(0, topN).forEach(([id, lp], k) => {
      if (!(id in entry)) entry[id] = { logprob: clamp(lp), rank: k + 1, decoded_token: text(id) };
    });
    out.push(entry);
  }
  return out;
}
