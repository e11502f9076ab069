// A rule's penalty (blockMs), a rule that always denies (Deny), and trusted
// callers who skip a rule (skip), in Express and Fastify over HTTP.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import express from "express";
import Fastify from "fastify";
import { Bucket, InvalidArgument, Limiter, Quota } from "redis-tokenbucket";
import { Deny, rateLimit } from "redis-tokenbucket/express";
import { rateLimitPlugin } from "redis-tokenbucket/fastify";
import { client } from "./clients.mjs";
import { stopAll, target } from "./servers.mjs";
import { get, serve } from "./web.mjs";

after(stopAll);

// 1 token, refilled at 0.01/s: a denial at an empty bucket waits 100 s.
const TINY = new Bucket({ max: 1, rate: 0.01, name: "key" });

test("express: a denial is blocked for the rule's blockMs, once", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const app = express();
  app.use(rateLimit(lim, { rules: [{ bucket: TINY, key: (req) => req.headers["x-key"], blockMs: 150_000 }] }));
  app.get("/", (_q, r) => r.json({ ok: true }));
  const s = await serve(app);
  const tokens = async () => Number(await c.client.hget("rl:key:k1", "tokens"));
  try {
    assert.equal((await get(`${s.url}/`, { "x-key": "k1" })).status, 200);
    assert.ok((await tokens()) < 0.01, "the admitted call paid its token, no penalty");
    const denied = await get(`${s.url}/`, { "x-key": "k1" });
    assert.equal(denied.status, 429);
    // The wait was 100 s; the penalty makes it 150 s: 0.5 token of debt.
    assert.equal(denied.headers["retry-after"], "150");
    const debt = await tokens();
    assert.ok(debt > -0.51 && debt < -0.49, `debt ${debt}`);
    // Denied again inside the block: in debt, nothing more charged.
    const again = await get(`${s.url}/`, { "x-key": "k1" });
    assert.equal(again.status, 429);
    assert.ok(Number(again.headers["retry-after"]) <= 150);
    const still = await tokens();
    assert.ok(still > -0.51 && still < -0.49, `debt ${still}`);
  } finally {
    s.close();
    c.close();
  }
});

test("a block past what the floor holds is refused when the rule is written", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const key = (req) => req.headers["x-key"];
  try {
    // From -max to a cost of 1: 1000 * (1 + 1) / 0.01 = 200000 ms.
    rateLimit(lim, { rules: [{ bucket: TINY, key, blockMs: 200_000 }] });
    assert.throws(
      () => rateLimit(lim, { rules: [{ bucket: TINY, key, blockMs: 200_001 }] }),
      (e) => e instanceof InvalidArgument && e.field === "blockMs" && /blockMs 200001 .* = 200000 ms/.test(e.message),
    );
    assert.throws(() => rateLimit(lim, { rules: [{ bucket: TINY, key, blockMs: 0 }] }), /blockMs must be > 0/);
    const daily = new Quota({ limit: 5, period: "day", name: "daily" });
    assert.throws(() => rateLimit(lim, { rules: [{ bucket: daily, key, blockMs: 10 }] }), /blockMs needs a Bucket/);
    const banned = new Deny({ name: "banned" });
    assert.throws(() => rateLimit(lim, { rules: [{ bucket: banned, key, blockMs: 10 }] }), /a Deny takes no blockMs/);
    assert.throws(() => new Deny({ name: "banned", retryAfter: 0 }), /retryAfter/);
    assert.throws(() => rateLimit(lim, { rules: [{ bucket: TINY, key, skip: ["x"] }] }), /skip is a function/);
  } finally {
    c.close();
  }
});

test("a Deny rule refuses without calling Redis; a trusted caller skips it (Express and Fastify)", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const rules = [
    { bucket: new Deny({ name: "banned" }), key: (req) => req.headers["x-peer"], skip: new Set(["198.51.100.9"]) },
    { bucket: TINY, key: (req) => req.headers["x-key"], optional: true },
  ];
  const app = express();
  app.use(rateLimit(lim, { rules }));
  app.get("/", (req, res) => res.json({ skipped: req.rateLimit.skipped }));
  const s = await serve(app);
  const fastify = Fastify({ forceCloseConnections: true });
  await fastify.register(rateLimitPlugin, { limiter: lim, rules });
  fastify.get("/", async () => ({ ok: true }));
  const url = await fastify.listen({ port: 0, host: "127.0.0.1" });
  try {
    for (const base of [s.url, url]) {
      const denied = await get(`${base}/`, { "x-peer": "198.51.100.7", "x-key": "k1" });
      assert.equal(denied.status, 429);
      assert.match(denied.headers["content-type"], /^application\/problem\+json/);
      assert.equal(denied.headers["retry-after"], "3600");
      assert.equal(denied.headers["ratelimit-policy"], '"banned";q=0');
      assert.equal(denied.headers.ratelimit, '"banned";r=0;t=3600');
      assert.deepEqual(JSON.parse(denied.body)["violated-policies"], ["banned"]);
    }
    assert.deepEqual(await c.client.keys("*"), [], "nothing was sent");
    const ok = await get(`${s.url}/`, { "x-peer": "198.51.100.9", "x-key": "k1" });
    assert.equal(ok.status, 200);
    assert.deepEqual(JSON.parse(ok.body), { skipped: ["banned"] });
    assert.match(ok.headers["ratelimit-policy"], /^"key";q=1/);
  } finally {
    s.close();
    await fastify.close();
    c.close();
  }
});

test("express: a trusted caller's function skips the rule, named in skipped", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const trusted = async (req) => req.headers["x-key"] === "internal";
  const app = express();
  app.use(rateLimit(lim, { rules: [{ bucket: TINY, key: (req) => req.headers["x-key"], skip: trusted }] }));
  app.get("/", (req, res) => res.json({ skipped: req.rateLimit.skipped, n: req.rateLimit.decisions.length }));
  const s = await serve(app);
  try {
    for (let i = 0; i < 3; i++) {
      const r = await get(`${s.url}/`, { "x-key": "internal" });
      assert.equal(r.status, 200);
      assert.deepEqual(JSON.parse(r.body), { skipped: ["key"], n: 0 });
    }
    assert.deepEqual(await c.client.keys("*"), [], "skipped before anything was sent");
    assert.equal((await get(`${s.url}/`, { "x-key": "k1" })).status, 200);
    assert.equal((await get(`${s.url}/`, { "x-key": "k1" })).status, 429);
  } finally {
    s.close();
    c.close();
  }
});
