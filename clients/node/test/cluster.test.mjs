// A Redis Cluster of 3 primaries, with and without the module, through the
// cluster clients of ioredis and node-redis: routing, the library on every
// primary, consumeMany across slots (bucket by bucket, refunded on a
// denial) or in one slot (one atomic call), and strict mode; leases on
// every shard, with their buckets under a hash tag.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Bucket, Concurrency, CrossSlotError, hashTagged, LIBRARY_VERSION, Limiter } from "redis-tokenbucket";
import { clusterClient, LIBRARIES } from "./clients.mjs";
import { Cluster, calls, clean, rejected, SLOW } from "./servers.mjs";

const USER = new Bucket({ max: 3, rate: SLOW, name: "user" });
const IP = new Bucket({ max: 1, rate: SLOW, name: "ip" });

const clusters = {};
before(async () => {
  clusters.module = await new Cluster("redis-7.0", { module: true }).start();
  clusters.functions = await new Cluster("redis-7.0").start();
});
after(() => {
  for (const c of Object.values(clusters)) c.stop();
});

async function everywhere(cluster, ...commands) {
  return Promise.all(cluster.nodes.map((n) => calls(n, ...commands)));
}

for (const backend of ["module", "functions"]) {
  for (const lib of LIBRARIES) {
    test(`${backend} cluster through ${lib}: keys on every shard, one round trip each`, async () => {
      const cluster = clusters[backend];
      for (const n of cluster.nodes) await clean(n);
      const c = await clusterClient(lib, cluster.port);
      try {
        const lim = new Limiter(c.client);
        const keys = Array.from({ length: 12 }, (_, i) => `rl:user:${i}`);
        const first = [];
        for (const k of keys) first.push((await lim.consume(k, USER)).remaining);
        assert.deepEqual(first, Array(12).fill(2));
        assert.equal(lim.backend, backend);
        if (backend === "functions") {
          for (const n of cluster.nodes) {
            const admin = n.admin();
            assert.equal(await admin.call("FCALL_RO", "tb_version", "0"), LIBRARY_VERSION);
            admin.disconnect();
          }
        }
        for (const n of cluster.nodes) {
          const admin = n.admin();
          await admin.call("CONFIG", "RESETSTAT");
          admin.disconnect();
        }
        for (const k of keys) await lim.consume(k, USER);
        const command = backend === "module" ? "tb.consume" : "fcall";
        const counts = await everywhere(cluster, command);
        // One call per consume, on the key's own node: no redirections.
        assert.equal(
          counts.reduce((a, b) => a + b, 0),
          keys.length,
        );
        assert.ok(counts.every((n) => n > 0));
        // None was refused with a MOVED first.
        assert.deepEqual(await Promise.all(cluster.nodes.map((n) => rejected(n, command))), [0, 0, 0]);
      } finally {
        c.close();
      }
    });
  }

  test(`${backend} cluster: across slots charges bucket by bucket and refunds`, async () => {
    const cluster = clusters[backend];
    for (const n of cluster.nodes) await clean(n);
    for (const lib of ["ioredis", "redis6"]) {
      const c = await clusterClient(lib, cluster.port);
      const lim = new Limiter(c.client);
      const p = `${lib}:`;
      const [user, ip] = [`rl:user:${p}u1`, `rl:ip:${p}198.51.100.7`];
      const ok = await lim.consumeMany([
        [user, USER],
        [ip, IP],
      ]);
      assert.ok(ok.allowed && !ok.atomic);
      assert.deepEqual(
        ok.decisions.map((d) => d.remaining),
        [2, 0],
      );
      // The IP bucket is empty now: another user behind it is turned away,
      // and their buckets are refunded.
      const denied = await lim.consumeMany([
        [`rl:user:${p}u2`, USER],
        [ip, IP],
        [`rl:key:${p}k2`, USER],
      ]);
      assert.ok(!denied.allowed && !denied.atomic);
      assert.deepEqual(
        denied.decisions.map((d) => d.allowed),
        [true, false, true],
      );
      assert.deepEqual(
        denied.decisions.map((d) => d.remaining),
        [3, 0, 3],
      );
      assert.equal(denied.retryAfterMs, denied.decisions[1].retryAfterMs);
      assert.ok(denied.retryAfterMs > 0);
      assert.equal((await lim.peek(`rl:user:${p}u2`, USER)).remaining, 3);
      // Strict: one atomic call or an error.
      await assert.rejects(
        lim.consumeMany(
          [
            [user, USER],
            [ip, IP],
          ],
          { atomic: true },
        ),
        CrossSlotError,
      );
      // Hash-tagged keys share a slot: one atomic TB.MCONSUME / FCALL.
      const [a, b] = hashTagged(`${p}u3`, ["user", "llm"]);
      const one = await lim.consumeMany(
        [
          [a, USER],
          [b, USER, 2],
        ],
        { atomic: true },
      );
      assert.ok(one.allowed && one.atomic);
      assert.deepEqual(
        one.decisions.map((d) => d.remaining),
        [2, 1],
      );
      c.close();
    }
  });
}

