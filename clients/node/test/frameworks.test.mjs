// Express (the middleware, and the Store under express-rate-limit itself),
// Fastify (the plugin and the hook), and fetch handlers (Hono), over HTTP;
// concurrency slots held until the response is done (Express, Fastify).

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import express from "express";
import { rateLimit as expressRateLimit } from "express-rate-limit";
import Fastify from "fastify";
import { Hono } from "hono";
import { Bucket, Concurrency, Limiter } from "redis-tokenbucket";
import { clientIp, concurrencyLimit, rateLimit, TokenBucketStore } from "redis-tokenbucket/express";
import { concurrencyHook, rateLimitPlugin } from "redis-tokenbucket/fastify";
import { rateLimitResponse, withRateLimitHeaders } from "redis-tokenbucket/fetch";
import { client } from "./clients.mjs";
import { Server, SLOW, stopAll, target } from "./servers.mjs";
import { get, serve } from "./web.mjs";

after(stopAll);

const USER = new Bucket({ max: 2, rate: SLOW, name: "user" });

test("express middleware: admitted with the fields, then a 429 problem", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const app = express();
  app.use(
    rateLimit(lim, {
      rules: [{ bucket: USER, key: (req) => req.headers["x-user"] }],
      skip: (req) => req.path === "/healthz",
    }),
  );
  app.get("/", (_req, res) => res.json({ ok: true }));
  app.get("/healthz", (_req, res) => res.json({ ok: true }));
  const s = await serve(app);
  try {
    const ok = await get(`${s.url}/`, { "x-user": "alice" });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers["ratelimit-policy"], '"user";q=2;w=2000');
    assert.equal(ok.headers.ratelimit, '"user";r=1;t=1000');
    await get(`${s.url}/`, { "x-user": "alice" });
    const denied = await get(`${s.url}/`, { "x-user": "alice" });
    assert.equal(denied.status, 429);
    assert.equal(denied.headers["retry-after"], "1000");
    assert.equal(denied.headers["content-type"], "application/problem+json; charset=utf-8");
    assert.deepEqual(JSON.parse(denied.body), {
      type: "https://iana.org/assignments/http-problem-types#quota-exceeded",
      title: "Request cannot be satisfied as assigned quota has been exceeded",
      status: 429,
      detail: "Rate limited by user: retry in 1000 s.",
      "violated-policies": ["user"],
    });
    // No identity: a 400, before anything is sent (never a way around the
    // limit); health checks are exempt.
    const missing = await get(`${s.url}/`);
    assert.equal(missing.status, 400);
    assert.equal(JSON.parse(missing.body).detail, "The user key is missing.");
    assert.equal((await get(`${s.url}/healthz`, { "x-user": "alice" })).status, 200);
    assert.equal(await c.client.exists("rl:user:alice"), 1);
  } finally {
    s.close();
    c.close();
  }
});

test("express middleware with Redis down: fail closed is a 503, fail open passes without fields", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  const quiet = { error() {}, warn() {} };
  const app = express();
  const rules = [{ bucket: USER, key: () => "bob" }];
  app.get("/closed", rateLimit(new Limiter(c.client, { onError: "closed", logger: quiet }), { rules }), (_q, r) =>
    r.send("x"),
  );
  app.get("/open", rateLimit(new Limiter(c.client, { onError: "open", logger: quiet }), { rules }), (_q, r) =>
    r.send("x"),
  );
  const s = await serve(app);
  try {
    assert.equal((await get(`${s.url}/open`)).status, 200);
    await server.stopAndWait();
    const closed = await get(`${s.url}/closed`);
    assert.equal(closed.status, 503);
    assert.equal(closed.headers["retry-after"], "1");
    assert.equal(JSON.parse(closed.body).detail, "The rate limiter is unavailable.");
    const open = await get(`${s.url}/open`);
    assert.equal(open.status, 200);
    assert.equal(open.headers.ratelimit, undefined);
  } finally {
    s.close();
    c.close();
  }
});

