// Concurrency leases (acquire, renew, release, inFlight, hold, keep) on
// real servers: the module's checks and texts, every backend and client
// library, exact admission under 50 concurrent clients, expiry, renewals
// in the background, release on every exit, a holder killed with SIGKILL,
// the failure policy, shedding, events and the denial cache.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  Breaker,
  Bucket,
  Busy,
  CircuitOpenError,
  Concurrency,
  DenialCache,
  InvalidArgument,
  Lease,
  LIBRARY_VERSION,
  Limiter,
  Shed,
} from "redis-tokenbucket";
import { client, LIBRARIES } from "./clients.mjs";
import { calls, Server, SLOW, stopAll, TARGETS, target } from "./servers.mjs";

after(stopAll);

const quiet = { error() {}, warn() {} };
const EACH = ["redis-7.0+module", "redis-7.0", "redis-6.2"]; // module, Functions, EVAL
const STREAMS = new Concurrency({ limit: 2, leaseMs: 60_000, name: "streams" });
const USER = new Bucket({ max: 10, rate: SLOW, name: "user" });

/** The rejection of `promise`, or undefined if it resolves. */
async function failure(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  return undefined;
}

/** Polls `check` every 10 ms until it is truthy; fails after `ms`. */
async function until(check, ms, what) {
  const deadline = performance.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (performance.now() > deadline) assert.fail(`${what}: not within ${ms} ms`);
    await sleep(10);
  }
}

function logs() {
  const lines = [];
  return { lines, logger: { error: (m) => lines.push(m), warn: (m) => lines.push(m) } };
}

// [what the caller writes, the same as a raw TB.ACQUIRE, field, message]
// biome-ignore format: a table, one case a line
const BAD = [
  [() => new Concurrency({ limit: 0, leaseMs: 1000 }), ["k", "0", "1000", "i"], "limit", "limit must be >= 1 and <= 1000000"],
  [() => new Concurrency({ limit: 1_000_001, leaseMs: 1000 }), ["k", "1000001", "1000", "i"], "limit", "limit must be >= 1 and <= 1000000"],
  [() => new Concurrency({ limit: 1.5, leaseMs: 1000 }), ["k", "1.5", "1000", "i"], "limit", "limit must be an integer"],
  [() => new Concurrency({ limit: "8", leaseMs: 1000 }), undefined, "limit", "limit must be an integer"],
  [() => new Concurrency({ limit: 8, leaseMs: 0 }), ["k", "8", "0", "i"], "lease_ms", "lease_ms must be >= 1 and <= 86400000"],
  [() => new Concurrency({ limit: 8, leaseMs: 86_400_001 }), ["k", "8", "86400001", "i"], "lease_ms", "lease_ms must be >= 1 and <= 86400000"],
  [() => new Concurrency({ limit: 8, leaseMs: Number.NaN }), ["k", "8", "nan", "i"], "lease_ms", "lease_ms must be an integer"],
  [(lim) => lim.acquire("k", STREAMS, { weight: 0 }), ["k", "2", "60000", "i", "0"], "weight", "weight must be >= 1"],
  [(lim) => lim.acquire("k", STREAMS, { weight: 3 }), ["k", "2", "60000", "i", "3"], "weight", "weight must not exceed limit, it could never fit"],
  [(lim) => lim.acquire("k", STREAMS, { weight: 1.5 }), ["k", "2", "60000", "i", "1.5"], "weight", "weight must be an integer"],
  [(lim) => lim.acquire("k", STREAMS, { id: "" }), ["k", "2", "60000", ""], "id", "id must be 1 to 256 bytes"],
  [(lim) => lim.acquire("k", STREAMS, { id: "é".repeat(129) }), ["k", "2", "60000", "é".repeat(129)], "id", "id must be 1 to 256 bytes"],
  [(lim) => lim.acquire("k", STREAMS, { buckets: [["k", USER, 1]] }), ["k", "2", "60000", "i", "BUCKET", "k", "10", String(SLOW), "1"], "buckets", "the key of group 1 is the lease key"],
  [(lim) => lim.acquire("k", STREAMS, { buckets: [["b", USER], ["b", USER]] }), ["k", "2", "60000", "i", "BUCKET", "b", "10", String(SLOW), "1", "BUCKET", "b", "10", String(SLOW), "1"], "key", "duplicate key: group 2 repeats the key of group 1"],
  [(lim) => lim.acquire("k", STREAMS, { buckets: [["b", USER, 11]] }), ["k", "2", "60000", "i", "BUCKET", "b", "10", String(SLOW), "11"], "cost", "cost must not exceed max, it could never pass (group 1)"],
];