const STREAMS = new Concurrency({ limit: 2, leaseMs: 60_000, name: "streams" });

for (const backend of ["module", "functions"]) {
  for (const lib of ["ioredis", "redis6"]) {
    test(`${backend} cluster through ${lib}: leases on every shard, buckets under a hash tag, cross-slot refused`, async () => {
      const cluster = clusters[backend];
      for (const n of cluster.nodes) await clean(n);
      const c = await clusterClient(lib, cluster.port);
      try {
        const lim = new Limiter(c.client);
        const keys = Array.from({ length: 9 }, (_, i) => `rl:streams:${i}`);
        // The backend found, and a connection to each node up (as in the consume test).
        for (const k of keys) await lim.release(await lim.acquire(k, STREAMS));
        for (const n of cluster.nodes) {
          const admin = n.admin();
          await admin.call("CONFIG", "RESETSTAT");
          admin.disconnect();
        }
        const leases = [];
        for (const k of keys) leases.push(await lim.acquire(k, STREAMS));
        assert.ok(leases.every((l) => l.acquired && l.inUse === 1));
        const command = backend === "module" ? "tb.acquire" : "fcall";
        const counts = await everywhere(cluster, command);
        // One call per acquire, on the lease key's own node: no redirections.
        assert.equal(
          counts.reduce((a, b) => a + b, 0),
          keys.length,
        );
        assert.ok(counts.every((n) => n > 0));
        assert.deepEqual(await Promise.all(cluster.nodes.map((n) => rejected(n, command))), [0, 0, 0]);
        for (const [i, l] of leases.entries()) {
          assert.equal(await lim.inFlight(keys[i]), 1);
          assert.ok(await lim.renew(l));
          assert.ok(await lim.release(l));
        }
        // The lease key and its buckets in one slot: one atomic call.
        const [streams, user] = hashTagged("u1", ["streams", "user"]);
        const first = await lim.acquire(streams, STREAMS, { buckets: [[user, USER, 2]] });
        assert.deepEqual([first.acquired, first.decisions[0].remaining], [true, 1]);
        const poor = await lim.acquire(streams, STREAMS, { buckets: [[user, USER, 2]] });
        assert.deepEqual([poor.acquired, poor.busy, poor.inUse], [false, false, 1]);
        assert.equal(await lim.inFlight(streams), 1);
        // Keys in two slots: CrossSlotError before anything is sent.
        const before = (await everywhere(cluster, command)).reduce((a, b) => a + b, 0);
        await assert.rejects(
          lim.acquire("rl:streams:u2", STREAMS, { buckets: [["rl:user:u2", USER]] }),
          (e) => e instanceof CrossSlotError && /hash tag/.test(e.message),
        );
        assert.equal(
          (await everywhere(cluster, command)).reduce((a, b) => a + b, 0),
          before,
        );
        assert.equal(await lim.inFlight("rl:streams:u2"), 0);
      } finally {
        c.close();
      }
    });
  }
}

test("hashTagged checks its parts", () => {
  assert.deepEqual(hashTagged("u42", ["user", "llm"]), ["rl:{u42}:user", "rl:{u42}:llm"]);
  assert.throws(() => hashTagged("", ["a"]), /tag must be non-empty/);
  assert.throws(() => hashTagged("a}", ["a"]), /tag/);
  assert.throws(() => hashTagged("a", ["a"], "x{"), /prefix/);
  assert.throws(() => hashTagged("a", []), /at least one name/);
});
