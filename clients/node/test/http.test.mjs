// The package's own HTTP helpers as users of express-rate-limit and
// @fastify/rate-limit expect them: limiters stacked on one request, a
// custom refusal, the decision on the request, Express's trust proxy,
// resetting a key, policies that must not share keys, and fetch()
// Responses.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, test } from "node:test";
import express from "express";
import Fastify from "fastify";
import { Bucket, Concurrency, Limiter } from "redis-tokenbucket";
import * as ex from "redis-tokenbucket/express";
import { concurrencyHook, rateLimitHook, rateLimitPlugin } from "redis-tokenbucket/fastify";
import { withRateLimitHeaders } from "redis-tokenbucket/fetch";
import { client } from "./clients.mjs";
import { SLOW, stopAll, target } from "./servers.mjs";
import { get, serve } from "./web.mjs";

after(stopAll);

const IP = new Bucket({ max: 10, rate: SLOW, name: "ip" });
const STRICT = new Bucket({ max: 1, rate: SLOW, name: "strict" });
const ok = (_req, res) => res.send("ok");

async function listen(app) {
  await app.listen({ port: 0, host: "127.0.0.1" });
  return `http://127.0.0.1:${app.server.address().port}`;
}

test("stacked limiters send every policy that applied: the Fastify plugin and a route's hook, and Express", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const app = Fastify({ forceCloseConnections: true }); // Node 18's server.close() waits for idle keep-alives
  await app.register(rateLimitPlugin, { limiter: lim, rules: [{ bucket: IP, key: () => "f" }] });
  app.get("/", { onRequest: rateLimitHook(lim, { rules: [{ bucket: STRICT, key: () => "f" }] }) }, async () => "ok");
  const url = await listen(app);
  const site = express();
  site.use(ex.rateLimit(lim, { rules: [{ bucket: IP, key: () => "e" }] }));
  site.get("/", ex.rateLimit(lim, { rules: [{ bucket: STRICT, key: () => "e" }], legacyHeaders: true }), ok);
  const s = await serve(site);
  try {
    for (const base of [url, s.url]) {
      const first = await get(`${base}/`);
      assert.equal(first.status, 200, base);
      assert.equal(first.headers["ratelimit-policy"], '"ip";q=10;w=10000, "strict";q=1;w=1000');
      assert.equal(first.headers.ratelimit, '"ip";r=9;t=1000, "strict";r=0;t=1000');
      const denied = await get(`${base}/`);
      assert.equal(denied.status, 429);
      assert.equal(denied.headers["ratelimit-policy"], '"ip";q=10;w=10000, "strict";q=1;w=1000');
      assert.equal(denied.headers.ratelimit, '"ip";r=8;t=2000, "strict";r=0;t=1000');
      assert.equal(denied.headers["retry-after"], "1000");
      assert.deepEqual(JSON.parse(denied.body)["violated-policies"], ["strict"]);
    }
    // Express, legacy fields: the most restrictive of the two.
    assert.equal((await get(`${s.url}/`)).headers["x-ratelimit-remaining"], "0");
  } finally {
    await app.close();
    s.close();
    c.close();
  }
});

test("withRateLimitHeaders on a fetch() Response: a new Response with the fields, its body intact", async () => {
  const t = await target("redis-7.0");
  const c = await client("ioredis", t.port);
  const upstream = createServer((_req, res) => res.end("upstream body"));
  const s = await serve(upstream);
  try {
    const lim = new Limiter(c.client);
    const d = await lim.consume("rl:ip:g", IP);
    const proxied = await fetch(s.url); // its headers are immutable
    const answer = withRateLimitHeaders(proxied, d);
    assert.notEqual(answer, proxied);
    assert.equal(answer.status, 200);
    assert.equal(answer.headers.get("ratelimit"), '"ip";r=9;t=1000');
    assert.equal(proxied.headers.get("ratelimit"), null);
    // A second limiter's fields join the first's.
    const strict = await lim.consume("rl:strict:g", STRICT);
    const both = withRateLimitHeaders(answer, strict);
    assert.equal(both.headers.get("ratelimit"), '"ip";r=9;t=1000, "strict";r=0;t=1000');
    assert.equal(await both.text(), "upstream body");
  } finally {
    s.close();
    c.close();
  }
});

