// The Store for express-rate-limit, as its users meet it: through
// express-rate-limit itself, over HTTP. Redis failing under each policy,
// stores of different limits side by side, and a limit that is a function
// of the request.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import express from "express";
import { rateLimit as expressRateLimit } from "express-rate-limit";
import { Bucket, Limiter } from "redis-tokenbucket";
import { TokenBucketStore } from "redis-tokenbucket/express";
import { client } from "./clients.mjs";
import { Server, stopAll, target } from "./servers.mjs";
import { erlLogger, get, QUIET, serve } from "./web.mjs";

after(stopAll);

const HOUR = 3_600_000;
const ok = (_req, res) => res.send("ok");

test('Redis down, onError "closed": a 503 with Retry-After: 1, as the package\'s own helpers answer', async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  const app = express();
  app.set("env", "test"); // Express's error handler logs no stack traces
  const limited = (passOnStoreError, logger) =>
    expressRateLimit({
      windowMs: HOUR,
      limit: 5,
      standardHeaders: "draft-8",
      legacyHeaders: false,
      passOnStoreError,
      logger,
      store: new TokenBucketStore(new Limiter(c.client, { onError: "closed", logger: QUIET })),
    });
  const logger = erlLogger();
  app.get("/", limited(false, logger), ok);
  app.get("/pass", limited(true, erlLogger()), ok);
  const s = await serve(app);
  try {
    assert.equal((await get(`${s.url}/`)).status, 200);
    await server.stopAndWait();
    const closed = await get(`${s.url}/`);
    assert.equal(closed.status, 503);
    assert.equal(closed.headers["retry-after"], "1");
    // No "r=0; t=0" (retry now): Redis said nothing to report.
    assert.equal(closed.headers.ratelimit, undefined);
    assert.deepEqual(logger.codes(), []);
    // passOnStoreError lets a failing store through, never a limiter that
    // fails closed: still a denial, and still "retry in 1 s".
    const passed = await get(`${s.url}/pass`);
    assert.equal(passed.status, 429);
    assert.equal(passed.headers["retry-after"], "1");
    assert.match(passed.headers.ratelimit, /; r=0; t=1$/);
  } finally {
    s.close();
    c.close();
  }
});

test('Redis down from the first request, onError "open": a valid record, no ERR_ERL_ warning, no quota promised', async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  const logger = erlLogger();
  const app = express();
  app.use(
    expressRateLimit({
      windowMs: HOUR,
      limit: 5,
      standardHeaders: "draft-7",
      legacyHeaders: true,
      logger,
      store: new TokenBucketStore(new Limiter(c.client, { onError: "open", logger: QUIET })),
    }),
  );
  app.get("/", ok);
  const s = await serve(app);
  try {
    await server.stopAndWait();
    for (let i = 0; i < 7; i++) {
      const r = await get(`${s.url}/`);
      assert.equal(r.status, 200); // unlimited while Redis is down: what "open" means
      // Nothing was counted, so nothing is promised: none left, look again in a second.
      assert.equal(r.headers.ratelimit, "limit=5, remaining=0, reset=1");
      assert.equal(r.headers["x-ratelimit-remaining"], "0");
    }
    // express-rate-limit checks the first answer: a positive count and a reset time.
    assert.deepEqual(logger.codes(), []);
  } finally {
    s.close();
    c.close();
  }
});

test("stores of different limits keep different keys: a global limit and a login limit", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const logger = erlLogger();
  const options = {
    windowMs: HOUR,
    standardHeaders: "draft-8",
    legacyHeaders: false,
    keyGenerator: (req) => req.headers["x-user"],
    logger,
  };
  const app = express();
  app.use(expressRateLimit({ ...options, limit: 100, store: new TokenBucketStore(lim) }));
  app.post("/login", expressRateLimit({ ...options, limit: 2, store: new TokenBucketStore(lim) }), ok);
  app.get("/", ok);
  const s = await serve(app);
  try {
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await get(`${s.url}/login`, { "x-user": "u" }, "POST")).status);
    assert.deepEqual(statuses, [200, 200, 429]);
    // The global limit has its own bucket: 4 of 100 used.
    const home = await get(`${s.url}/`, { "x-user": "u" });
    assert.equal(home.status, 200);
    assert.match(home.headers.ratelimit, /; r=96; t=\d+$/);
    assert.deepEqual(logger.codes(), []); // no ERR_ERL_DOUBLE_COUNT
    assert.deepEqual((await c.client.keys("rl:erl:*")).sort(), [
      "rl:erl:100-in-3600000ms:u",
      "rl:erl:2-in-3600000ms:u",
    ]);
    // A Store given a bucket: the key says its max and rate.
    const given = new TokenBucketStore(lim, { bucket: new Bucket({ max: 3, rate: 0.5 }) });
    given.init({ limit: 3, windowMs: 6000 });
    await given.increment("v");
    assert.equal(await c.client.exists("rl:erl:3-at-0.5ps:v"), 1);
    // A prefix given is the user's choice, taken as it is (shared on purpose).
    const mine = new TokenBucketStore(lim, { prefix: "app:" });
    mine.init({ limit: 3, windowMs: 6000 });
    assert.equal(mine.prefix, "app:");
    await mine.increment("v");
    assert.equal(await c.client.exists("app:v"), 1);
  } finally {
    s.close();
    c.close();
  }
});

