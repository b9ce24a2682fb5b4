/**
 * Turning a token stream into text a client can be sent piece by piece.
 * Pure; one instance per choice.
 */

/**
 * Incremental detokenization. Decoding token by token breaks multi-byte
 * characters and merges that depend on neighbours, so each step decodes a
 * short window `ids[prefixOffset..]` and emits only what that window added
 * beyond `ids[prefixOffset..readOffset]` — and nothing while the window ends
 * in an incomplete UTF-8 sequence (U+FFFD). Cost per token is O(window), not
 * O(length).
 */
export class IncrementalDetokenizer {
  private readonly ids: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;

  constructor(private readonly decode: (ids: readonly number[]) => string) {}

  /** Adds one token; returns the text that became final. */
  push(token: number): string {
    this.ids.push(token);
    const prefixText = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const newText = this.decode(this.ids.slice(this.prefixOffset));
    if (newText.length > prefixText.length && !newText.endsWith("\uFFFD")) {
      const delta = newText.slice(prefixText.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      return delta;
    }
    return "";
  }

  /** At the end of the stream: whatever is still held back. */
  flush(): string {
    const prefixText = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const rest = this.decode(this.ids.slice(this.prefixOffset));
    this.prefixOffset = this.readOffset = this.ids.length;
    return rest.length > prefixText.length ? rest.slice(prefixText.length) : "";
  }
}

/**
 * Stop sequences over streamed text. Text that could be the start of a stop
 * sequence is held back until it is known not to be one, so a client never
 * receives part of a stop sequence. The stop sequence itself is emitted only
 * with `includeStop` (vLLM's include_stop_str_in_output). Text pushed while
 * not `armed` (vLLM: before min_tokens were generated) is never matched.
 */
export class StopMatcher {
  private pending = "";
  private stopped = false;
  private hit: string | null = null;

  constructor(
    private readonly stops: readonly string[],
    private readonly includeStop = false,
  ) {}

  get isStopped(): boolean {
    return this.stopped;
  }

  /** The stop sequence that ended the text (null: none). */
  get matched(): string | null {
    return this.hit;
  }

  /** Adds text; returns what may be sent and whether a stop sequence was hit. */
  push(text: string, armed = true): { emit: string; stopped: boolean } {
    if (this.stopped) return { emit: "", stopped: true };
    if (!armed) {
      const emit = this.pending + text;
      this.pending = "";
      return { emit, stopped: false };
    }
    this.pending += text;
    let cut = -1;
    let which = "";
    for (const s of this.stops) {
      const at = this.pending.indexOf(s);
      if (at >= 0 && (cut < 0 || at < cut)) {
        cut = at;
        which = s;
      }
    }
    if (cut >= 0) {
      this.stopped = true;
      this.hit = which;
      const emit = this.pending.slice(0, this.includeStop ? cut + which.length : cut);
      this.pending = "";
      return { emit, stopped: true };
    }
    const hold = this.heldSuffix();
    const emit = this.pending.slice(0, this.pending.length - hold);
    this.pending = this.pending.slice(this.pending.length - hold);
    return { emit, stopped: false };
  }

  /** End of stream: held text is released (it never completed a stop sequence). */
  flush(): string {
    const out = this.stopped ? "" : this.pending;
    this.pending = "";
    return out;
  }

  /** Length of the longest suffix of pending that is a proper prefix of a stop sequence. */
  private heldSuffix(): number {
    let best = 0;
    for (const s of this.stops) {
      for (let k = Math.min(s.length - 1, this.pending.length); k > best; k--) {
        if (this.pending.endsWith(s.slice(0, k))) {
          best = k;
          break;
        }
      }
    }
    return best;
  }
}
