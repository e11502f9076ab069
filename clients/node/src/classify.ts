// What an error means for the failure policy (docs/failure-model.md):
// Redis failing, this process out of something (shed), or a usage error.
// The Node twin of the Python package's _classify.py and the OpenResty
// module's classify.lua; clients/spec/classify.json holds the cases all
// three must answer alike.

import { LOCAL_EXHAUSTION, UNAVAILABLE_REPLIES } from "./contract.js";
import { CircuitOpenError, LimiterError, RedisTimeoutError, ReplicaWaitError, Shed } from "./errors.js";

export type Kind = "failure" | "shed" | "usage";

// Error replies that say the server can't serve now (a failover, a
// restart, a script that runs too long, a full memory, a snapshot that
// failed, too few replicas for min-replicas-to-write, a slot moving), as
// opposed to "your request is wrong"; and this process or host out of a
// resource (descriptors, ports, socket buffers, memory), which is never
// Redis's fault: contract.json's, shared by every client.
// ("ERR max number of clients reached" is maxclients: Redis refusing this
// connection for now; redis-py makes it a ConnectionError.)
const LOCAL_EXHAUSTION_CODES = new Set(LOCAL_EXHAUSTION);
// The same codes in the text Node makes of an error ("connect EMFILE ...").
const LOCAL_EXHAUSTION_WORD = new RegExp(`\\b(${LOCAL_EXHAUSTION.join("|")})\\b`);

function unavailable(message: string): boolean {
  return UNAVAILABLE_REPLIES.some((code) => message.startsWith(code));
}

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

// The clients' own errors for a connection that failed or never came up,
// or a command that got no reply in time: ioredis's retries given up and
// cluster errors; node-redis's socket closed, connect or socket timed out,
// reconnects given up, a client reconnecting without an offline queue, a
// command's own timeout (5 and later).
const CONNECTION_ERRORS = new Set([
  "MaxRetriesPerRequestError",
  "ClusterAllFailedError",
  "SocketClosedUnexpectedlyError",
  "ConnectionTimeoutError",
  "ReconnectStrategyError",
  "ClientOfflineError",
  "SocketTimeoutError",
  "TimeoutError",
]);
// ioredis says these with a plain Error ("Too many Cluster redirections":
// a reshard or a failover outlasted its maxRedirections).
const CONNECTION_MESSAGES =
  /^(Connection is closed|Stream isn't writeable|Command timed out|Failed to refresh slots cache|None of startup nodes is available|Cluster isn't ready|Cluster is disconnected|Socket closed unexpectedly|Connection timeout|Socket timeout|Too many Cluster redirections)/;

// Error replies, as each client names them (ioredis; node-redis 4, 5+).
const REPLY_CLASSES = new Set(["ReplyError", "ErrorReply", "SimpleError", "BlobError"]);

function isReply(error: Error): boolean {
  return REPLY_CLASSES.has(error.name) || REPLY_CLASSES.has(error.constructor.name);
}

// Where the clients keep the error behind theirs: Error's `cause`,
// node-redis's ReconnectStrategyError (`originalError`, `socketError`),
// ioredis's ClusterAllFailedError (`lastNodeError`), Node's AggregateError
// of a connect tried on each address (`errors`).
const CAUSES = ["cause", "originalError", "socketError", "lastNodeError"] as const;

/**
 * The code of local exhaustion behind `error`, raw or wrapped (in a cause,
 * at any depth, or in the text Node makes of it: "connect EMFILE
 * 127.0.0.1:6379"); undefined if none.
 */
export function localExhaustion(error: unknown): string | undefined {
  const seen = new Set<unknown>();
  const queue: unknown[] = [error];
  while (queue.length > 0) {
    const e = queue.shift();
    if (e === null || typeof e !== "object" || seen.has(e)) continue;
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && LOCAL_EXHAUSTION_CODES.has(code)) return code;
    if (e instanceof Error && !isReply(e)) {
      const word = LOCAL_EXHAUSTION_WORD.exec(e.message);
      if (word) return word[1];
    }
    for (const name of CAUSES) queue.push((e as Record<string, unknown>)[name]);
    const errors = (e as { errors?: unknown }).errors;
    if (Array.isArray(errors)) queue.push(...errors);
  }
  return undefined;
}

/**
 * What an error means for the failure policy: Redis failing ("failure"),
 * this process unable to get Redis's answer, overloaded or out of a local
 * resource ("shed"), or a usage error that always throws ("usage": a bad
 * argument, a key of the wrong type, a user the server refuses, a client
 * its owner closed), which no policy should hide.
 */
export function classify(error: unknown): Kind {
  if (error instanceof Shed) return "shed";
  if (error instanceof RedisTimeoutError || error instanceof CircuitOpenError || error instanceof ReplicaWaitError) {
    return "failure";
  }
  if (error instanceof LimiterError || !(error instanceof Error)) return "usage";
  if (isReply(error)) return unavailable(error.message) ? "failure" : "usage";
  if (localExhaustion(error) !== undefined) return "shed";
  const code = (error as { code?: unknown }).code;
  if (typeof code === "string" && SOCKET_CODES.has(code)) return "failure";
  if (CONNECTION_ERRORS.has(error.name) || CONNECTION_ERRORS.has(error.constructor.name)) return "failure";
  if (CONNECTION_MESSAGES.test(error.message)) return "failure";
  return "usage";
}
