// How a failure of Redis is told apart from the process being busy
// (docs/failure-model.md), and the per-command deadline.

import { CircuitOpenError, LimiterError, RedisTimeoutError, Shed } from "./errors.js";

export type Kind = "failure" | "shed" | "usage";

// Error replies that say the server can't serve now (a failover, a
// restart, a script that runs too long, a full memory, a snapshot that
// failed, too few replicas for min-replicas-to-write), as opposed to
// "your request is wrong".
const UNAVAILABLE = /^(LOADING|MASTERDOWN|CLUSTERDOWN|READONLY|BUSY |OOM |TRYAGAIN|MISCONF|NOREPLICAS)/;

// Socket errors: the connection to Redis failed.
const SOCKET_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "ENETUNREACH",
  "ENETDOWN",
  "ENOTCONN",
  "EAI_AGAIN",
]);

// The clients' own errors for a connection that failed or never came up:
// ioredis's closed connection, retries given up and cluster errors;
// node-redis's socket closed or connect timed out.
const CONNECTION_ERRORS = new Set([
  "MaxRetriesPerRequestError",
  "ClusterAllFailedError",
  "SocketClosedUnexpectedlyError",
  "ConnectionTimeoutError",
  "ReconnectStrategyError",
  "SocketTimeoutError",
]);
const CONNECTION_MESSAGES =
  /^(Connection is closed|Stream isn't writeable|Failed to refresh slots cache|None of startup nodes is available|Cluster isn't ready|Cluster is disconnected|Socket closed unexpectedly|Connection timeout|Socket timeout)/;

// Error replies, as each client names them (ioredis; node-redis 4, 5+).
const REPLY_CLASSES = new Set(["ReplyError", "ErrorReply", "SimpleError", "BlobError"]);

function isReply(error: Error): boolean {
  return REPLY_CLASSES.has(error.name) || REPLY_CLASSES.has(error.constructor.name);
}

/**
 * What an error means for the failure policy: Redis failing ("failure"),
 * the process overloaded ("shed"), or a usage error that always throws
 * ("usage": a bad argument, a key of the wrong type, a user the server
 * refuses, a client its owner closed), which no policy should hide.
 */
export function classify(error: unknown): Kind {
  if (error instanceof Shed) return "shed";
  if (error instanceof RedisTimeoutError || error instanceof CircuitOpenError) return "failure";
  if (error instanceof LimiterError || !(error instanceof Error)) return "usage";
  if (isReply(error)) return UNAVAILABLE.test(error.message) ? "failure" : "usage";
  const code = (error as { code?: unknown }).code;
  if (typeof code === "string" && SOCKET_CODES.has(code)) return "failure";
  if (CONNECTION_ERRORS.has(error.name) || CONNECTION_ERRORS.has(error.constructor.name)) return "failure";
  if (CONNECTION_MESSAGES.test(error.message)) return "failure";
  return "usage";
}

/**
 * `reply` within `budgetMs`, measured from now: the caller sends the
 * command and arms this at once.
 *
 * When the timer runs, I/O that is already here is let in first (the
 * decision waits for the event loop's next check phase, after its poll
 * phase has read the sockets): a reply that arrived while the loop was
 * busy is Redis's answer, not a timeout. If there is still no reply:
 *
 * - the command was `written` to a connected socket: Redis did not answer
 *   in time, a Redis failure (RedisTimeoutError);
 * - it may not have been (a Cluster, a client still connecting): if the
 *   timer ran more than half a budget late, the event loop is behind and
 *   the wait can't be blamed on Redis: Shed. Otherwise Redis had the
 *   budget with a loop that kept up: a Redis failure.
 */
export function bounded<T>(reply: Promise<T>, budgetMs: number, written: boolean): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const due = performance.now() + budgetMs;
    const timer = setTimeout(() => {
      const late = performance.now() - due;
      setImmediate(() => {
        if (settled) return;
        settled = true;
        if (!written && late > budgetMs / 2) {
          reject(new Shed(`the event loop fell ${Math.round(late)} ms behind the call`));
        } else {
          reject(new RedisTimeoutError(`no reply from Redis within ${budgetMs} ms of the command`));
        }
      });
    }, budgetMs);
    reply.then(
      (value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
