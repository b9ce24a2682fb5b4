import { abortable } from "../schema/abort.ts";
import { TxMsg, type TxRecord } from "../schema/catalog.ts";
import { decodeMessage } from "../schema/wire.ts";
import type { TxLogReader } from "./log.ts";

/**
 * `continuum tail`: the tx log decoded, one tx at a time, for people and for
 * event consumers. JSON lines carry exactly the TxRecord fields plus the log
 * offset (catalog/WIRE.md); text lines show one datom per line.
 */
export function formatTx(offset: number, tx: TxRecord, json: boolean): string {
  if (json) return JSON.stringify({ offset, ...tx });
  const head = `#${offset} tx ${tx.txNo} proposal ${tx.proposalId} client ${tx.clientId} at ${new Date(tx.time).toISOString()} (${tx.datoms.length} datoms)`;
  const lines = tx.datoms.map(([e, a, v, added]) => `  ${added ? "+" : "-"} ${e} :${a} ${JSON.stringify(v)}`);
  return [head, ...lines].join("\n");
}

export interface TailOptions {
  readonly from: number;
  /** Keep following after the current end (until `signal` aborts). */
  readonly follow: boolean;
  readonly json: boolean;
  readonly signal?: AbortSignal;
}

/**
 * Prints txs from `from` to the log's end at start (or forever with follow).
 * A record that does not decode is printed as an error line naming its
 * offset, and tailing goes on. Resolves with the number of txs printed.
 */
export async function tailLog(
  log: TxLogReader,
  opts: TailOptions,
  write: (line: string) => void,
): Promise<number> {
  const end = await log.endOffset();
  let printed = 0;
  if (!opts.follow && opts.from >= end) return 0;
  let finish: () => void = () => {};
  const done = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const sub = await log.subscribe(opts.from, async (records) => {
    for (const r of records) {
      if (!opts.follow && r.offset >= end) {
        finish();
        return;
      }
      try {
        write(formatTx(r.offset, decodeMessage(TxMsg, r.bytes), opts.json));
      } catch (err) {
        const msg = `offset ${r.offset}: undecodable tx: ${(err as Error).message}`;
        write(opts.json ? JSON.stringify({ offset: r.offset, error: msg }) : `#${msg}`);
      }
      printed++;
      if (!opts.follow && r.offset + 1 >= end) finish();
    }
  });
  // An abort ends the wait (and removes its listener): a follow runs until it.
  await abortable(done, opts.signal).catch(() => undefined);
  await sub.stop();
  return printed;
}
