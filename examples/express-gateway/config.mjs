// Gateway configuration: bucket sizes per tier and dimension, streams in
// flight per tier, Redis, proxies, API keys. The same tiers as
// examples/fastapi-gateway. Every bucket is a redis-tokenbucket Bucket and
// every stream limit a Concurrency, checked with the module's own rules, so
// a bad limit stops the gateway at startup.

import { createHash } from "node:crypto";
import { Bucket, Concurrency } from "redis-tokenbucket";

const bucket = (b) => new Bucket({ max: b.max, rate: b.rate });

export const DEFAULT_LIMITS = {
  tiers: {
    free: { user: { max: 10, rate: 0.17 }, key: { max: 10, rate: 0.17 }, llm: { max: 20_000, rate: 10 }, streams: 2 },
    standard: { user: { max: 60, rate: 1 }, key: { max: 60, rate: 1 }, llm: { max: 200_000, rate: 100 }, streams: 8 },
    // An enterprise account spreads load over several keys.
    enterprise: {
      user: { max: 3000, rate: 50 },
      key: { max: 1500, rate: 25 },
      llm: { max: 2_000_000, rate: 1000 },
      streams: 64,
    },
  },
  // One IP bucket for everybody, not per tier: rl:ip:<addr> is shared by
  // every caller behind that address, and a bucket clamps its balance to the
  // max of each call, so per-tier sizes on one key would let free callers
  // shrink it for enterprise ones. A flood guard.
  ip: { max: 600, rate: 30 },
  // How long a streamed chat's slot lives without a renewal (ms). The
  // gateway renews it about every third of that while the stream runs; a
  // gateway that dies frees its slots this long after its last renewal.
  stream_lease_ms: 30_000,
};

/** A tier without `streams` may have this many streamed chats in flight. */
const DEFAULT_STREAMS = 2;

/**
 * Limits as Buckets and Concurrency limits: { tiers: { name: { user, key,
 * llm, streams } }, ip, streamLeaseMs }; `free` is required. The JSON is
 * the FastAPI example's (`stream_lease_ms`, default 30000).
 */
export function limits(raw = DEFAULT_LIMITS) {
  if (!raw.tiers?.free) throw new RangeError("tiers must define 'free', the fallback tier");
  const leaseMs = raw.stream_lease_ms ?? 30_000;
  const tiers = {};
  for (const [name, t] of Object.entries(raw.tiers)) {
    tiers[name] = {
      user: bucket(t.user).named("user"),
      key: bucket(t.key).named("key"),
      llm: bucket(t.llm).named("llm"),
      streams: new Concurrency({ limit: t.streams ?? DEFAULT_STREAMS, leaseMs, name: "streams" }),
    };
  }
  return {
    tiers,
    ip: bucket(raw.ip).named("ip"),
    streamLeaseMs: leaseMs,
    /** A missing or unknown tier gets the free limits, never none. */
    forTier: (tier) => tiers[tier ?? "free"] ?? tiers.free,
  };
}

/** SHA-256 of an API key: what the gateway stores and logs instead of the key. */
export const keyId = (apiKey) => createHash("sha256").update(apiKey).digest("hex");

export const DEMO_API_KEYS = {
  [keyId("demo-free")]: { userId: "alice", tier: "free" },
  [keyId("demo-standard")]: { userId: "bob", tier: "standard" },
  [keyId("demo-enterprise")]: { userId: "carol", tier: "enterprise" },
};

/** Settings from GATEWAY_* variables (JSON for the structured ones). */
export function settingsFromEnv(env = process.env) {
  const number = (name, fallback) => (env[name] === undefined ? fallback : Number(env[name]));
  return {
    redisUrl: env.GATEWAY_REDIS_URL ?? "redis://127.0.0.1:6379/0",
    // The limiter's budget for Redis to answer, ms from when the command is written.
    redisTimeoutMs: number("GATEWAY_REDIS_TIMEOUT_MS", 100),
    breaker: {
      failures: number("GATEWAY_BREAKER_FAILURES", 5),
      windowMs: number("GATEWAY_BREAKER_WINDOW_MS", 10_000),
      cooldownMs: number("GATEWAY_BREAKER_COOLDOWN_MS", 2_000),
    },
    clusterMode: env.GATEWAY_CLUSTER_MODE === "true",
    trustedProxies: (env.GATEWAY_TRUSTED_PROXIES ?? "")
      .split(",")
      .map((p) => p.trim())
      .filter(Boolean),
    limits: limits(env.GATEWAY_LIMITS ? JSON.parse(env.GATEWAY_LIMITS) : DEFAULT_LIMITS),
    // The stub model's pause before each token (ms), so that streams stay
    // open long enough to be seen (tests, demos). 0: as fast as it can.
    stubTokenDelayMs: number("GATEWAY_STUB_TOKEN_DELAY_MS", 0),
    apiKeys: env.GATEWAY_API_KEYS ? JSON.parse(env.GATEWAY_API_KEYS) : DEMO_API_KEYS,
  };
}