test("Concurrency, weights, ids and buckets are refused with the module's texts, before anything is sent", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const lim = new Limiter(c.client);
    for (const [make, raw, field, text] of BAD) {
      const error = await failure((async () => make(lim))());
      assert.ok(error instanceof InvalidArgument, `${text}: ${error}`);
      assert.deepEqual([error.field, error.message], [field, text]);
      if (raw === undefined) continue; // no text form: the module only sees strings
      const reply = await failure(c.client.call("TB.ACQUIRE", ...raw));
      assert.equal(reply?.message, `ERR ${text}`, `the module on ${raw.join(" ")}`);
    }
    // Only the raw commands above reached the server, and none wrote.
    assert.equal(await calls(t.server, "tb.acquire"), BAD.filter((b) => b[1]).length);
    assert.equal(await c.client.dbsize(), 0);
    // The largest id and the bounds themselves pass.
    assert.ok(
      (await lim.acquire("k", new Concurrency({ limit: 1_000_000, leaseMs: 86_400_000 }), { id: "é".repeat(128) }))
        .acquired,
    );
    assert.ok((await lim.acquire("k2", STREAMS, { id: Buffer.alloc(256, 0xff), weight: 2 })).acquired);
    await assert.rejects(lim.acquire("k2", STREAMS, { id: Buffer.alloc(257) }), /id must be 1 to 256 bytes/);
    await assert.rejects(lim.acquire("k", {}), /expected a Concurrency/);
    await assert.rejects(lim.renew({}), /expected a Lease/);
    await assert.rejects(lim.hold("k", STREAMS, "work"), /as a function of the lease/);
    assert.throws(() => new Concurrency({ limit: 1, leaseMs: 1, name: "" }), /name must be a non-empty string/);
    assert.equal(STREAMS.named("x").name, "x");
  } finally {
    c.close();
  }
});