test("a function limit: each request's limit is its own bucket (store.wrap gives the store the request)", async () => {
  const t = await target("redis-7.0");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const logger = erlLogger();
  const store = new TokenBucketStore(lim);
  const limited = store.wrap(
    expressRateLimit({
      windowMs: HOUR,
      limit: (req) => (req.headers["x-tier"] === "pro" ? 4 : 2),
      keyGenerator: (req) => req.headers["x-user"],
      standardHeaders: "draft-8",
      legacyHeaders: false,
      skipFailedRequests: true,
      logger,
      store,
    }),
  );
  const app = express();
  app.set("env", "test");
  app.use(limited);
  app.get("/", ok);
  app.get("/fail", (_req, res) => res.status(500).send("no"));
  const s = await serve(app);
  try {
    const run = async (n, headers) => {
      const out = [];
      for (let i = 0; i < n; i++) out.push((await get(`${s.url}/`, headers)).status);
      return out;
    };
    assert.deepEqual(await run(3, { "x-user": "alice" }), [200, 200, 429]);
    assert.deepEqual(await run(5, { "x-user": "bob", "x-tier": "pro" }), [200, 200, 200, 200, 429]);
    const pro = await get(`${s.url}/`, { "x-user": "carol", "x-tier": "pro" });
    assert.match(pro.headers.ratelimit, /^"4-in-1hr"; r=3; t=\d+$/);
    assert.deepEqual((await c.client.keys("rl:erl:*")).sort(), [
      "rl:erl:2-in-3600000ms:alice",
      "rl:erl:4-in-3600000ms:bob",
      "rl:erl:4-in-3600000ms:carol",
    ]);
    assert.deepEqual(logger.codes(), []);
    // skipFailedRequests: a failed request's token comes back, to its own limit's bucket.
    for (let i = 0; i < 3; i++) assert.equal((await get(`${s.url}/fail`, { "x-user": "dave" })).status, 500);
    const deadline = performance.now() + 2000;
    while ((await c.client.exists("rl:erl:2-in-3600000ms:dave")) === 1 && performance.now() < deadline) await sleep(10);
    assert.equal(await c.client.exists("rl:erl:2-in-3600000ms:dave"), 0); // full again: refunded
    // resetKey, through the wrapped middleware, resets the key for every limit it was counted under.
    await limited.resetKey("alice");
    assert.deepEqual(await run(1, { "x-user": "alice" }), [200]);
    assert.equal((await limited.getKey("alice")).totalHits, 1);
  } finally {
    s.close();
    c.close();
  }
});

test("a function limit unwrapped stops the app at startup, naming store.wrap, not a 500 per request", () => {
  // The store can't know such a limit without the request: an app that
  // forgot store.wrap must not start, let alone serve 500s.
  const app = (wrap) => `
    const express = require("express");
    const { rateLimit } = require("express-rate-limit");
    const { Limiter } = require("redis-tokenbucket");
    const { TokenBucketStore } = require("redis-tokenbucket/express");
    const Redis = require("ioredis");
    const store = new TokenBucketStore(new Limiter(new Redis({ lazyConnect: true })));
    const limited = rateLimit({ windowMs: 60000, limit: () => 2, store });
    express().use(${wrap ? "store.wrap(limited)" : "limited"});
    setTimeout(() => console.log("serving"), 50);`;
  const run = (wrap) => spawnSync(process.execPath, ["-e", app(wrap)], { encoding: "utf8", timeout: 10_000 });
  const bare = run(false);
  assert.notEqual(bare.status, 0);
  assert.match(
    bare.stderr,
    /TypeError: TokenBucketStore: a function `limit` needs the request.*store\.wrap\(rateLimit/,
  );
  assert.doesNotMatch(bare.stdout, /serving/);
  const wrapped = run(true);
  assert.equal(wrapped.status, 0, wrapped.stderr);
  assert.equal(wrapped.stdout, "serving\n");
});
