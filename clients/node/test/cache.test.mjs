// The denial cache: a hot denied key costs one round trip per retry window;
// anything that might pass goes to Redis; any write of this limiter to a key
// drops its entries; keys are one identity whatever their type.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Bucket, DenialCache, Limiter } from "redis-tokenbucket";
import { client } from "./clients.mjs";
import { calls, SLOW, stopAll, target } from "./servers.mjs";

after(stopAll);

const B = new Bucket({ max: 2, rate: SLOW });

async function setup(options) {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  return { t, c, lim: new Limiter(c.client, options) };
}

test("off by default: every denial is a round trip", async () => {
  const { t, c, lim } = await setup();
  await lim.consume("k", B, 2);
  for (let i = 0; i < 5; i++) assert.ok(!(await lim.consume("k", B)).allowed);
  assert.equal(await calls(t.server, "tb.consume"), 6);
  c.close();
});

test("a hot denied key costs one round trip per retry window, counted down", async () => {
  let now = 0;
  const cache = new DenialCache(100, () => now);
  const { t, c, lim } = await setup({ denialCache: cache });
  await lim.consume("k", B, 2);
  const first = await lim.consume("k", B);
  assert.ok(!first.allowed && !first.cached);
  now = 1000;
  for (let i = 0; i < 20; i++) {
    const d = await lim.consume("k", B);
    assert.ok(!d.allowed && d.cached);
    assert.equal(d.retryAfterMs, first.retryAfterMs - 1000);
  }
  // The same key as a Buffer is the same bucket.
  assert.ok((await lim.consume(Buffer.from("k"), B)).cached);
  // A costlier request is denied too; a cheaper one, another size or a peek of 0 may pass: Redis.
  assert.ok((await lim.consume("k", B, 2)).cached);
  assert.ok(!(await lim.consume("k", B, 0.5)).cached);
  assert.ok(!(await lim.consume("k", new Bucket({ max: 3, rate: SLOW }))).cached);
  assert.equal(await calls(t.server, "tb.consume"), 4);
  assert.equal(cache.hits, 22);
  // Past the retry time, Redis again.
  now = first.retryAfterMs + 1;
  await lim.consume("k", B);
  assert.equal(await calls(t.server, "tb.consume"), 5);
  c.close();
});

test("any write of this limiter to a key drops its entries", async () => {
  const cache = new DenialCache(100);
  const { t, c, lim } = await setup({ denialCache: cache });
  const ip = new Bucket({ max: 1, rate: SLOW });
  await lim.consume("u", B, 2);
  assert.ok(!(await lim.consume("u", B)).allowed); // cached now
  await lim.adjust("u", B, 1); // a refund
  const d = await lim.consume("u", B);
  assert.ok(d.allowed && !d.cached);
  // A consumeMany denied by one key is cached for the whole request...
  await lim.consume("ip", ip);
  const m = await lim.consumeMany([
    ["v", B],
    ["ip", ip],
  ]);
  assert.ok(!m.allowed && !m.cached);
  assert.ok(
    (
      await lim.consumeMany([
        ["v", B],
        ["ip", ip],
      ])
    ).cached,
  );
  // ...until a write to any of its keys: here a charge of v.
  await lim.consume("v", B);
  const again = await lim.consumeMany([
    ["v", B],
    ["ip", ip],
  ]);
  assert.ok(!again.cached);
  assert.equal(await calls(t.server, "tb.consume", "tb.mconsume", "tb.adjust"), 8);
  c.close();
});

test("the cache is bounded, least recently used first", async () => {
  const cache = new DenialCache(3);
  const { c, lim } = await setup({ denialCache: cache });
  for (const k of ["a", "b", "c", "d"]) {
    await lim.consume(k, B, 2);
    await lim.consume(k, B);
  }
  assert.equal(cache.size, 3);
  assert.ok(!(await lim.consume("a", B)).cached);
  assert.ok((await lim.consume("d", B)).cached);
  assert.throws(() => new DenialCache(0), /maxEntries/);
  c.close();
});
