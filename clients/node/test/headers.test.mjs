// The IETF RateLimit and RateLimit-Policy fields and Retry-After, exactly.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import {
  Bucket,
  Concurrency,
  Decision,
  Lease,
  Limiter,
  MultiDecision,
  mergeRateLimitHeaders,
  rateLimitHeaders,
} from "redis-tokenbucket";
import { client } from "./clients.mjs";
import { stopAll, TARGETS, target } from "./servers.mjs";

after(stopAll);

const USER = new Bucket({ max: 10, rate: 0.17, name: "user" });
const IP = new Bucket({ max: 600, rate: 30, name: "ip" });

test("one bucket admitted, and denied with Retry-After rounded up", () => {
  assert.deepEqual(rateLimitHeaders(new Decision(true, 9, 0, 5883, "k", USER, 1)), {
    "RateLimit-Policy": '"user";q=10;w=59',
    RateLimit: '"user";r=9;t=6',
  });
  assert.deepEqual(rateLimitHeaders(new Decision(false, 0, 5001, 58830, "k", USER, 1)), {
    "RateLimit-Policy": '"user";q=10;w=59',
    RateLimit: '"user";r=0;t=6',
    "Retry-After": "6",
  });
});

test("several buckets in order, the legacy fields for the tightest", () => {
  const m = new MultiDecision(false, 5883, [
    new Decision(false, 0, 5883, 58830, "u", USER, 1),
    new Decision(true, 599, 0, 34, "i", IP, 1),
  ]);
  assert.deepEqual(rateLimitHeaders(m, { legacy: true }), {
    "RateLimit-Policy": '"user";q=10;w=59, "ip";q=600;w=20',
    RateLimit: '"user";r=0;t=6, "ip";r=599;t=1',
    "X-RateLimit-Limit": "10",
    "X-RateLimit-Remaining": "0",
    "Retry-After": "6",
  });
  // Admitted: the tightest is the emptiest share; debt shows as 0; unnamed is "default".
  const ok = new MultiDecision(true, 0, [
    new Decision(true, 9, 0, 5883, "u", USER, 1),
    new Decision(true, -3, 0, 100, "i", new Bucket({ max: 600, rate: 30 }), 1),
  ]);
  const h = rateLimitHeaders(ok, { legacy: true });
  assert.equal(h.RateLimit, '"user";r=9;t=6, "default";r=0;t=1');
  assert.equal(h["X-RateLimit-Limit"], "600");
});

test("a bucket whose max is below 1 states a quota of 1, as it admits costs below its max", () => {
  const half = new Bucket({ max: 0.5, rate: 0.1, name: "tiny" });
  const h = rateLimitHeaders(new MultiDecision(true, 0, [new Decision(true, 0, 0, 5000, "k", half, 0.5)]), {
    legacy: true,
  });
  assert.equal(h["RateLimit-Policy"], '"tiny";q=1;w=5');
  assert.equal(h["X-RateLimit-Limit"], "1");
});

test("a degraded or shed decision has nothing to report", () => {
  assert.deepEqual(rateLimitHeaders(new Decision(true, 0, 0, 0, "k", USER, 1, { degraded: true })), {});
  assert.deepEqual(rateLimitHeaders(new Decision(false, 0, 1000, 0, "k", USER, 1, { shed: true })), {});
});

const STREAMS = new Concurrency({ limit: 8, leaseMs: 30_000, name: "streams" });

function lease(fields) {
  const base = { retryAfterMs: 0, expiresInMs: 30_000, id: "i", key: "k", concurrency: STREAMS, weight: 1 };
  return new Lease({ decisions: [], held: "redis", ...base, ...fields });
}