for (const name of Object.keys(TARGETS)) {
  const lib = LIBRARIES[Object.keys(TARGETS).indexOf(name) % LIBRARIES.length];
  test(`${name} through ${lib}: acquire, renew, release and inFlight answer as the module does`, async () => {
    const t = await target(name);
    const c = await client(lib, t.port, t.auth);
    try {
      const lim = new Limiter(c.client);
      const a = await lim.acquire("rl:s", STREAMS);
      assert.ok(a instanceof Lease);
      assert.deepEqual([a.acquired, a.inUse, a.retryAfterMs, a.remaining, a.held], [true, 1, 0, 0 + 1, "redis"]);
      assert.ok(a.expiresInMs > 59_000 && a.expiresInMs <= 60_000, `${a.expiresInMs}`);
      assert.match(a.id, /^[0-9a-f-]{36}$/);
      assert.equal(lim.backend, t.backend);
      // A retry with the same id renews it and never counts it twice.
      const again = await lim.acquire("rl:s", STREAMS, { id: a.id });
      assert.deepEqual([again.acquired, again.inUse], [true, 1]);
      const b = await lim.acquire("rl:s", STREAMS, { id: Buffer.from([0, 0xff, 1]) });
      assert.deepEqual([b.acquired, b.inUse], [true, 2]);
      // Full: denied with the wait until a lease ends; a denial charges no bucket.
      const full = await lim.acquire("rl:s", STREAMS, { buckets: [["rl:u", USER, 3]] });
      assert.deepEqual(
        [full.acquired, full.busy, full.inUse, full.remaining, full.expiresInMs],
        [false, true, 2, 0, 0],
      );
      assert.ok(full.retryAfterMs > 59_000 && full.retryAfterMs <= 60_000, `${full.retryAfterMs}`);
      assert.deepEqual(
        full.decisions.map((d) => [d.allowed, d.remaining]),
        [[true, 10]],
      );
      assert.equal((await lim.peek("rl:u", USER)).remaining, 10);
      // A bucket that can't pay takes no slot.
      const other = new Concurrency({ limit: 5, leaseMs: 60_000 });
      const paid = await lim.acquire("rl:t", other, { buckets: [["rl:u", USER, 8]] });
      assert.deepEqual([paid.acquired, paid.decisions[0].remaining], [true, 2]);
      const poor = await lim.acquire("rl:t", other, { buckets: [["rl:u", USER, 3]], weight: 2 });
      assert.deepEqual([poor.acquired, poor.busy, poor.inUse], [false, false, 1]);
      assert.deepEqual(
        poor.deniedBy.map((d) => d.key),
        ["rl:u"],
      );
      assert.ok(poor.retryAfterMs > 0);
      assert.equal(await lim.inFlight("rl:t"), 1);
      // Renew, release (twice), renew after release.
      assert.equal(await lim.renew(a), true);
      assert.ok(a.expiresInMs > 59_000 && !a.lost);
      assert.equal(await lim.release(a), true);
      assert.equal(await lim.release(a), false);
      assert.equal(await lim.inFlight("rl:s"), 1);
      assert.equal(await lim.renew(a), false);
      assert.equal(a.lost, true);
      assert.equal(await lim.release(b), true);
      assert.equal(await c.client.exists("rl:s"), 0);
      assert.equal(await lim.inFlight("rl:missing"), 0);
      // A denied lease has nothing to renew or release.
      assert.equal(await lim.release(full), false);
      assert.equal(await lim.renew(full), false);
      // A key of another kind is a usage error.
      await assert.rejects(lim.acquire("rl:u", STREAMS), /key is not a lease key/);
      await assert.rejects(lim.inFlight("rl:u"), /key is not a lease key/);
    } finally {
      c.close();
    }
  });
}

