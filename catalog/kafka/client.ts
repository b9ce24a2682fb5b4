import * as net from "node:net";
import { Kafka, type LogEntry, logLevel } from "kafkajs";
import { retry } from "../../schema/retry.ts";

/**
 * The kafkajs client every part of the Kafka log builds on (kafkajs 2.2.4;
 * broker pinned in deploy/kafka/pom.xml): TCP_NODELAY sockets, bounded
 * reconnects, and kafkajs's log lines as JSON on stderr with the one
 * expected error filtered out.
 */

export type KafkaLogLevel = "nothing" | "error" | "warn" | "info";

/** kafkajs's message for the CONCURRENT_TRANSACTIONS error code (51). */
const CONCURRENT_TRANSACTIONS_TEXT =
  "The producer attempted to update a transaction while another concurrent operation";

/** Per-client overrides of the defaults below (a probe that must answer within its own bound). */
export interface ClientBounds {
  /** Reconnect attempts after the first (default 15: about a minute). */
  readonly retries?: number;
  /** Milliseconds to wait for a TCP connection (kafkajs default 1,000). */
  readonly connectionTimeoutMs?: number;
  /** Milliseconds to wait for one request's answer (kafkajs default 30,000). */
  readonly requestTimeoutMs?: number;
}

export function kafkaClient(
  brokers: readonly string[],
  clientId: string,
  level: KafkaLogLevel | undefined,
  bounds: ClientBounds = {},
): Kafka {
  const levels = {
    nothing: logLevel.NOTHING,
    error: logLevel.ERROR,
    warn: logLevel.WARN,
    info: logLevel.INFO,
  };
  return new Kafka({
    clientId,
    brokers: [...brokers],
    logLevel: levels[level ?? "error"],
    // TCP_NODELAY, as the Java client sets it: Nagle's algorithm holds a small
    // request written while an earlier one is unacknowledged until the ACK,
    // which the broker's kernel may delay by up to 40 ms.
    socketFactory: ({ host, port, onConnect }) => {
      const socket = net.connect({ host, port, noDelay: true }, onConnect);
      socket.setKeepAlive(true, 60_000);
      return socket;
    },
    // Bounded reconnects: about a minute of retries before an operation fails.
    retry: { initialRetryTime: 100, maxRetryTime: 5_000, retries: bounds.retries ?? 15 },
    ...(bounds.connectionTimeoutMs === undefined ? {} : { connectionTimeout: bounds.connectionTimeoutMs }),
    ...(bounds.requestTimeoutMs === undefined ? {} : { requestTimeout: bounds.requestTimeoutMs }),
    logCreator: () => (entry: LogEntry) => {
      const line = kafkajsLogLine(entry, new Date());
      if (line !== undefined) process.stderr.write(line);
    },
  });
}

/**
 * One kafkajs log entry as a JSON line for stderr, or undefined for the one
 * expected error: kafkajs logs each CONCURRENT_TRANSACTIONS answer as an
 * error before retrying it, and a writer meets one on nearly every
 * back-to-back transaction (the previous commit's markers are still being
 * written). A retry that finally fails fails the commit, which the writer
 * reports (writer.lease_lost).
 */
export function kafkajsLogLine({ namespace, level, log }: LogEntry, now: Date): string | undefined {
  const { message, timestamp: _t, logger: _l, ...rest } = log;
  if (`${message} ${String(rest.error)}`.includes(CONCURRENT_TRANSACTIONS_TEXT)) return undefined;
  return `${JSON.stringify({ t: now.toISOString(), src: "kafkajs", level, ns: namespace, msg: message, ...rest })}\n`;
}

/** Retries an operation while Kafka answers CONCURRENT_TRANSACTIONS: 2 ms doubling to 500 ms, 40 attempts (≥ 16 s). */
export function retryConcurrent<T>(op: () => Promise<T>): Promise<T> {
  return retry(() => op(), {
    policy: { maxAttempts: 40, baseMs: 2, capMs: 500 },
    retryable: (err) => (err as { type?: string }).type === "CONCURRENT_TRANSACTIONS",
  });
}
