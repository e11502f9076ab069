// Calendar quotas and reservations: the Quota rule as built, its headers,
// and both against Redis 7.0 with the module and with the Lua library (a
// quota at its limit, a refund, a key of the other shape; callers of
// `wait` paced at the bucket's rate), and an Express rule that delays.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import express from "express";
import Fastify from "fastify";
import {
  Breaker,
  Bucket,
  Concurrency,
  Decision,
  InvalidArgument,
  Limiter,
  Quota,
  rateLimitHeaders,
} from "redis-tokenbucket";
import { rateLimit } from "redis-tokenbucket/express";
import { rateLimitPlugin } from "redis-tokenbucket/fastify";
import { client } from "./clients.mjs";
import { Server, SLOW, stopAll, target } from "./servers.mjs";
import { get, serve } from "./web.mjs";

after(stopAll);

const BACKENDS = ["redis-7.0+module", "redis-7.0"];

test("a Quota is checked when built, with the module's messages", () => {
  const q = new Quota({ limit: 1000, period: "Month", offset: -300, name: "plan" });
  assert.deepEqual([q.max, q.period, q.offset, q.name], [1000, "MONTH", -300, "plan"]);
  assert.deepEqual([...q.args, ...q.tail], ["1000", "MONTH", "OFFSET", "-300"]);
  assert.deepEqual(new Quota({ limit: 5, period: 3600 }).tail, []);
  const refused = (options, text) =>
    assert.throws(
      () => new Quota(options),
      (e) => e instanceof InvalidArgument && e.message === text,
    );
  refused({ limit: 0, period: "day" }, "limit must be > 0 and <= 1e12");
  refused(
    { limit: 10, period: "fortnight" },
    "period must be DAY, WEEK, MONTH, YEAR or whole seconds from 1 to 10000000000",
  );
  refused({ limit: 10, period: 1.5 }, "period must be DAY, WEEK, MONTH, YEAR or whole seconds from 1 to 10000000000");
  refused(
    { limit: 10, period: 1e10 + 1 },
    "period must be DAY, WEEK, MONTH, YEAR or whole seconds from 1 to 10000000000",
  );
  refused({ limit: 10, period: "day", offset: 1440 }, "offset must be >= -1439 and <= 1439");
  refused({ limit: 10, period: "day", offset: 1.5 }, "offset must be an integer");
  assert.ok(new Quota({ limit: 1, period: 1e10 }));
});

test("a quota's RateLimit fields name its period, and w is the period's length", () => {
  const month = new Quota({ limit: 1000, period: "month" });
  // 2024-02-10 UTC, 19 days to the end of February (29 days: a leap year).
  const now = Date.UTC(2024, 1, 10);
  assert.equal(month.windowSeconds(19 * 86_400_000, now), 29 * 86_400);
  assert.equal(new Quota({ limit: 1, period: "year" }).windowSeconds(86_400_000, Date.UTC(2023, 11, 31)), 365 * 86_400);
  const d = new Decision(true, 990, 0, 86_400_000, "k", new Quota({ limit: 1000, period: "day" }), 10);
  assert.deepEqual(rateLimitHeaders(d), {
    "RateLimit-Policy": '"day";q=1000;w=86400',
    RateLimit: '"day";r=990;t=86400',
  });
  const fixed = new Decision(false, 0, 1500, 1500, "k", new Quota({ limit: 5, period: 60 }), 1);
  assert.equal(rateLimitHeaders(fixed)["RateLimit-Policy"], '"60s";q=5;w=60');
  assert.equal(rateLimitHeaders(fixed)["Retry-After"], "2");
});

test("an admitted reservation has its delay, and no Retry-After", () => {
  const b = new Bucket({ max: 2, rate: 4, name: "b" });
  const d = new Decision(true, -1, 250, 750, "k", b, 1);
  assert.equal(d.delayMs, 250);
  assert.equal(rateLimitHeaders(d)["Retry-After"], undefined);
  assert.equal(new Decision(false, -1, 500, 750, "k", b, 1).delayMs, 0);
});