test("a foreign library without the lease functions is replaced before the first acquire, and loaded again after a flush", async () => {
  const t = await target("redis-7.0");
  const admin = t.server.admin();
  const c = await client("ioredis", t.port);
  try {
    await admin.call(
      "FUNCTION",
      "LOAD",
      "#!lua name=tb\nredis.register_function{function_name='tb_version', callback=function() return 'foreign' end, flags={'no-writes'}}",
    );
    const { lines, logger } = logs();
    const lim = new Limiter(c.client, { logger });
    const lease = await lim.acquire("rl:lib", STREAMS);
    assert.deepEqual([lease.acquired, lim.backend], [true, "functions"]);
    assert.equal(await admin.call("FCALL_RO", "tb_version", "0"), LIBRARY_VERSION);
    assert.match(lines.join("\n"), /the server's Lua library is foreign/);
    await admin.call("FUNCTION", "FLUSH");
    assert.equal(await lim.renew(lease), true);
    assert.equal(await lim.release(lease), true);
  } finally {
    admin.disconnect();
    c.close();
  }
});

for (const name of EACH) {
  test(`${name}: exactly limit of 50 concurrent clients get a slot`, async () => {
    const t = await target(name);
    const clients = await Promise.all(Array.from({ length: 50 }, () => client("ioredis", t.port, t.auth)));
    try {
      const limit = new Concurrency({ limit: 7, leaseMs: 60_000, name: "streams" });
      const leases = await Promise.all(clients.map((c) => new Limiter(c.client).acquire("rl:fifty", limit)));
      assert.equal(leases.filter((l) => l.acquired).length, 7);
      assert.ok(leases.every((l) => l.acquired || (l.inUse === 7 && l.busy)));
      const lim = new Limiter(clients[0].client);
      assert.equal(await lim.inFlight("rl:fifty"), 7);
      await Promise.all(leases.filter((l) => l.acquired).map((l) => lim.release(l)));
      assert.equal(await lim.inFlight("rl:fifty"), 0);
      // hold, 50 at once: 7 run together, the others are Busy.
      let running = 0;
      let most = 0;
      const results = await Promise.allSettled(
        clients.map((c) =>
          new Limiter(c.client).hold("rl:fifty", limit, async () => {
            running++;
            most = Math.max(most, running);
            await sleep(100);
            running--;
          }),
        ),
      );
      assert.equal(results.filter((r) => r.status === "fulfilled").length, 7);
      assert.ok(results.every((r) => r.status === "fulfilled" || r.reason instanceof Busy));
      assert.equal(most, 7);
      assert.equal(await lim.inFlight("rl:fifty"), 0);
    } finally {
      for (const c of clients) c.close();
    }
  });

  test(`${name}: an expired lease frees its slot, is never renewed, and releasing it is a no-op`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client);
      const one = new Concurrency({ limit: 1, leaseMs: 300 });
      const a = await lim.acquire("rl:exp", one);
      assert.ok(a.acquired);
      const denied = await lim.acquire("rl:exp", one);
      assert.ok(!denied.acquired && denied.retryAfterMs > 0 && denied.retryAfterMs <= 300, `${denied.retryAfterMs}`);
      await sleep(denied.retryAfterMs);
      const next = await lim.acquire("rl:exp", one);
      assert.ok(next.acquired, "the slot is free once the retry time has passed");
      assert.equal(await lim.renew(a), false);
      assert.ok(a.lost);
      assert.equal(await lim.release(a), false);
      assert.equal(await lim.inFlight("rl:exp"), 1);
      assert.equal(await lim.release(next), true);
      assert.equal(await lim.release(next), false);
      assert.equal(await c.client.exists("rl:exp"), 0);
    } finally {
      c.close();
    }
  });

  test(`${name}: hold renews in the background, releases on return and on a throw, and is Busy when full`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    try {
      const lim = new Limiter(c.client);
      const one = new Concurrency({ limit: 1, leaseMs: 300, name: "streams" });
      const result = await lim.hold("rl:hold", one, async (lease) => {
        assert.ok(lease.acquired);
        await sleep(1000); // more than three leases: only renewals keep it
        assert.equal(await lim.inFlight("rl:hold"), 1);
        assert.ok(!(await lim.acquire("rl:hold", one)).acquired);
        assert.ok(!lease.lost);
        return 42;
      });
      assert.equal(result, 42);
      assert.equal(await lim.inFlight("rl:hold"), 0);
      assert.equal(await c.client.exists("rl:hold"), 0);
      await assert.rejects(
        lim.hold("rl:hold", one, async () => {
          assert.equal(await lim.inFlight("rl:hold"), 1);
          throw new Error("boom");
        }),
        /boom/,
      );
      assert.equal(await lim.inFlight("rl:hold"), 0);
      // A synchronous throw too.
      await assert.rejects(
        lim.hold("rl:hold", one, () => {
          throw new TypeError("sync");
        }),
        /sync/,
      );
      assert.equal(await lim.inFlight("rl:hold"), 0);
      // Full: Busy with the denied lease; the work never runs.
      const taken = await lim.acquire("rl:hold", one);
      let ran = false;
      const busy = await failure(
        lim.hold("rl:hold", one, () => {
          ran = true;
        }),
      );
      assert.ok(busy instanceof Busy, String(busy));
      assert.deepEqual([busy.lease.acquired, busy.lease.inUse, busy.lease.busy, ran], [false, 1, true, false]);
      assert.match(busy.message, /1 of 1 slots in use; retry in \d+ ms/);
      // keep(): what hold does for a lease acquire returned.
      assert.equal(await lim.keep(taken, async () => lim.inFlight("rl:hold")), 1);
      assert.equal(await lim.inFlight("rl:hold"), 0);
      await assert.rejects(
        lim.keep(busy.lease, () => 1),
        Busy,
      );
    } finally {
      c.close();
    }
  });
}

test("a renewal that finds the lease gone sets lost, logs it, and takes nothing back", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const { lines, logger } = logs();
    const lim = new Limiter(c.client, { logger });
    const one = new Concurrency({ limit: 1, leaseMs: 300 });
    await lim.hold("rl:gone", one, async (lease) => {
      await c.client.del("rl:gone");
      await until(() => lease.lost, 1000, "lost");
      await sleep(250); // no renewal after the loss
    });
    assert.equal(await c.client.exists("rl:gone"), 0, "never recreated");
    assert.equal(lines.length, 1);
    assert.match(lines[0], /lease "[0-9a-f-]+" on "rl:gone" is lost: a renewal found it expired or released/);
  } finally {
    c.close();
  }
});

