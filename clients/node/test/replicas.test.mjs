// The replica wait (waitReplicas): its options checked, a Cluster refused,
// and against a real primary with one replica, through every client
// library: WAIT behind the calls that can admit and no other, the
// decision standing when the replica acknowledged it, the policy's answer
// (and the breaker's count) when too few did. The scripted cases are
// clients/spec/replica_wait.json; Sentinel failovers, sentinel.test.mjs.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import IORedis from "ioredis";
import * as nodeRedis from "redis";
import { Breaker, Bucket, Concurrency, Limiter, ReplicaWaitError } from "redis-tokenbucket";
import { client, LIBRARIES } from "./clients.mjs";
import { calls, clean, Server, SLOW } from "./servers.mjs";

const quiet = { error() {}, warn() {} };
const B = new Bucket({ max: 3, rate: SLOW });
let primary;
let replica;

before(async () => {
  primary = await new Server("redis-7.0", { module: true }).start();
  replica = await new Server("redis-7.0", { module: true, args: ["--replicaof", "127.0.0.1", String(primary.port)] });
  await replica.start();
  for (;;) {
    const admin = replica.admin();
    const info = await admin.call("INFO", "replication");
    admin.disconnect();
    if (info.includes("master_link_status:up")) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
});
after(() => {
  replica?.stop();
  primary?.stop();
});

test("waitReplicas and waitTimeoutMs are checked, each error naming its option", () => {
  const fake = { status: "ready", call: async () => null };
  for (const bad of [-1, 1.5, "1", Number.NaN, null]) {
    assert.throws(() => new Limiter(fake, { waitReplicas: bad }), { name: "RangeError", message: /waitReplicas/ });
  }
  for (const bad of [0, -5, 2.5, "50", Number.POSITIVE_INFINITY]) {
    assert.throws(() => new Limiter(fake, { waitReplicas: 1, waitTimeoutMs: bad }), {
      name: "RangeError",
      message: /waitTimeoutMs/,
    });
  }
  const lim = new Limiter(fake, { waitReplicas: 2 });
  assert.deepEqual([lim.waitReplicas, lim.waitTimeoutMs], [2, 50]);
  assert.deepEqual([new Limiter(fake).waitReplicas, new Limiter(fake).waitTimeoutMs], [0, 50]);
});

test("a Cluster client with waitReplicas > 0 is refused at construction (WAIT is per node)", async () => {
  const io = new IORedis.Cluster([{ host: "127.0.0.1", port: 1 }], { lazyConnect: true });
  const nr = nodeRedis.createCluster({ rootNodes: [{ socket: { host: "127.0.0.1", port: 1 } }] });
  try {
    for (const cluster of [io, nr]) {
      assert.throws(() => new Limiter(cluster, { waitReplicas: 1 }), { name: "TypeError", message: /Cluster/ });
      assert.equal(new Limiter(cluster, { waitReplicas: 0 }).waitReplicas, 0);
    }
  } finally {
    io.disconnect();
  }
});

for (const lib of LIBRARIES) {
  test(`${lib}: WAIT behind consume, consumeMany and acquire only; acknowledged decisions stand`, async () => {
    await clean(primary);
    const c = await client(lib, primary.port);
    try {
      const lim = new Limiter(c.client, { waitReplicas: 1, waitTimeoutMs: 1000, logger: quiet, breaker: false });
      const d = await lim.consume("rl:w", B);
      assert.deepEqual([d.allowed, d.degraded, d.remaining], [true, false, 2]);
      const m = await lim.consumeMany([
        ["rl:w", B],
        ["rl:v", B, 2],
      ]);
      assert.deepEqual([m.allowed, m.degraded], [true, false]);
      const lease = await lim.acquire("rl:s", new Concurrency({ limit: 1, leaseMs: 10_000 }));
      assert.deepEqual([lease.acquired, lease.degraded, lease.held], [true, false, "redis"]);
      assert.equal(await calls(primary, "wait"), 3);
      // The replica has every admission: it answers as the primary would.
      const admin = replica.admin();
      try {
        assert.equal(await admin.call("TB.INFLIGHT", "rl:s"), 1);
        assert.equal((await admin.call("TB.PEEK", "rl:v", "3", String(SLOW), "1"))[1], 1);
      } finally {
        admin.disconnect();
      }
      // None behind the calls that can't admit.
      await lim.peek("rl:w", B);
      await lim.adjust("rl:w", B, 1);
      await lim.inFlight("rl:s");
      assert.ok(await lim.renew(lease));
      assert.ok(await lim.release(lease));
      assert.equal(await lim.reset("rl:v"), true);
      assert.equal(await calls(primary, "wait"), 3);
    } finally {
      await c.close();
    }
  });

  test(`${lib}: too few replicas behind an admission is Redis failing; behind a denial it is not`, async () => {
    await clean(primary);
    const c = await client(lib, primary.port);
    try {
      // Two asked for, one there: every WAIT answers 1 after its 20 ms.
      const options = { waitReplicas: 2, waitTimeoutMs: 20, logger: quiet };
      const open = new Limiter(c.client, { ...options, onError: "open", breaker: false });
      const closed = new Limiter(c.client, { ...options, onError: "closed", breaker: false });
      const raise = new Limiter(c.client, { ...options, onError: "raise", breaker: false });
      const d1 = await open.consume("rl:few", B);
      assert.deepEqual([d1.allowed, d1.degraded, d1.remaining], [true, true, 0]);
      const d2 = await closed.consume("rl:few", B);
      assert.deepEqual([d2.allowed, d2.degraded], [false, true]);
      await assert.rejects(raise.consume("rl:few", B), (e) => e instanceof ReplicaWaitError && e.acked === 1);
      // Each of them charged Redis (3 of 3): the next is Redis's denial, as it is.
      const denied = await closed.consume("rl:few", B);
      assert.deepEqual([denied.allowed, denied.degraded, denied.remaining], [false, false, 0]);
      assert.ok(denied.retryAfterMs > 0);
      // An acquire that too few acknowledged: the policy's lease, and its slot given back.
      const lease = await closed.acquire("rl:slot", new Concurrency({ limit: 1, leaseMs: 10_000 }));
      assert.deepEqual([lease.acquired, lease.degraded], [false, true]);
      assert.equal(await open.inFlight("rl:slot"), 0);
      // The breaker counts the admissions, not the denials.
      const counted = new Limiter(c.client, {
        ...options,
        onError: "closed",
        breaker: new Breaker({ failures: 1, cooldownMs: 60_000 }),
      });
      await counted.consume("rl:few", B); // denied by Redis: not counted
      assert.equal(counted.breakerState, "closed");
      await counted.consume("rl:other", B); // admitted, unacknowledged: counted
      assert.equal(counted.breakerState, "open");
    } finally {
      await c.close();
    }
  });
}
