// A GenAI API gateway limited per user, API key and client IP, with an LLM
// token budget per user: the Node twin of examples/fastapi-gateway, on
// Express and the redis-tokenbucket package. Run: node server.mjs (README).

import express from "express";
import { Breaker, Limiter, MultiDecision, mergeRateLimitHeaders, rateLimitHeaders } from "redis-tokenbucket";
import { clientIp, holdUntilSent } from "redis-tokenbucket/express";
import { keyId } from "./config.mjs";
import { countTokens, LLMError, StubLLM } from "./llm.mjs";

// What a route does when Redis fails (refused, reset, no answer in time, or
// the breaker open): admit unlimited, or refuse with 503. Cheap reads fail
// open; what spends inference budget fails closed. A busy gateway is not a
// failing Redis: a call that can't get its answer in time for local reasons
// is shed (503, Retry-After) under both, never admitted unchecked.
const ON_ERROR = { fail_open: "open", fail_closed: "closed" };

class GatewayError extends Error {
  constructor(status, body, headers = {}) {
    super(body.error);
    Object.assign(this, { status, body, headers });
  }
}

/** The request's buckets: user and key when authenticated, IP always. */
function requestGroups(req, limits) {
  const tier = limits.forTier(req.principal?.tier);
  const groups = [];
  if (req.principal) {
    groups.push([`rl:user:${req.principal.userId}`, tier.user, 1]);
    groups.push([`rl:key:${req.keyId}`, tier.key, 1]);
  }
  groups.push([`rl:ip:${req.clientIp}`, limits.ip, 1]);
  return groups;
}

/**
 * One all-or-nothing check of every bucket of the request. Returns the
 * decision, or undefined when Redis failed and the route fails open.
 */
async function enforce(req, res, policy, extra = []) {
  const { settings, limiter } = req.app.locals;
  const groups = [...requestGroups(req, settings.limits), ...extra];
  // In cluster mode the buckets are in different slots: one by one, refunded on a denial.
  const decision = await limiter.consumeMany(groups, {
    atomic: settings.clusterMode ? false : undefined,
    onError: ON_ERROR[policy],
  });
  if (decision.shed)
    throw new GatewayError(503, { error: "overloaded" }, { "Retry-After": String(decision.retryAfter) });
  if (decision.degraded) {
    if (!decision.allowed) throw new GatewayError(503, { error: "rate_limiter_unavailable" }, { "Retry-After": "1" });
    return undefined;
  }
  if (!decision.allowed) {
    throw new GatewayError(
      429,
      { error: "rate_limited", dimension: decision.tightest.bucket.name, retry_after: decision.retryAfter },
      rateLimitHeaders(decision, { legacy: true }),
    );
  }
  res.set(rateLimitHeaders(decision, { legacy: true }));
  return decision;
}

function requirePrincipal(req) {
  if (!req.principal) throw new GatewayError(401, { error: "unauthorized", detail: "missing or unknown X-API-Key" });
  return req.principal;
}

/**
 * A streamed chat's answer when its lease was not acquired: shed or Redis
 * failing (the route fails closed) is a 503, a full set of streams or a
 * bucket that can't pay a 429.
 */
function refuseLease(lease) {
  if (lease.shed) throw new GatewayError(503, { error: "overloaded" }, { "Retry-After": String(lease.retryAfter) });
  if (lease.degraded) throw new GatewayError(503, { error: "rate_limiter_unavailable" }, { "Retry-After": "1" });
  const waits = [...lease.deniedBy].sort((a, b) => b.retryAfterMs - a.retryAfterMs);
  const dimension = lease.busy ? "streams" : waits[0].bucket.name;
  throw new GatewayError(
    429,
    { error: "rate_limited", dimension, retry_after: lease.retryAfter },
    rateLimitHeaders(lease, { legacy: true }),
  );
}

/**
 * One of the user's `streams` slots, with every bucket of the request and
 * the LLM reservation charged in the same TB.ACQUIRE, all or nothing. In
 * cluster mode the buckets live in other slots than the lease key: the
 * slot first, then the buckets one by one (`enforce`), and the slot given
 * back if they deny. Sets the response's fields; returns the lease.
 */
async function takeStreamSlot(req, res, budget) {
  const { settings, limiter } = req.app.locals;
  const key = `rl:streams:${req.principal.userId}`;
  const streams = settings.limits.forTier(req.principal.tier).streams;
  if (!settings.clusterMode) {
    const buckets = [...requestGroups(req, settings.limits), budget];
    const lease = await limiter.acquire(key, streams, { buckets, onError: "closed" });
    if (!lease.acquired) refuseLease(lease);
    res.set(rateLimitHeaders(lease, { legacy: true }));
    return lease;
  }
  const lease = await limiter.acquire(key, streams, { onError: "closed" });
  if (!lease.acquired) refuseLease(lease);
  let decision;
  try {
    decision = await enforce(req, res, "fail_closed", [budget]);
  } catch (error) {
    await limiter.release(lease).catch((e) => console.error(`could not give back stream slot ${lease.id}: ${e}`));
    throw error;
  }
  res.set(mergeRateLimitHeaders(rateLimitHeaders(lease), rateLimitHeaders(decision, { legacy: true })));
  return lease;
}

/**
 * POST /v1/chat with "stream": true: server-sent events, one per token,
 * then the usage and [DONE]. The slot is renewed while the stream runs and
 * released after its last byte, or at once when the client goes away; then
 * the LLM budget is settled with what was generated (all of it back if
 * nothing was).
 */
