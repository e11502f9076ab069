// What the gateway's tests share: tiny limits, settings, and the gateway on
// a free port of this process, called over HTTP.

import Redis from "ioredis";
import { createApp } from "../app.mjs";
import { DEMO_API_KEYS, limits } from "../config.mjs";

export const SLOW = 0.001;
export const TINY = {
  tiers: {
    free: { user: { max: 3, rate: SLOW }, key: { max: 5, rate: SLOW }, llm: { max: 100, rate: SLOW } },
    standard: { user: { max: 6, rate: SLOW }, key: { max: 6, rate: SLOW }, llm: { max: 1000, rate: SLOW } },
  },
  ip: { max: 8, rate: SLOW },
};

export function settings(overrides = {}, raw = TINY) {
  return {
    redisTimeoutMs: 100,
    breaker: { failures: 5, windowMs: 10_000, cooldownMs: 2_000 },
    clusterMode: false,
    trustedProxies: [],
    limits: limits(raw),
    apiKeys: DEMO_API_KEYS,
    ...overrides,
  };
}

/**
 * The gateway over HTTP on 127.0.0.1; `options.settings` overrides,
 * `options.limits` replaces TINY, `options.cluster` makes it an ioredis
 * Cluster client seeded with `port`, in cluster mode.
 */
export async function gateway(port, options = {}) {
  const redis = options.cluster
    ? new Redis.Cluster([{ host: "127.0.0.1", port }])
    : new Redis({ port, maxRetriesPerRequest: 1 });
  redis.on("error", () => {});
  if (options.cluster) options.settings = { clusterMode: true, ...options.settings };
  const app = createApp(settings(options.settings, options.limits), { redis, llm: options.llm });
  const server = app.listen(0, "127.0.0.1");
  await new Promise((r) => server.once("listening", r));
  const base = `http://127.0.0.1:${server.address().port}`;
  return {
    base,
    async call(method, path, { key, body, raw } = {}) {
      const sent = raw ?? (body ? JSON.stringify(body) : undefined); // raw: the body's text as is
      const headers = { ...(key ? { "x-api-key": key } : {}), ...(sent ? { "content-type": "application/json" } : {}) };
      const r = await fetch(base + path, { method, headers, body: sent });
      const text = await r.text();
      const json = (r.headers.get("content-type") ?? "").includes("json");
      return { status: r.status, headers: Object.fromEntries(r.headers), body: json ? JSON.parse(text) : text };
    },
    redis,
    close() {
      server.close();
      redis.disconnect();
    },
  };
}