test("a renewal Redis could not take is logged and tried again; the lease is not lost", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  try {
    const { lines, logger } = logs();
    const lim = new Limiter(c.client, { logger, timeoutMs: 100, breaker: false });
    const one = new Concurrency({ limit: 1, leaseMs: 900 });
    await lim.hold("rl:frozen", one, async (lease) => {
      server.pause(); // the renewal at 300 ms gets no answer within 100 ms
      await until(() => lines.length > 0, 2000, "a failed renewal logged");
      server.resume();
      const expiry = Number((await c.client.hvals("rl:frozen"))[0].split(":")[0]);
      await until(
        async () => Number((await c.client.hvals("rl:frozen"))[0].split(":")[0]) > expiry,
        2000,
        "renewed again",
      );
      assert.ok(!lease.lost);
    });
    assert.match(lines[0], /a renewal failed \(RedisTimeoutError: no reply from Redis within 100 ms/);
    assert.equal(await c.client.exists("rl:frozen"), 0);
  } finally {
    server.resume();
    c.close();
    server.stop();
  }
});

test("a release Redis can't take is logged and left to expiry; the work's own error goes up", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  try {
    const { lines, logger } = logs();
    const lim = new Limiter(c.client, { logger, timeoutMs: 100 });
    const error = await failure(
      lim.hold("rl:dead", new Concurrency({ limit: 1, leaseMs: 5000 }), async () => {
        await server.stopAndWait();
        throw new Error("the work failed");
      }),
    );
    assert.equal(error?.message, "the work failed");
    assert.equal(lines.length, 1);
    assert.match(lines[0], /could not be released \(.+\); it is left to expire, within 5000 ms/);
    // And with no error of its own, hold answers what the work returned.
    assert.equal(await lim.keep(new Lease({ ...leaseFields(), held: "none" }), () => "ok"), "ok");
  } finally {
    c.close();
    server.stop();
  }
});

function leaseFields() {
  return {
    acquired: true,
    inUse: 0,
    retryAfterMs: 0,
    expiresInMs: 0,
    id: "x",
    key: "k",
    concurrency: STREAMS,
    weight: 1,
    decisions: [],
  };
}