test("express-rate-limit with the Store: limit per window as a token bucket, 429, skip and reset", async () => {
  const t = await target("redis-7.0");
  const c = await client("ioredis", t.port);
  const store = new TokenBucketStore(new Limiter(c.client));
  const app = express();
  const limiter = expressRateLimit({
    windowMs: 60_000,
    limit: 3,
    standardHeaders: "draft-7",
    legacyHeaders: false,
    store,
    keyGenerator: (req) => req.headers["x-user"] ?? "anon",
    skipFailedRequests: true,
  });
  app.use(limiter);
  app.get("/", (_q, r) => r.send("ok"));
  app.get("/fail", (_q, r) => r.status(500).send("no"));
  const s = await serve(app);
  try {
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push((await get(`${s.url}/`, { "x-user": "u1" })).status);
    assert.deepEqual(statuses, [200, 200, 200, 429]);
    const denied = await get(`${s.url}/`, { "x-user": "u1" });
    // One token back every 20 s: Retry-After is the bucket's wait, not the window's.
    assert.ok(Number(denied.headers["retry-after"]) <= 20 && Number(denied.headers["retry-after"]) >= 19);
    assert.match(denied.headers.ratelimit, /limit=3, remaining=0/);
    // Its buckets are the package's: the same hash, under rl:erl:<limit>-in-<windowMs>ms:.
    assert.deepEqual(Object.keys(await c.client.hgetall("rl:erl:3-in-60000ms:u1")).sort(), ["tokens", "ts"]);
    // skipFailedRequests: a 500 is refunded (decrement).
    for (let i = 0; i < 5; i++) assert.equal((await get(`${s.url}/fail`, { "x-user": "u2" })).status, 500);
    assert.equal((await store.get("u2")).totalHits, 0);
    // get and resetKey.
    assert.equal((await store.get("u1")).totalHits, 3);
    await limiter.resetKey("u1");
    assert.equal((await store.get("u1")).totalHits, 0);
    assert.equal(await c.client.exists("rl:erl:3-in-60000ms:u1"), 0);
    assert.equal((await get(`${s.url}/`, { "x-user": "u1" })).status, 200);
  } finally {
    s.close();
    c.close();
  }
});

test("fastify plugin: every route of the instance, 429 problem, decision on the request", async () => {
  const t = await target("valkey-9.1");
  const c = await client("redis6", t.port);
  const app = Fastify({ forceCloseConnections: true }); // Node 18's server.close() waits for idle keep-alives
  await app.register(rateLimitPlugin, {
    limiter: new Limiter(c.client),
    rules: [
      { bucket: USER, key: (req) => req.headers["x-user"] },
      { bucket: USER.named("ip"), key: clientIp() },
    ],
    legacyHeaders: true,
  });
  app.get("/", async (req) => ({ remaining: req.rateLimit.decisions.map((d) => d.remaining) }));
  await app.listen({ port: 0, host: "127.0.0.1" });
  const url = `http://127.0.0.1:${app.server.address().port}`;
  try {
    const ok = await get(`${url}/`, { "x-user": "carol" });
    assert.equal(ok.status, 200);
    assert.deepEqual(JSON.parse(ok.body), { remaining: [1, 1] });
    assert.equal(ok.headers.ratelimit, '"user";r=1;t=1000, "ip";r=1;t=1000');
    assert.equal(ok.headers["x-ratelimit-limit"], "2");
    assert.equal((await get(`${url}/`, { "x-user": "dave" })).status, 200);
    const denied = await get(`${url}/`, { "x-user": "erin" }); // the IP bucket is empty
    assert.equal(denied.status, 429);
    assert.deepEqual(JSON.parse(denied.body)["violated-policies"], ["ip"]);
    assert.equal(denied.headers["retry-after"], "1000");
    assert.equal(await c.client.exists("rl:ip:127.0.0.1"), 1);
  } finally {
    await app.close();
    c.close();
  }
});

