// Atomic token-bucket rate limiting on Redis, for Node.
//
//   import { Bucket, Limiter } from "redis-tokenbucket";
//   const lim = new Limiter(redis, { onError: "open", timeoutMs: 50 });
//   const d = await lim.consume("rl:user:42", new Bucket({ max: 10, rate: 0.17 }));
//   await lim.hold("rl:streams:42", new Concurrency({ limit: 8, leaseMs: 30_000 }), async (lease) => ...);
//
// Uses the TB.* module where the server has it, else the Lua library that
// ships inside this package (Functions, or the EVAL script), with the same
// replies on the same keys.

export type { ClientKind, RedisLike } from "./adapters.js";
export { Breaker, type BreakerOptions, type BreakerState } from "./breaker.js";
export { type Amount, Bucket, type BucketOptions, InvalidArgument, type Key } from "./bucket.js";
export { DenialCache } from "./cache.js";
export { LIBRARY_VERSION } from "./contract.js";
export { Decision, MultiDecision } from "./decision.js";
export { type BackendName, type Logger, refused } from "./engine.js";
export {
  AlwaysDenied,
  CircuitOpenError,
  CrossSlotError,
  LimiterError,
  MissingIdentity,
  NoBackendError,
  RedisTimeoutError,
  ReplicaWaitError,
  Shed,
} from "./errors.js";
export type { DecisionEvent, Outcome } from "./events.js";
export { DEFAULT_NEAR_LIMIT_RATIO } from "./events.js";
export { type HeaderOptions, mergeRateLimitHeaders, rateLimitHeaders } from "./headers.js";
export type { LeaseKeeper } from "./hold.js";
export { hashTagged } from "./keys.js";
export { Busy, Concurrency, type ConcurrencyOptions, type Held, Lease } from "./lease.js";
export {
  type AcquireOptions,
  type CallOptions,
  type ConsumeOptions,
  DEFAULT_TIMEOUT_MS,
  DEFAULT_WAIT_TIMEOUT_MS,
  type GroupIn,
  Limiter,
  type LimiterOptions,
  type ManyOptions,
  type OnError,
  type UpkeepOptions,
  type WaitOptions,
} from "./limiter.js";
export { type Period, Quota, type QuotaOptions, type Rule } from "./quota.js";
export { EVAL_SCRIPT, EVAL_SOURCE, LIBRARY_SOURCE } from "./scripts.js";