test("a custom refusal: statusCode and message, or a handler, as express-rate-limit has them", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const rules = (who) => [{ bucket: STRICT, key: () => who }];
  const site = express();
  const mw = ex.rateLimitMiddleware;
  site.get("/code", mw(lim, { rules: rules("a"), statusCode: 420, message: { error: "slow down" } }), ok);
  site.get("/text", mw(lim, { rules: rules("b"), message: "Too many requests" }), ok);
  site.get(
    "/handler",
    mw(lim, {
      rules: rules("c"),
      handler: (_req, res, _next, refusal) =>
        res
          .status(refusal.status)
          .json({ wait: refusal.decision.retryAfter, policies: refusal.body["violated-policies"] }),
    }),
    ok,
  );
  const app = Fastify({ forceCloseConnections: true }); // Node 18's server.close() waits for idle keep-alives
  app.get("/code", { onRequest: rateLimitHook(lim, { rules: rules("d"), statusCode: 420, message: "slow" }) }, ok);
  app.get(
    "/handler",
    {
      onRequest: rateLimitHook(lim, {
        rules: rules("e"),
        handler: (_request, reply, refusal) => reply.code(refusal.status).send({ wait: refusal.decision.retryAfter }),
      }),
    },
    async () => "ok",
  );
  const s = await serve(site);
  const url = await listen(app);
  try {
    const twice = async (path) => {
      assert.equal((await get(path)).status, 200, path);
      return get(path);
    };
    const code = await twice(`${s.url}/code`);
    assert.deepEqual([code.status, JSON.parse(code.body)], [420, { error: "slow down" }]);
    assert.equal(code.headers["retry-after"], "1000");
    assert.equal(code.headers.ratelimit, '"strict";r=0;t=1000');
    const text = await twice(`${s.url}/text`);
    assert.deepEqual([text.status, text.body], [429, "Too many requests"]);
    const handled = await twice(`${s.url}/handler`);
    assert.deepEqual([handled.status, JSON.parse(handled.body)], [429, { wait: 1000, policies: ["strict"] }]);
    assert.equal(handled.headers["retry-after"], "1000");
    const fcode = await twice(`${url}/code`);
    assert.deepEqual([fcode.status, fcode.body, fcode.headers["retry-after"]], [420, "slow", "1000"]);
    const fhandled = await twice(`${url}/handler`);
    assert.deepEqual([fhandled.status, JSON.parse(fhandled.body)], [429, { wait: 1000 }]);
  } finally {
    s.close();
    await app.close();
    c.close();
  }
});

test("Express: the decision on req.rateLimit, clientIp honours trust proxy, resetKey; the name beside express-rate-limit's", async () => {
  const t = await target("redis-7.0");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  assert.equal(ex.rateLimit, ex.rateLimitMiddleware); // the old name stays, an alias
  const limited = ex.rateLimitMiddleware(lim, {
    rules: [
      { bucket: IP, key: ex.clientIp() },
      { bucket: STRICT, key: (req) => req.headers["x-user"] },
    ],
  });
  const proxied = express();
  proxied.set("trust proxy", "loopback");
  proxied.use(limited);
  proxied.get("/", (req, res) =>
    res.json({
      remaining: req.rateLimit.decisions.map((d) => d.remaining),
      same: req.rateLimit === res.locals.rateLimit,
    }),
  );
  const direct = express();
  direct.use(ex.rateLimit(lim, { rules: [{ bucket: IP, key: ex.clientIp() }] }));
  direct.get("/", ok);
  const p = await serve(proxied);
  const d = await serve(direct);
  try {
    const first = await get(`${p.url}/`, { "x-forwarded-for": "203.0.113.9", "x-user": "alice" });
    assert.deepEqual(JSON.parse(first.body), { remaining: [9, 0], same: true });
    assert.equal(await c.client.exists("rl:ip:203.0.113.9"), 1);
    // Without trust proxy, X-Forwarded-For is the client's word: the peer counts.
    await get(`${d.url}/`, { "x-forwarded-for": "203.0.113.9" });
    assert.equal(await c.client.exists("rl:ip:127.0.0.1"), 1);
    assert.equal((await get(`${p.url}/`, { "x-forwarded-for": "203.0.113.9", "x-user": "alice" })).status, 429);
    // resetKey(identity): that identity's buckets of every rule, full again.
    await limited.resetKey("alice");
    assert.equal(await c.client.exists("rl:strict:alice"), 0);
    const again = await get(`${p.url}/`, { "x-forwarded-for": "198.51.100.1", "x-user": "alice" });
    assert.deepEqual(JSON.parse(again.body).remaining, [9, 0]);
    await limited.resetKey("203.0.113.9");
    assert.equal(await c.client.exists("rl:ip:203.0.113.9"), 0);
  } finally {
    p.close();
    d.close();
    c.close();
  }
});

test("Fastify: resetKey on the hook, and clientIp honours trustProxy as request.ip does", async () => {
  const t = await target("redis-7.0");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const hook = rateLimitHook(lim, { rules: [{ bucket: STRICT.named("once"), key: ex.clientIp() }] });
  const app = Fastify({ trustProxy: "127.0.0.1", forceCloseConnections: true });
  app.get("/", { onRequest: hook }, async (request) => ({ remaining: request.rateLimit.decisions[0].remaining }));
  const url = await listen(app);
  try {
    const headers = { "x-forwarded-for": "203.0.113.7" };
    assert.equal((await get(`${url}/`, headers)).status, 200);
    assert.equal(await c.client.exists("rl:once:203.0.113.7"), 1);
    assert.equal((await get(`${url}/`, headers)).status, 429);
    await hook.resetKey("203.0.113.7");
    assert.equal((await get(`${url}/`, headers)).status, 200);
  } finally {
    await app.close();
    c.close();
  }
});