test("wait needs maxWaitMs, and a quota never reserves", async () => {
  const lim = new Limiter({ status: "ready", call: () => Promise.reject(new Error("nothing is sent")) });
  const q = new Quota({ limit: 10, period: "day" });
  const b = new Bucket({ max: 2, rate: 4 });
  await assert.rejects(lim.wait("k", b, 1), TypeError);
  await assert.rejects(lim.wait("k", b, 1, { maxWaitMs: 1.5 }), /maxWaitMs must be an integer/);
  await assert.rejects(
    lim.consume("k", b, 1, { maxWaitMs: 1e14 + 1 }),
    /maxWaitMs must be >= 0 and <= 1e\+14|100000000000000/,
  );
  await assert.rejects(lim.consume("k", q, 1, { maxWaitMs: 10 }), InvalidArgument);
  await assert.rejects(lim.consume("k", q, 11), /cost must not exceed limit/);
  await assert.rejects(
    lim.acquire("s", new Concurrency({ limit: 1, leaseMs: 1000 }), { buckets: [["k", q, 11]] }),
    /cost must not exceed limit, it could never pass \(group 1\)/,
  );
});

for (const name of BACKENDS) {
  test(`a lease and a monthly quota on ${name}: taken together or not at all`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client);
      const streams = new Concurrency({ limit: 2, leaseMs: 30_000 });
      const month = new Quota({ limit: 10, period: "month", offset: 60 });
      const minute = new Bucket({ max: 5, rate: 0.1 });
      const buckets = [
        ["{u}:month", month, 6],
        ["{u}:minute", minute, 1],
      ];
      const first = await lim.acquire("{u}:streams", streams, { buckets });
      assert.equal(first.acquired, true);
      assert.deepEqual(
        first.decisions.map((d) => d.remaining),
        [4, 4],
      );
      // The quota can't pay: no slot taken, the bucket not charged.
      const denied = await lim.acquire("{u}:streams", streams, { buckets });
      assert.deepEqual([denied.acquired, denied.inUse], [false, 1]);
      assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs === denied.decisions[0].retryAfterMs);
      assert.equal((await lim.peek("{u}:minute", minute, 0)).remaining, 4);
      // A retry of the lease taken charges nothing again.
      const again = await lim.acquire("{u}:streams", streams, { buckets, id: first.id });
      assert.deepEqual([again.acquired, again.inUse], [true, 1]);
      assert.equal((await lim.peek("{u}:month", month, 0)).remaining, 4);
    } finally {
      await c.close();
    }
  });

  test(`a quota on ${name}: denied at its limit until the period ends, refunded by adjust`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client);
      const q = new Quota({ limit: 3, period: 3600, name: "hourly" });
      for (const left of [2, 1, 0]) {
        const d = await lim.consume("q:user", q);
        assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs], [true, left, 0]);
      }
      const denied = await lim.consume("q:user", q);
      const toEnd = 3_600_000 - (Date.now() % 3_600_000);
      assert.equal(denied.allowed, false);
      assert.ok(Math.abs(denied.retryAfterMs - toEnd) < 2000, `retry ${denied.retryAfterMs}, period ends in ${toEnd}`);
      assert.equal(lim.backend, t.backend);
      const peeked = await lim.peek("q:user", q);
      assert.equal(peeked.allowed, false);
      const refund = await lim.adjust("q:user", q, 1);
      assert.deepEqual([refund.allowed, refund.remaining, refund.retryAfterMs], [true, 1, 0]);
      assert.equal((await lim.consume("q:user", q)).allowed, true);
      assert.equal((await lim.consume("q:user", q)).allowed, false);
      // An offset is sent and taken: another calendar, another key's state.
      const shifted = new Quota({ limit: 2, period: "day", offset: 330 });
      assert.equal((await lim.consume("q:india", shifted, 2)).remaining, 0);
    } finally {
      c.close();
    }
  });

  test(`on ${name}, consumeMany charges a quota and a bucket all or nothing (TB.CHARGE), with a wait`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client);
      const month = new Quota({ limit: 10, period: "month" });
      const minute = new Bucket({ max: 3, rate: 0.05 });
      const both = await lim.consumeMany([
        ["m:q", month, 3],
        ["m:b", minute, 3],
      ]);
      assert.ok(both.allowed);
      assert.deepEqual(
        both.decisions.map((d) => d.remaining),
        [7, 0],
      );
      // The bucket is empty: the quota is not charged either.
      const denied = await lim.consumeMany([
        ["m:q", month, 1],
        ["m:b", minute, 1],
      ]);
      assert.equal(denied.allowed, false);
      assert.equal(denied.deniedBy[0]?.key, "m:b");
      assert.equal((await lim.peek("m:q", month, 0)).remaining, 7);
      // With a wait the bucket's tokens are reserved: admitted, with its delay.
      const reserved = await lim.consumeMany(
        [
          ["m:q", month, 1],
          ["m:b", minute, 1],
        ],
        { maxWaitMs: 60_000 },
      );
      assert.ok(reserved.allowed && reserved.delayMs > 0 && reserved.delayMs <= 20_000, `${reserved.delayMs}`);
      assert.equal((await lim.peek("m:q", month, 0)).remaining, 6);
    } finally {
      c.close();
    }
  });

  test(`on ${name}, a quota key used as a bucket (and back) is a usage error, whatever the policy`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client, { onError: "open" });
      await lim.consume("q:shape", new Quota({ limit: 5, period: "day" }));
      await assert.rejects(lim.consume("q:shape", new Bucket({ max: 5, rate: 1 })), /key is not a token bucket/);
      await lim.consume("b:shape", new Bucket({ max: 5, rate: SLOW }));
      await assert.rejects(lim.consume("b:shape", new Quota({ limit: 5, period: "day" })), /key is not a quota/);
    } finally {
      c.close();
    }
  });

  test(`on ${name}, 20 concurrent callers of wait are paced at the rate, none denied`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client, { timeoutMs: 2000 });
      // A reservation goes no deeper than a debt of -max: a bucket of 20,
      // emptied first, takes 20 callers in debt, each a token after the last.
      const bucket = new Bucket({ max: 20, rate: 20 });
      assert.equal((await lim.consume("paced", bucket, 20)).allowed, true);
      const started = performance.now();
      const done = await Promise.all(
        Array.from({ length: 20 }, async () => {
          const d = await lim.wait("paced", bucket, 1, { maxWaitMs: 5000 });
          return { d, at: performance.now() - started };
        }),
      );
      assert.ok(
        done.every(({ d }) => d.allowed),
        `none denied: ${done.map(({ d }) => d.retryAfterMs).join(", ")}`,
      );
      // Sorted by delay, the k-th caller's turn is k / rate from the start, within one token (50 ms).
      const delays = done.map(({ d }) => d.delayMs).sort((a, b) => a - b);
      for (const [i, delay] of delays.entries()) {
        const k = i + 1;
        assert.ok(Math.abs(delay - 50 * k) <= 50, `caller ${k}: delay ${delay} ms, expected about ${50 * k}`);
      }
      // And each went ahead no sooner than its delay.
      for (const { d, at } of done) assert.ok(at >= d.delayMs - 1, `went at ${at} ms, before its delay ${d.delayMs}`);
    } finally {
      c.close();
    }
  });
}