async function chatStream(req, res, { prompt, maxTokens, budget, reserved, settle }) {
  const { limiter, llm } = req.app.locals;
  const lease = await takeStreamSlot(req, res, budget);
  const promptTokens = countTokens(prompt);
  let generated = 0;
  let gone = false;
  res.once("close", () => {
    gone = !res.writableFinished;
  });
  holdUntilSent(limiter, lease, res, async () => {
    const used = generated ? promptTokens + generated : 0;
    if (used !== reserved) await settle(reserved - used);
  });
  res.status(200).set({ "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
  res.flushHeaders();
  try {
    for await (const token of llm.stream(prompt, maxTokens)) {
      if (gone) return; // the client went away: stop generating
      generated++;
      res.write(`data: ${JSON.stringify({ token })}\n\n`);
    }
  } catch (error) {
    if (!(error instanceof LLMError)) console.error(error);
    console.warn(`model backend failed mid-stream after ${generated} tokens: ${error.message}`);
    res.end(`event: error\ndata: ${JSON.stringify({ error: "upstream_failed" })}\n\n`);
    return;
  }
  const usage = { prompt_tokens: promptTokens, completion_tokens: generated, reserved_tokens: reserved };
  res.write(`data: ${JSON.stringify({ usage })}\n\n`);
  res.end("data: [DONE]\n\n");
}

/** Express 5 passes a rejected handler's error to the error middleware. */
const limited = (policy) => async (req, res, next) => {
  await enforce(req, res, policy); // first, so bad keys still pay their IP bucket
  requirePrincipal(req);
  next();
};

/**
 * The gateway. `redis` is an ioredis Redis or Cluster (the caller owns
 * it); `llm` a model backend with complete(prompt, maxTokens).
 */
export function createApp(settings, { redis, llm = new StubLLM(settings.stubTokenDelayMs ?? 0) }) {
  const app = express();
  app.locals.settings = settings;
  app.locals.llm = llm;
  app.locals.limiter = new Limiter(redis, {
    timeoutMs: settings.redisTimeoutMs,
    breaker: new Breaker(settings.breaker),
  });
  const address = clientIp(settings.trustedProxies);

  app.use(async (req, _res, next) => {
    const raw = req.get("x-api-key");
    const kid = raw ? keyId(raw) : undefined;
    req.principal = kid ? settings.apiKeys[kid] : undefined;
    req.keyId = req.principal ? kid : undefined;
    req.clientIp = await address(req);
    next();
  });
  app.use(express.json());

  app.get("/healthz", (_req, res) => res.json({ ok: true }));

  app.get("/readyz", async (req, res) => {
    const limiter = req.app.locals.limiter;
    try {
      const backend = await limiter.detect();
      res.json({ ready: true, backend, breaker: limiter.breakerState });
    } catch (error) {
      res.status(503).json({ ready: false, reason: `${error.name}: ${error.message}`, breaker: limiter.breakerState });
    }
  });

  app.get("/v1/models", limited("fail_open"), (_req, res) => res.json({ data: [{ id: "stub-echo" }] }));

  app.post("/v1/chat", async (req, res) => {
    const { prompt, max_tokens: maxTokens, stream = false } = req.body ?? {};
    if (typeof prompt !== "string" || !prompt || !Number.isInteger(maxTokens) || maxTokens <= 0) {
      throw new GatewayError(422, { error: "invalid_request" });
    }
    if (typeof stream !== "boolean") throw new GatewayError(422, { error: "invalid_request" });
    const { limits } = settings;
    const reserved = countTokens(prompt) + maxTokens;
    const extra = [];
    if (req.principal) {
      const budget = limits.forTier(req.principal.tier).llm;
      if (reserved > budget.max) {
        throw new GatewayError(413, {
          error: "over_budget",
          detail: `${reserved} tokens exceed the budget of ${budget.max}`,
        });
      }
      extra.push([`rl:llm:user:${req.principal.userId}`, budget, reserved]);
    }
    const limiter = req.app.locals.limiter;
    // The answer is already paid for upstream; a lost settlement (logged by
    // the limiter) only skews this user's budget until it refills.
    const settle = async (delta) => {
      const [key, bucket] = extra[0];
      const d = await limiter.adjust(key, bucket, delta, { onError: "open" });
      return d.degraded ? undefined : d;
    };
    if (stream && req.principal) {
      return chatStream(req, res, { prompt, maxTokens, budget: extra[0], reserved, settle });
    }
    const decision = await enforce(req, res, "fail_closed", extra);
    requirePrincipal(req);
    let completion;
    try {
      completion = await req.app.locals.llm.complete(prompt, maxTokens);
    } catch (error) {
      if (decision) await settle(reserved);
      if (error instanceof LLMError) throw new GatewayError(502, { error: "upstream_failed" });
      throw error;
    }
    const used = completion.promptTokens + completion.completionTokens;
    if (decision && used !== reserved) {
      const settled = await settle(reserved - used);
      if (settled) {
        // Report the budget as it is after the refund, not the reservation.
        const after = settled.with({ retryAfterMs: 0 });
        const decisions = decision.decisions.map((d) => (d.key === after.key ? after : d));
        res.set(rateLimitHeaders(new MultiDecision(true, 0, decisions), { legacy: true }));
      }
    }
    res.json({
      text: completion.text,
      usage: {
        prompt_tokens: completion.promptTokens,
        completion_tokens: completion.completionTokens,
        reserved_tokens: reserved,
      },
    });
  });

  app.use((error, _req, res, _next) => {
    if (error instanceof GatewayError) return res.status(error.status).set(error.headers).json(error.body);
    // A body that is no JSON (express.json's parse error): the client's
    // mistake, answered as a bad field is, as the FastAPI and nginx twins do.
    if (error?.type === "entity.parse.failed") return res.status(422).json({ error: "invalid_request" });
    console.error(error);
    res.status(500).json({ error: "internal" });
  });
  return app;
}