/** A child process holding a lease through the installed package, until killed. */
function holder(port, auth, key, leaseMs) {
  const code = `
import Redis from "ioredis";
import { Concurrency, Limiter } from "redis-tokenbucket";
const [port, auth, key, leaseMs] = [Number(process.argv[1]), JSON.parse(process.argv[2]), process.argv[3], Number(process.argv[4])];
const redis = new Redis({ port, ...auth });
const lim = new Limiter(redis);
setInterval(() => {}, 60_000);
await lim.hold(key, new Concurrency({ limit: 1, leaseMs }), async () => {
  console.log("held");
  await new Promise(() => {});
});
`;
  const proc = spawn(
    process.execPath,
    ["--input-type=module", "-e", code, String(port), JSON.stringify(auth), key, String(leaseMs)],
    {
      cwd: import.meta.dirname,
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const lines = createInterface({ input: proc.stdout })[Symbol.asyncIterator]();
  return { proc, held: () => lines.next() };
}

for (const name of EACH) {
  test(`${name}: a holder killed with SIGKILL frees its slot within leaseMs plus a second`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    const leaseMs = 1000;
    const h = holder(t.port, t.auth, "rl:killed", leaseMs);
    try {
      assert.equal((await h.held()).value, "held");
      const lim = new Limiter(c.client);
      await sleep(1500); // alive, it renews: the slot outlives leaseMs
      assert.equal(await lim.inFlight("rl:killed"), 1);
      const gone = new Promise((resolve) => h.proc.once("exit", resolve));
      h.proc.kill("SIGKILL");
      await gone;
      const killed = performance.now();
      await until(async () => (await lim.inFlight("rl:killed")) === 0, leaseMs + 1000, "the slot freed");
      assert.ok(performance.now() - killed <= leaseMs + 1000);
      assert.ok((await lim.acquire("rl:killed", new Concurrency({ limit: 1, leaseMs }))).acquired);
    } finally {
      h.proc.kill("SIGKILL");
      c.close();
    }
  });
}

test("Redis failing: open admits a lease held nowhere, closed denies, local is a share per process, raise throws", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  try {
    const events = [];
    const make = (onError) =>
      new Limiter(c.client, {
        onError,
        processes: 2,
        logger: quiet,
        breaker: false,
        onDecision: (e) => events.push(e),
      });
    const lims = { raise: make("raise"), open: make("open"), closed: make("closed"), local: make("local") };
    for (const [p, lim] of Object.entries(lims)) assert.ok((await lim.acquire(`rl:warm:${p}`, STREAMS)).acquired);
    const held = await lims.raise.acquire("rl:f", STREAMS);
    await server.stopAndWait();
    events.length = 0;
    // raise: thrown; and a lease held in Redis can't be renewed or released.
    const raised = await failure(lims.raise.acquire("rl:f", STREAMS));
    assert.ok(raised instanceof Error && !(raised instanceof InvalidArgument));
    await assert.rejects(lims.raise.renew(held));
    await assert.rejects(lims.raise.release(held));
    await assert.rejects(lims.raise.inFlight("rl:f"));
    // open: acquired, degraded, no slot anywhere; renewing keeps it, releasing ends it.
    const open = await lims.open.acquire("rl:f", STREAMS, { buckets: [["rl:fu", USER]] });
    assert.deepEqual([open.acquired, open.degraded, open.held, open.inUse], [true, true, "none", 0]);
    assert.deepEqual(
      open.decisions.map((d) => [d.allowed, d.degraded]),
      [[true, true]],
    );
    assert.equal(await lims.open.renew(open), true);
    assert.equal(await lims.open.release(open), true);
    assert.equal(await lims.open.release(open), false);
    assert.equal(await lims.open.renew(open), false);
    assert.ok(open.lost);
    // closed: denied, degraded; hold is Busy.
    const closed = await lims.closed.acquire("rl:f", STREAMS);
    assert.deepEqual([closed.acquired, closed.degraded, closed.shed, closed.busy], [false, true, false, false]);
    const busy = await failure(lims.closed.hold("rl:f", STREAMS, () => 1));
    assert.ok(busy instanceof Busy && busy.lease.degraded);
    assert.match(busy.message, /Redis failed and the policy denies/);
    // local: a semaphore of limit / processes (4 / 2 = 2) in this process.
    const four = new Concurrency({ limit: 4, leaseMs: 60_000, name: "streams" });
    const local = [];
    for (let i = 0; i < 3; i++) local.push(await lims.local.acquire("rl:f", four));
    assert.deepEqual(
      local.map((l) => [l.acquired, l.degraded, l.held]),
      [
        [true, true, "local"],
        [true, true, "local"],
        [false, true, "none"],
      ],
    );
    assert.deepEqual([local[1].inUse, local[2].busy, local[2].retryAfterMs > 0], [2, true, true]);
    assert.deepEqual([local[0].concurrency.limit, local[0].concurrency.name, local[2].remaining], [2, "streams", 0]);
    const localBusy = await failure(lims.local.hold("rl:f", four, () => 1));
    assert.match(localBusy.message, /2 of 2 slots in use in this process while Redis fails; retry in \d+ ms/);
    assert.equal(await lims.local.renew(local[0]), true);
    assert.equal(await lims.local.release(local[0]), true);
    assert.equal(await lims.local.release(local[0]), false);
    assert.ok((await lims.local.acquire("rl:f", four)).acquired);
    // A weight above the share can't fit here; a limit of 1 still gives 1.
    assert.ok(!(await lims.local.acquire("rl:g", four, { weight: 3 })).acquired);
    assert.ok((await lims.local.acquire("rl:h", new Concurrency({ limit: 1, leaseMs: 1000 }))).acquired);
    // Its buckets are shares too: 10 / 2 = 5 tokens.
    assert.ok((await lims.local.acquire("rl:i", four, { buckets: [["rl:iu", USER, 5]] })).acquired);
    assert.ok(!(await lims.local.acquire("rl:i", four, { buckets: [["rl:iu", USER, 1]] })).acquired);
    // Past 8 leases the library keeps a summary and reads its list field
    // (HGET) for a denial's wait: the local fallback runs it too.
    const many = new Concurrency({ limit: 24, leaseMs: 60_000, name: "streams" });
    const big = [];
    const start = Date.now();
    for (let i = 0; i < 13; i++) big.push(await lims.local.acquire("rl:big", many));
    const took = Date.now() - start;
    assert.deepEqual(
      big.map((l) => l.acquired),
      [...Array(12).fill(true), false],
    );
    // The earliest of them ends a minute after it was taken: the wait says so.
    const wait = big[12].retryAfterMs;
    assert.ok(big[12].busy && wait >= 60_000 - took - 1 && wait <= 60_000, `${wait} after ${took} ms`);
    assert.equal(await lims.local.release(big[0]), true);
    assert.ok((await lims.local.acquire("rl:big", many)).acquired);
    // Events: one per acquire (renewals and releases decide nothing).
    const seen = events.map((e) => [e.op, e.policy, e.allowed, e.degraded, e.backend]);
    assert.deepEqual(seen.slice(0, 3), [
      ["acquire", "streams,user", true, true, ""],
      ["acquire", "streams", false, true, ""],
      ["acquire", "streams", false, true, ""],
    ]);
    assert.deepEqual(seen[3], ["acquire", "streams", true, true, "local"]);
    assert.ok(seen.every((e) => e[0] === "acquire"));
  } finally {
    c.close();
    server.stop();
  }
});

