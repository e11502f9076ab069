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
import { Bucket, Limiter } from "redis-tokenbucket";
import * as ex from "redis-tokenbucket/express";
import { rateLimitHook, rateLimitPlugin } from "redis-tokenbucket/fastify";
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
  const app = Fastify();
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