test("fetch handlers (Hono): a 429 Response with the fields, or the fields on the route's", async () => {
  const t = await target("redis-6.2");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const app = new Hono();
  app.get("/", async (ctx) => {
    const d = await lim.consume(`rl:user:${ctx.req.header("x-user")}`, USER);
    return rateLimitResponse(d) ?? withRateLimitHeaders(ctx.json({ ok: true }), d);
  });
  try {
    const ok = await app.request("/", { headers: { "x-user": "f" } });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get("ratelimit"), '"user";r=1;t=1000');
    await app.request("/", { headers: { "x-user": "f" } });
    const denied = await app.request("/", { headers: { "x-user": "f" } });
    assert.equal(denied.status, 429);
    assert.equal(denied.headers.get("retry-after"), "1000");
    assert.equal(denied.headers.get("content-type"), "application/problem+json");
    assert.equal((await denied.json()).status, 429);
    // Shed and failing closed are 503s.
    const shed = rateLimitResponse(
      (await lim.peek("x", USER)).with({ allowed: false, shed: true, retryAfterMs: 1000 }),
    );
    assert.deepEqual([shed.status, shed.headers.get("retry-after")], [503, "1"]);
  } finally {
    c.close();
  }
});

test("clientIp believes X-Forwarded-For only from trusted proxies", () => {
  const ip = clientIp(["10.0.0.0/8", "fd00::/8"]);
  const req = (peer, xff) => ({
    headers: xff === undefined ? {} : { "x-forwarded-for": xff },
    socket: { remoteAddress: peer },
  });
  assert.equal(ip(req("10.0.0.5", "1.2.3.4, 198.51.100.1, 10.1.1.1")), "198.51.100.1");
  assert.equal(ip(req("203.0.113.7", "198.51.100.1")), "203.0.113.7");
  assert.equal(ip(req("::ffff:203.0.113.7")), "203.0.113.7");
  assert.equal(ip(req("2001:db8:1:2:3:4:5:6")), "2001:db8:1:2::/64");
  assert.equal(ip(req("2001:db8::1")), "2001:db8::/64");
  assert.equal(ip(req("10.0.0.5", "garbage, 10.0.0.9")), "10.0.0.9");
  assert.equal(ip(req("fd00::1", "2001:db8:0:0:1::1")), "2001:db8::/64");
});

// ---- concurrency: a slot per request until its response is done ---------------------

const STREAMS = new Concurrency({ limit: 1, leaseMs: 60_000, name: "streams" });
const CALLS = new Bucket({ max: 10, rate: SLOW, name: "user" });

async function until(check, ms, what) {
  const deadline = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`${what}: not within ${ms} ms`);
    await sleep(10);
  }
}

/** A streamed response: its status, headers and first chunk read, the rest left for later. */
async function open(url, headers = {}) {
  const abort = new AbortController();
  const r = await fetch(url, { headers, signal: abort.signal });
  const reader = r.body.getReader();
  const first = new TextDecoder().decode((await reader.read()).value);
  return {
    status: r.status,
    headers: Object.fromEntries(r.headers),
    first,
    async rest() {
      let text = "";
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return text;
        text += new TextDecoder().decode(value);
      }
    },
    /** The client goes away: its connection closed mid-stream. */
    close: () => abort.abort(),
  };
}

/** A route that streams a first chunk, then waits for `release()` to end. */
function gated() {
  const waiting = [];
  return {
    async handle(write, end) {
      write("first\n");
      await new Promise((resolve) => waiting.push(resolve));
      end("last\n");
    },
    release: () => {
      for (const resolve of waiting.splice(0)) resolve();
    },
  };
}