test("onError local runs a quota on this process's share while Redis is down; wait does not sleep", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  try {
    const quiet = { error() {}, warn() {} };
    const lim = new Limiter(c.client, {
      onError: "local",
      processes: 2,
      logger: quiet,
      breaker: new Breaker({ failures: 1 }),
    });
    const q = new Quota({ limit: 6, period: "day", offset: 60 });
    await lim.consume("warm", q);
    await server.stopAndWait();
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await lim.consume("q:down", q));
    assert.ok(answers.every((d) => d.degraded));
    assert.deepEqual(
      answers.map((d) => d.allowed),
      [true, true, true, false],
    );
    assert.ok(answers[3].retryAfterMs > 0, "a local quota denial waits for the period's end");
    const b = new Bucket({ max: 2, rate: 1 });
    await lim.consume("b:down", b, 1);
    const begun = performance.now();
    const d = await lim.wait("b:down", b, 1, { maxWaitMs: 5000 });
    assert.ok(d.degraded && d.allowed && d.delayMs > 0, `a local reservation: ${JSON.stringify(d)}`);
    assert.ok(performance.now() - begun < d.delayMs, "a degraded answer is returned without sleeping");
  } finally {
    c.close();
    server.stop();
  }
});

test("an Express rule with maxDelayMs delays a request over the bucket instead of a 429", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const app = express();
  const paced = new Bucket({ max: 2, rate: 10, name: "paced" });
  const slow = new Bucket({ max: 1, rate: SLOW, name: "slow" });
  app.get("/paced", rateLimit(lim, { rules: [{ bucket: paced, key: () => "a", maxDelayMs: 1000 }] }), (_q, r) =>
    r.send("ok"),
  );
  app.get("/slow", rateLimit(lim, { rules: [{ bucket: slow, key: () => "a", maxDelayMs: 100 }] }), (_q, r) =>
    r.send("ok"),
  );
  const s = await serve(app);
  try {
    const begun = performance.now();
    const answers = await Promise.all([1, 2, 3, 4].map(() => get(`${s.url}/paced`)));
    assert.deepEqual(
      answers.map((a) => a.status),
      [200, 200, 200, 200],
    );
    assert.equal(
      answers.some((a) => a.headers["retry-after"] !== undefined),
      false,
    );
    // Two from the bucket, two in debt: the last waited two tokens' time at 10 per second.
    assert.ok(performance.now() - begun >= 150, "the requests over the bucket were delayed");
    assert.equal((await get(`${s.url}/slow`)).status, 200);
    const refused = await get(`${s.url}/slow`);
    assert.equal(refused.status, 429);
    assert.ok(Number(refused.headers["retry-after"]) > 100);
  } finally {
    s.close();
    c.close();
  }
  assert.throws(
    () =>
      rateLimit(lim, {
        rules: [
          { bucket: paced, key: () => "a", maxDelayMs: 10 },
          { bucket: slow, key: () => "a" },
        ],
      }),
    /maxDelayMs is one wait for the whole decision/,
  );
});

