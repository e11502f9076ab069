// The denial cache: a hot denied key costs one round trip per retry window;
// anything that might pass goes to Redis; any write of this limiter to a key
// drops its entries, even one whose reply is lost, and a denial a write
// overtook is not kept; keys are one identity whatever their type. (The
// rule's timelines, without a server: clients/spec/cache.json.)

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setImmediate as tick } from "node:timers/promises";
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

/**
 * An ioredis client whose replies to `command` can be held: Redis has
 * answered (the command ran), the limiter has not read the reply yet.
 */
function gated(real) {
  const gate = { hold: undefined, reached: undefined, release: undefined };
  gate.client = {
    get status() {
      return real.status;
    },
    call: async (...args) => {
      const reply = await real.call(...args);
      if (String(args[0]).toUpperCase() === gate.hold) {
        gate.hold = undefined;
        await new Promise((release) => {
          gate.release = release;
          gate.reached();
        });
      }
      return reply;
    },
  };
  gate.held = (command) => {
    gate.hold = command;
    return new Promise((resolve) => {
      gate.reached = resolve;
    });
  };
  return gate;
}

test("a denial overtaken by a refund is not remembered", async () => {
  // Redis denies a consume; before its reply is read, a refund from this
  // limiter lands. The denial predates the refund, so the cache must not
  // keep it: the next consume goes to Redis, and passes.
  const now = 0;
  const { c } = await setup();
  const gate = gated(c.client);
  const lim = new Limiter(gate.client, { denialCache: new DenialCache(10, () => now), timeoutMs: 5000 });
  try {
    await lim.consume("rl:race", B, 2);
    const reached = gate.held("TB.CONSUME");
    const pending = lim.consume("rl:race", B);
    await reached; // denied by Redis, the reply not yet read
    await lim.adjust("rl:race", B, 2);
    gate.release();
    const denied = await pending;
    const after = await lim.consume("rl:race", B);
    assert.deepEqual([denied.allowed, after.allowed, after.cached], [false, true, false]);
  } finally {
    c.close();
  }
});

test("a write whose reply is lost drops the entries too", async () => {
  const now = 0;
  const { c } = await setup();
  // TB.ADJUST runs in Redis, and its reply is lost with the connection.
  const lost = {
    get status() {
      return c.client.status;
    },
    call: async (...args) => {
      const reply = await c.client.call(...args);
      if (String(args[0]).toUpperCase() !== "TB.ADJUST") return reply;
      await tick();
      throw Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", syscall: "read" });
    },
  };
  const lim = new Limiter(lost, { denialCache: new DenialCache(10, () => now) });
  try {
    await lim.consume("rl:lost", B, 2);
    await lim.consume("rl:lost", B);
    assert.ok((await lim.consume("rl:lost", B)).cached);
    await assert.rejects(lim.adjust("rl:lost", B, 2), { code: "ECONNRESET" }); // it did refund
    const d = await lim.consume("rl:lost", B);
    assert.ok(d.allowed && !d.cached);
  } finally {
    c.close();
  }
});

test("reset deletes the key and drops its entry", async () => {
  const { c, lim } = await setup({ denialCache: new DenialCache(10, () => 0) });
  try {
    await lim.consume("rl:reset", B, 2);
    await lim.consume("rl:reset", B);
    assert.ok((await lim.consume("rl:reset", B)).cached);
    assert.equal(await lim.reset(Buffer.from("rl:reset")), true);
    const d = await lim.consume("rl:reset", B);
    assert.ok(d.allowed && !d.cached);
    assert.equal(await lim.reset("rl:reset-none"), false);
  } finally {
    c.close();
  }
});