test("policies of one name with different limits are refused when written: they would share prefix:name:identity", () => {
  const lim = new Limiter({ call() {}, status: "ready" });
  const key = () => "x";
  const ip600 = new Bucket({ max: 600, rate: 30, name: "ip" });
  const ip2 = new Bucket({ max: 2, rate: 0.1, name: "ip" });
  ex.rateLimit(lim, { rules: [{ bucket: ip600, key }] });
  const clash = /policy "ip" \(key rl:ip:<identity>\) is max 600, rate 30 on this limiter: not max 2, rate 0\.1/;
  assert.throws(() => ex.rateLimit(lim, { rules: [{ bucket: ip2, key }] }), clash);
  assert.throws(() => rateLimitHook(lim, { rules: [{ bucket: ip2, key }] }), clash);
  assert.throws(
    () =>
      ex.concurrencyLimit(lim, {
        concurrency: { concurrency: new Concurrency({ limit: 2, leaseMs: 1000, name: "ip" }), key },
      }),
    /policy "ip" \(key rl:ip:<identity>\) is max 600, rate 30 on this limiter: not a Concurrency/,
  );
  const other = new Limiter({ call() {}, status: "ready" });
  assert.throws(
    () =>
      ex.rateLimit(other, {
        rules: [
          { bucket: ip600, key },
          { bucket: ip2, key },
        ],
      }),
    clash,
  );
  // The same limits share on purpose (one policy on two routes); another
  // prefix, another name, or another limiter keep them apart.
  ex.rateLimit(lim, { rules: [{ bucket: ip600.named("ip"), key }] });
  ex.rateLimit(lim, { rules: [{ bucket: ip2, key, prefix: "login" }] });
  concurrencyHook(lim, {
    concurrency: { concurrency: new Concurrency({ limit: 2, leaseMs: 1000, name: "streams" }), key },
  });
  ex.rateLimit(new Limiter({ call() {}, status: "ready" }), { rules: [{ bucket: ip2, key }] });
  // A refusal's options too, when written.
  assert.throws(() => rateLimitHook(other, { rules: [{ bucket: ip2, key }], statusCode: 200 }), /statusCode must be/);
  assert.throws(() => ex.rateLimitMiddleware(other, { rules: [{ bucket: ip2, key }], message: 5 }), /message must be/);
});

test("a shadow rule is charged beside the enforced ones and never refuses: 200 past its limit, with the event", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const events = [];
  const info = [];
  const lim = new Limiter(c.client, {
    onDecision: (e) => events.push(e),
    logger: { error() {}, warn() {}, info: (m) => info.push(m) },
  });
  const KEY = new Bucket({ max: 2, rate: SLOW, name: "key" });
  const TRIAL = new Bucket({ max: 1, rate: SLOW, name: "trial" });
  const rules = (who) => [
    { bucket: KEY, key: () => who },
    { bucket: TRIAL, key: (req) => (req.headers["x-no-trial"] ? undefined : who), shadow: true },
  ];
  const app = Fastify({ forceCloseConnections: true });
  app.get("/", { onRequest: rateLimitHook(lim, { rules: rules("f") }) }, async () => "ok");
  const url = await listen(app);
  const site = express();
  site.get("/", ex.rateLimit(lim, { rules: rules("e") }), ok);
  const s = await serve(site);
  try {
    for (const base of [url, s.url]) {
      events.length = 0;
      const answers = [await get(`${base}/`), await get(`${base}/`), await get(`${base}/`)];
      assert.deepEqual(
        answers.map((a) => a.status),
        [200, 200, 429],
        base,
      );
      // The shadow rule puts no fields on the response and names no policy.
      assert.equal(answers[1].headers["ratelimit-policy"], '"key";q=2;w=2000');
      assert.deepEqual(JSON.parse(answers[2].body)["violated-policies"], ["key"]);
      // Its denial did not stop the enforced charge (the third is refused
      // by `key`), and it was counted for every request, the refused one too.
      const outcomes = (name) => events.filter((e) => e.policy === name).map((e) => e.outcome);
      assert.deepEqual(outcomes("key"), ["within_limit", "near_limit", "over_limit"], base);
      assert.deepEqual(outcomes("trial"), ["near_limit", "shadow_mode", "shadow_mode"], base);
      assert.ok(events.filter((e) => e.policy === "trial").every((e) => e.allowed && e.rule === "trial"));
      // Without its identity the shadow rule is skipped, never a 400.
      const skipped = await get(`${base}/`, { "x-no-trial": "1" });
      assert.equal(skipped.status, 429);
    }
    assert.ok(info.some((m) => m.includes("shadow mode let through a request trial would deny")));
  } finally {
    await app.close();
    s.close();
    c.close();
  }
});