test("express concurrencyLimit: a slot held until the response is sent or the client goes away; 429 with the fields", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const gate = gated();
  const app = express();
  app.use(
    concurrencyLimit(lim, {
      concurrency: { concurrency: STREAMS, key: (req) => req.headers["x-user"] },
      rules: [{ bucket: CALLS, key: (req) => req.headers["x-user"] }],
      skip: (req) => req.path === "/healthz",
    }),
  );
  app.get("/stream", (_req, res) =>
    gate.handle(
      (x) => res.write(x),
      (x) => res.end(x),
    ),
  );
  app.get("/lease", (_req, res) => res.json({ id: res.locals.lease.id, held: res.locals.lease.held }));
  app.get("/boom", () => {
    throw new Error("boom");
  });
  app.get("/healthz", (_req, res) => res.send("ok"));
  const s = await serve(app);
  const inFlight = () => lim.inFlight("rl:streams:alice");
  try {
    const a = await open(`${s.url}/stream`, { "x-user": "alice" });
    assert.deepEqual([a.status, a.first], [200, "first\n"]);
    assert.equal(a.headers["ratelimit-policy"], '"streams";q=1;qu="concurrent-requests", "user";q=10;w=10000');
    assert.equal(a.headers.ratelimit, '"streams";r=0, "user";r=9;t=1000');
    assert.equal(await inFlight(), 1);
    // No slot: a 429 that charges nothing.
    const denied = await get(`${s.url}/stream`, { "x-user": "alice" });
    assert.equal(denied.status, 429);
    assert.equal(denied.headers["retry-after"], "60");
    assert.equal(denied.headers.ratelimit, '"streams";r=0;t=60, "user";r=9;t=1000');
    assert.deepEqual(JSON.parse(denied.body)["violated-policies"], ["streams"]);
    assert.equal(JSON.parse(denied.body).detail, "Rate limited by streams: retry in 60 s.");
    assert.equal((await lim.peek("rl:user:alice", CALLS)).remaining, 9);
    // Others have their own slots; health checks and requests without an identity hold none.
    assert.equal((await get(`${s.url}/lease`, { "x-user": "bob" })).status, 200);
    assert.equal((await get(`${s.url}/healthz`, { "x-user": "alice" })).status, 200);
    assert.equal((await get(`${s.url}/healthz`)).status, 200);
    // Held until the last byte; given back then.
    await sleep(100);
    assert.equal(await inFlight(), 1);
    gate.release();
    assert.equal(await a.rest(), "last\n");
    await until(async () => (await inFlight()) === 0, 2000, "the slot given back after the last byte");
    // A client gone mid-stream frees its slot at once, not at the lease's expiry (60 s).
    const b = await open(`${s.url}/stream`, { "x-user": "alice" });
    assert.equal(await inFlight(), 1);
    b.close();
    await until(async () => (await inFlight()) === 0, 2000, "the slot freed when the client went away");
    gate.release();
    // A route that throws gives its slot back too.
    assert.equal((await get(`${s.url}/boom`, { "x-user": "alice" })).status, 500);
    await until(async () => (await inFlight()) === 0, 2000, "the slot given back after an error");
    assert.deepEqual(JSON.parse((await get(`${s.url}/lease`, { "x-user": "alice" })).body).held, "redis");
    await until(async () => (await c.client.exists("rl:streams:alice")) === 0, 2000, "the key gone");
  } finally {
    gate.release();
    s.close();
    c.close();
  }
});

test("express concurrencyLimit with Redis down: closed is a 503, open passes without fields", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  const quiet = { error() {}, warn() {} };
  const app = express();
  const concurrency = { concurrency: STREAMS, key: () => "carl" };
  for (const onError of ["open", "closed"]) {
    const lim = new Limiter(c.client, { onError, logger: quiet });
    app.get(`/${onError}`, concurrencyLimit(lim, { concurrency }), (_q, r) => r.send("x"));
  }
  const s = await serve(app);
  try {
    assert.equal((await get(`${s.url}/open`)).status, 200);
    await server.stopAndWait();
    const closed = await get(`${s.url}/closed`);
    assert.deepEqual([closed.status, closed.headers["retry-after"]], [503, "1"]);
    const open = await get(`${s.url}/open`);
    assert.deepEqual([open.status, open.headers.ratelimit], [200, undefined]);
  } finally {
    s.close();
    c.close();
  }
});