test("a lease: the concurrent-requests policy first, r the slots left, t only when no slot is free", () => {
  assert.deepEqual(rateLimitHeaders(lease({ acquired: true, inUse: 2 }), { legacy: true }), {
    "RateLimit-Policy": '"streams";q=8;qu="concurrent-requests"',
    RateLimit: '"streams";r=6',
    "X-RateLimit-Limit": "8",
    "X-RateLimit-Remaining": "6",
  });
  assert.deepEqual(rateLimitHeaders(lease({ acquired: false, inUse: 8, retryAfterMs: 12_001, expiresInMs: 0 })), {
    "RateLimit-Policy": '"streams";q=8;qu="concurrent-requests"',
    RateLimit: '"streams";r=0;t=13',
    "Retry-After": "13",
  });
  // With buckets: theirs follow; a bucket's denial puts no t on the slots.
  const denied = lease({
    acquired: false,
    inUse: 2,
    retryAfterMs: 5001,
    expiresInMs: 0,
    decisions: [new Decision(false, 0, 5001, 58830, "u", USER, 1)],
  });
  assert.deepEqual(rateLimitHeaders(denied, { legacy: true }), {
    "RateLimit-Policy": '"streams";q=8;qu="concurrent-requests", "user";q=10;w=59',
    RateLimit: '"streams";r=6, "user";r=0;t=6',
    "X-RateLimit-Limit": "10",
    "X-RateLimit-Remaining": "0",
    "Retry-After": "6",
  });
  const unnamed = new Concurrency({ limit: 2, leaseMs: 1000 });
  assert.equal(rateLimitHeaders(lease({ acquired: true, inUse: 1, concurrency: unnamed })).RateLimit, '"default";r=1');
  assert.deepEqual(rateLimitHeaders(lease({ acquired: true, inUse: 0, degraded: true, held: "none" })), {});
  assert.deepEqual(rateLimitHeaders(lease({ acquired: false, inUse: 0, shed: true, retryAfterMs: 1000 })), {});
});

test("from real calls on every backend", async () => {
  for (const name of Object.keys(TARGETS)) {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    const lim = new Limiter(c.client);
    const small = new Bucket({ max: 1, rate: 0.5, name: "u" });
    assert.equal(rateLimitHeaders(await lim.consume("h", small)).RateLimit, '"u";r=0;t=2');
    const denied = rateLimitHeaders(await lim.consume("h", small));
    assert.equal(denied["Retry-After"], "2");
    const one = new Concurrency({ limit: 1, leaseMs: 4000, name: "s" });
    assert.equal(rateLimitHeaders(await lim.acquire("l", one)).RateLimit, '"s";r=0');
    const full = rateLimitHeaders(await lim.acquire("l", one));
    assert.deepEqual([full.RateLimit, full["Retry-After"]], ['"s";r=0;t=4', "4"]);
    c.close();
  }
});

test("stacked limiters: the lists joined, a policy of the same name replaced, the longer Retry-After", () => {
  const odd = new Bucket({ max: 5, rate: 1, name: 'a "b", c' });
  const first = rateLimitHeaders(new MultiDecision(true, 0, [new Decision(true, 4, 0, 1000, "k", odd, 1)]), {
    legacy: true,
  });
  const second = rateLimitHeaders(new Decision(false, 0, 5001, 58830, "k", USER, 1), { legacy: true });
  // Names in any case, as Node's getHeaders() and fetch's Headers give them.
  const current = Object.fromEntries(Object.entries(first).map(([k, v]) => [k.toLowerCase(), v]));
  assert.deepEqual(mergeRateLimitHeaders(current, second), {
    "RateLimit-Policy": '"a \\"b\\", c";q=5;w=5, "user";q=10;w=59',
    RateLimit: '"a \\"b\\", c";r=4;t=1, "user";r=0;t=6',
    "Retry-After": "6",
    "X-RateLimit-Limit": "10",
    "X-RateLimit-Remaining": "0",
  });
  // The same policy again (one limiter on two routes): its newer numbers, once.
  const again = rateLimitHeaders(new Decision(true, 3, 0, 2000, "k", odd, 1), { legacy: true });
  assert.deepEqual(mergeRateLimitHeaders({ ...current, "retry-after": "9" }, { ...again, "Retry-After": "2" }), {
    "RateLimit-Policy": '"a \\"b\\", c";q=5;w=5',
    RateLimit: '"a \\"b\\", c";r=3;t=2',
    "Retry-After": "9",
    "X-RateLimit-Limit": "5",
    "X-RateLimit-Remaining": "3",
  });
  // Nothing there yet: the fields as they are; an earlier, more restrictive legacy pair stays.
  assert.deepEqual(mergeRateLimitHeaders({}, second), second);
  const fewer = { "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0" };
  assert.deepEqual(mergeRateLimitHeaders(fewer, again)["X-RateLimit-Remaining"], undefined);
});
