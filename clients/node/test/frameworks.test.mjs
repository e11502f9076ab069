// Express (the middleware, and the Store under express-rate-limit itself),
// Fastify (the plugin and the hook), and fetch handlers (Hono), over HTTP.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import express from "express";
import { rateLimit as expressRateLimit } from "express-rate-limit";
import Fastify from "fastify";
import { Hono } from "hono";
import { Bucket, Limiter } from "redis-tokenbucket";
import { clientIp, rateLimit, TokenBucketStore } from "redis-tokenbucket/express";
import { rateLimitPlugin } from "redis-tokenbucket/fastify";
import { rateLimitResponse, withRateLimitHeaders } from "redis-tokenbucket/fetch";
import { client } from "./clients.mjs";
import { Server, SLOW, stopAll, target } from "./servers.mjs";

after(stopAll);

const USER = new Bucket({ max: 2, rate: SLOW, name: "user" });

async function serve(app) {
  const server = app.listen(0, "127.0.0.1");
  await new Promise((r) => server.once("listening", r));
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

async function get(url, headers = {}) {
  const r = await fetch(url, { headers });
  return { status: r.status, headers: Object.fromEntries(r.headers), body: await r.text() };
}

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
    // No identity: the rule is skipped; health checks are exempt.
    assert.equal((await get(`${s.url}/`)).status, 200);
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
    // Its buckets are the package's: the same hash under rl:erl:.
    assert.deepEqual(Object.keys(await c.client.hgetall("rl:erl:u1")).sort(), ["tokens", "ts"]);
    // skipFailedRequests: a 500 is refunded (decrement).
    for (let i = 0; i < 5; i++) assert.equal((await get(`${s.url}/fail`, { "x-user": "u2" })).status, 500);
    assert.equal((await store.get("u2")).totalHits, 0);
    // get and resetKey.
    assert.equal((await store.get("u1")).totalHits, 3);
    await limiter.resetKey("u1");
    assert.equal((await store.get("u1")).totalHits, 0);
    assert.equal(await c.client.exists("rl:erl:u1"), 0);
    assert.equal((await get(`${s.url}/`, { "x-user": "u1" })).status, 200);
  } finally {
    s.close();
    c.close();
  }
});

test("fastify plugin: every route of the instance, 429 problem, decision on the request", async () => {
  const t = await target("valkey-9.1");
  const c = await client("redis6", t.port);
  const app = Fastify();
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