test("fastify concurrencyHook: the slot held until the reply is sent or the client goes away", async () => {
  const t = await target("redis-7.0");
  const c = await client("redis6", t.port);
  const lim = new Limiter(c.client);
  const gate = gated();
  const app = Fastify({ forceCloseConnections: true }); // a hijacked reply's connection is not idle to Fastify
  const hook = concurrencyHook(lim, { concurrency: { concurrency: STREAMS, key: (req) => req.headers["x-user"] } });
  app.get("/stream", { onRequest: hook }, async (request, reply) => {
    assert.equal(request.lease.acquired, true);
    reply.hijack();
    reply.raw.writeHead(200, { "content-type": "text/plain" });
    await gate.handle(
      (x) => reply.raw.write(x),
      (x) => reply.raw.end(x),
    );
  });
  app.get("/plain", { onRequest: hook }, async () => ({ ok: true }));
  await app.listen({ port: 0, host: "127.0.0.1" });
  const url = `http://127.0.0.1:${app.server.address().port}`;
  const inFlight = () => lim.inFlight("rl:streams:dana");
  try {
    const a = await open(`${url}/stream`, { "x-user": "dana" });
    assert.equal(a.status, 200);
    assert.equal(await inFlight(), 1);
    const denied = await get(`${url}/plain`, { "x-user": "dana" });
    assert.deepEqual([denied.status, denied.headers["retry-after"]], [429, "60"]);
    assert.equal(denied.headers["ratelimit-policy"], '"streams";q=1;qu="concurrent-requests"');
    gate.release();
    await a.rest();
    await until(async () => (await inFlight()) === 0, 2000, "the slot given back after the last byte");
    const ok = await get(`${url}/plain`, { "x-user": "dana" });
    assert.deepEqual([ok.status, ok.headers.ratelimit], [200, '"streams";r=0']);
    await until(async () => (await inFlight()) === 0, 2000, "the slot given back after a plain reply");
    const b = await open(`${url}/stream`, { "x-user": "dana" });
    assert.equal(await inFlight(), 1);
    b.close();
    await until(async () => (await inFlight()) === 0, 2000, "the slot freed when the client went away");
  } finally {
    gate.release();
    await app.close();
    c.close();
  }
});

test("concurrency rules are checked when written", () => {
  const lim = new Limiter({ call() {}, status: "ready" });
  const unnamed = new Concurrency({ limit: 1, leaseMs: 1000 });
  assert.throws(() => concurrencyLimit(lim, { concurrency: { concurrency: unnamed, key: () => "x" } }), /needs a name/);
  assert.throws(
    () => concurrencyHook(lim, { concurrency: { concurrency: STREAMS, key: () => "x", weight: 2 } }),
    /weight must not exceed limit/,
  );
  assert.throws(
    () =>
      concurrencyLimit(lim, {
        concurrency: { concurrency: STREAMS, key: () => "x" },
        rules: [{ bucket: USER.named("u"), key: () => "x", cost: 3 }],
      }),
    /cost must not exceed max/,
  );
});

test("a missing identity: fallback, optional (named in skipped), else a 400 in Express and Fastify", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const caller = new Bucket({ max: 1, rate: SLOW, name: "caller" });
  const anon = new Bucket({ max: 1, rate: SLOW, name: "anon" });
  const app = express();
  const byKeyOrIp = { bucket: caller, key: (req) => req.headers["x-key"], fallback: () => "192.0.2.7" };
  app.get("/fallback", rateLimit(lim, { rules: [byKeyOrIp] }), (_q, r) => r.send("ok"));
  app.get(
    "/optional",
    rateLimit(lim, { rules: [{ bucket: anon, key: (req) => req.headers["x-key"], optional: true }] }),
    (req, res) => res.json({ skipped: req.rateLimit.skipped, n: req.rateLimit.decisions.length }),
  );
  const s = await serve(app);
  const fastify = Fastify({ forceCloseConnections: true });
  await fastify.register(rateLimitPlugin, {
    limiter: lim,
    rules: [{ bucket: new Bucket({ max: 5, rate: SLOW, name: "fkey" }), key: (req) => req.headers["x-key"] }],
  });
  fastify.get("/", async () => ({ ok: true }));
  const url = await fastify.listen({ port: 0, host: "127.0.0.1" });
  try {
    assert.equal((await get(`${s.url}/fallback`)).status, 200);
    assert.equal((await get(`${s.url}/fallback`)).status, 429, "limited by the fallback identity");
    assert.equal(await c.client.exists("rl:caller:192.0.2.7"), 1);
    const skipped = await get(`${s.url}/optional`);
    assert.equal(skipped.status, 200);
    assert.deepEqual(JSON.parse(skipped.body), { skipped: ["anon"], n: 0 });
    assert.equal(skipped.headers["ratelimit-policy"], undefined);
    const refused = await get(`${url}/`);
    assert.equal(refused.status, 400);
    assert.match(refused.headers["content-type"], /^application\/problem\+json/);
    assert.equal(JSON.parse(refused.body).detail, "The fkey key is missing.");
    assert.equal(await c.client.exists("rl:fkey:undefined"), 0);
  } finally {
    s.close();
    await fastify.close();
    c.close();
  }
});