test("the breaker open: a stream ends, and its slot is free at once", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const breaker = new Breaker({ failures: 1, cooldownMs: 60_000 });
    const lim = new Limiter(c.client, { onError: "closed", breaker, logger: quiet });
    const one = new Concurrency({ limit: 1, leaseMs: 60_000 });
    const done = await lim.hold("rl:bo", one, async (lease) => {
      assert.equal(Number(await c.client.call("TB.INFLIGHT", "rl:bo")), 1);
      breaker.failure(false); // Redis failed a call elsewhere: the breaker opens
      assert.equal(lim.breakerState, "open");
      assert.equal(await lim.renew(lease), true, "a renewal goes out too");
      return "streamed";
    });
    assert.equal(done, "streamed");
    assert.equal(Number(await c.client.call("TB.INFLIGHT", "rl:bo")), 0, "released at once, not at expiry");
    assert.equal(lim.breakerState, "open", "releases never count for the breaker");
    assert.equal(lim.leasesHeld, 0);
    // Decisions still get the policy at once.
    assert.ok((await lim.acquire("rl:bo", one)).degraded);
  } finally {
    c.close();
  }
});

test("Redis stopped, the breaker open: renewals and releases are tried and fail; nothing more counts", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const c = await client("ioredis", server.port);
  try {
    const breaker = new Breaker({ failures: 1, cooldownMs: 60_000 });
    const lim = new Limiter(c.client, { onError: "open", breaker, logger: quiet, timeoutMs: 100 });
    const held = await lim.acquire("rl:b", STREAMS);
    await server.stopAndWait();
    assert.ok((await lim.acquire("rl:b", STREAMS)).degraded);
    assert.equal(lim.breakerState, "open");
    assert.ok((await lim.acquire("rl:b", STREAMS)).degraded);
    const notTheBreaker = (e) => e instanceof Error && !(e instanceof CircuitOpenError);
    await assert.rejects(lim.renew(held), notTheBreaker);
    await assert.rejects(lim.release(held), notTheBreaker);
    // Given up whatever the answer (left to expire in Redis); the two leases
    // onError "open" admitted are still held.
    assert.equal(lim.leasesHeld, 2);
    // hold keeps its work going, and logs the release it could not make.
    const { lines, logger } = logs();
    const logged = new Limiter(c.client, { onError: "open", breaker: new Breaker({ failures: 1 }), logger });
    assert.equal(await logged.keep(held, () => "done"), "done");
    assert.match(lines.at(-1), /could not be released/);
  } finally {
    c.close();
    server.stop();
  }
});