test("several rules share one maxDelayMs (TB.CHARGE WAIT), and a quota rule beside them never delays", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const lim = new Limiter(c.client);
  const app = express();
  const rules = [
    { bucket: new Bucket({ max: 1, rate: 10, name: "m-a" }), key: () => "a", maxDelayMs: 1000 },
    { bucket: new Bucket({ max: 5, rate: 10, name: "m-b" }), key: () => "a", maxDelayMs: 1000 },
    { bucket: new Quota({ limit: 3, period: "day", name: "m-day" }), key: () => "a" },
  ];
  app.get("/", rateLimit(lim, { rules }), (_q, r) => r.send("ok"));
  const s = await serve(app);
  try {
    const begun = performance.now();
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await get(`${s.url}/`)).status);
    // m-a holds 1 a tenth of a second: the second and third wait their turn.
    assert.deepEqual(statuses, [200, 200, 200]);
    assert.ok(performance.now() - begun >= 150, "the requests over m-a were delayed");
    // The day's quota of 3 is spent: a refusal, whatever the wait.
    const refused = await get(`${s.url}/`);
    assert.equal(refused.status, 429);
    assert.match(refused.headers["ratelimit-policy"], /"m-day";q=3;w=86400/);
  } finally {
    s.close();
    c.close();
  }
});

test("a Fastify rule with maxDelayMs delays too, and the handler sees the reservation", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const app = Fastify({ forceCloseConnections: true }); // Node 18: close() would wait for idle keep-alives
  const paced = new Bucket({ max: 1, rate: 10, name: "fpaced" });
  await app.register(rateLimitPlugin, {
    limiter: new Limiter(c.client),
    rules: [{ bucket: paced, key: () => "a", maxDelayMs: 1000 }],
  });
  app.get("/", async (req) => ({ delay: req.rateLimit.decisions[0].delayMs }));
  await app.listen({ port: 0, host: "127.0.0.1" });
  const url = `http://127.0.0.1:${app.server.address().port}`;
  try {
    const first = await get(`${url}/`);
    const begun = performance.now();
    const second = await get(`${url}/`);
    assert.deepEqual([first.status, second.status], [200, 200]);
    assert.equal(JSON.parse(first.body).delay, 0);
    const delay = JSON.parse(second.body).delay;
    assert.ok(delay > 0 && delay <= 100, `delay ${delay}`);
    assert.ok(performance.now() - begun >= delay - 1, "held for its delay");
    assert.equal(second.headers["retry-after"], undefined);
  } finally {
    await app.close();
    c.close();
  }
});