test("an acquire whose reply is lost leaves no slot held once its release has run", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    // TB.ACQUIRE runs in Redis, and its reply comes after the budget.
    const landed = [];
    const slow = {
      get status() {
        return c.client.status;
      },
      call: async (...args) => {
        const reply = await c.client.call(...args);
        if (String(args[0]).toUpperCase() === "TB.ACQUIRE") {
          landed.push(reply);
          await sleep(300);
        }
        return reply;
      },
    };
    const one = new Concurrency({ limit: 1, leaseMs: 60_000 });
    // The backend given: while it is unknown, a call's budget is at least a second.
    const lim = new Limiter(slow, {
      backend: "module",
      onError: "closed",
      timeoutMs: 50,
      breaker: false,
      logger: quiet,
    });
    for (const id of ["lost-1", undefined]) {
      const lease = await lim.acquire("rl:lost", one, { id });
      assert.deepEqual([lease.acquired, lease.degraded, lease.held], [false, true, "none"]);
      assert.equal(landed.at(-1)[0], 1, "it took the slot in Redis");
      assert.equal(Number(await c.client.call("TB.INFLIGHT", "rl:lost")), 0, "and its release gave it back");
      assert.equal(lim.leasesHeld, 0);
    }
    assert.ok((await new Limiter(c.client).acquire("rl:lost", one)).acquired, "the slot is free");
  } finally {
    c.close();
  }
});

test("a busy process sheds an acquire (never admitted) and throws Shed for an inFlight", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  try {
    server.pause(); // accepts connections, answers nothing
    const c = await client("ioredis", server.port, {}, { lazyConnect: true });
    const events = [];
    const lim = new Limiter(c.client, {
      onError: "open",
      backend: "module",
      timeoutMs: 50,
      onDecision: (e) => events.push(e),
    });
    const busyFor = (ms) => {
      const end = performance.now() + ms;
      while (performance.now() < end) {}
    };
    const pending = lim.acquire("rl:shed", STREAMS, { buckets: [["rl:shedu", USER]] });
    busyFor(200);
    const lease = await pending;
    assert.deepEqual([lease.acquired, lease.shed, lease.degraded, lease.retryAfterMs], [false, true, false, 1000]);
    assert.ok(lease.decisions[0].shed);
    const inflight = lim.inFlight("rl:shed");
    busyFor(200);
    await assert.rejects(inflight, Shed);
    assert.equal(lim.breakerState, "closed");
    assert.deepEqual(
      events.map((e) => [e.op, e.shed, e.allowed]),
      [["acquire", true, false]],
    );
    c.close();
  } finally {
    server.resume();
    server.stop();
  }
});

test("an event for each acquire answered by Redis, none for its upkeep; an acquire that charges a bucket forgets its cached denials", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const events = [];
    const cache = new DenialCache(10);
    const lim = new Limiter(c.client, { onDecision: (e) => events.push(e), denialCache: cache });
    await lim.consume("rl:cu", USER, 8);
    assert.ok(!(await lim.consume("rl:cu", USER, 5)).allowed);
    assert.equal(cache.size, 1);
    const lease = await lim.acquire("rl:cs", STREAMS, { buckets: [["rl:cu", USER, 1]] });
    assert.ok(lease.acquired);
    assert.equal(cache.size, 0);
    // A denied acquire is never cached: a release can free a slot at any time.
    await lim.acquire("rl:cs", STREAMS, { weight: 2 });
    assert.equal(cache.size, 0);
    await lim.renew(lease);
    await lim.release(lease);
    await lim.inFlight("rl:cs");
    assert.deepEqual(
      events.slice(2).map((e) => [e.op, e.policy, e.allowed, e.degraded, e.shed, e.cached, e.backend]),
      [
        ["acquire", "streams,user", true, false, false, false, "module"],
        ["acquire", "streams", false, false, false, false, "module"],
      ],
    );
  } finally {
    c.close();
  }
});
