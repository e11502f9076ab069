// A live reshard under load (docs/operations.md, Resharding): one slot
// moved key by key with MIGRATE while loops call consumeMany and acquire
// with a drained bucket and a full one (an absent key, so Redis answers
// TRYAGAIN until the slot has moved), through ioredis's and node-redis's
// cluster clients. No error reaches the callers, no call is answered by
// the failure policy, and the drained bucket admits no more than its
// refill plus one.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Bucket, Concurrency, Limiter } from "redis-tokenbucket";
import { clusterClient } from "./clients.mjs";
import { Cluster } from "./servers.mjs";

const TAG = "{reshard}";
const HOT = new Bucket({ max: 10, rate: 5, name: "hot" }); // drained first: 5 a second after that
const FULL = new Bucket({ max: 1e6, rate: 1e6, name: "full" }); // full again within a µs: its key is absent
const SLOTS = new Concurrency({ limit: 1000, leaseMs: 60_000, name: "slots" });

const clusters = [];
after(() => {
  for (const c of clusters) c.stop();
});

/** Moves `slot` off its owner to the next node, key by key, then assigns it there everywhere. */
async function moveSlot(cluster, slot, pauseMs) {
  const admins = cluster.nodes.map((n) => n.admin());
  try {
    const ids = await Promise.all(admins.map((a) => a.call("CLUSTER", "MYID")));
    const ranges = await admins[0].call("CLUSTER", "SLOTS");
    const range = ranges.find(([first, last]) => first <= slot && slot <= last);
    const owner = ids.indexOf(range[2][2]);
    const target = (owner + 1) % admins.length;
    const [src, dst] = [admins[owner], admins[target]];
    await dst.call("CLUSTER", "SETSLOT", String(slot), "IMPORTING", ids[owner]);
    await src.call("CLUSTER", "SETSLOT", String(slot), "MIGRATING", ids[target]);
    const port = String(cluster.nodes[target].port);
    for (;;) {
      const keys = await src.call("CLUSTER", "GETKEYSINSLOT", String(slot), "1");
      if (keys.length === 0) break;
      await src.call("MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS", ...keys);
      await sleep(pauseMs);
    }
    for (const a of admins) await a.call("CLUSTER", "SETSLOT", String(slot), "NODE", ids[target]);
  } finally {
    for (const a of admins) a.disconnect();
  }
}

for (const [lib, onError] of [
  ["ioredis", "closed"],
  ["redis", "open"],
]) {
  test(`a slot moved under load through ${lib} (onError ${onError}) is no outage and no bypass`, async () => {
    const cluster = await new Cluster("redis-7.0", { module: true }).start();
    clusters.push(cluster);
    const c = await clusterClient(lib, cluster.port);
    try {
      const lim = new Limiter(c.client, { onError, timeoutMs: 5000, breaker: false });
      const hot = `${TAG}:hot`;
      const full = `${TAG}:full`;
      assert.equal((await lim.consume(hot, HOT, HOT.max)).allowed, true); // drained
      const admin = cluster.nodes[0].admin();
      const slot = Number(await admin.call("CLUSTER", "KEYSLOT", hot));
      admin.disconnect();
      // Keys to move before the limiter's, so the slot takes a while.
      for (let i = 0; i < 40; i++) await c.client.set(`${TAG}:filler:${i}`, "x");
      const admitted = [];
      const errors = [];
      const degraded = [];
      let calls = 0;
      let stop = false;
      const load = async (kind) => {
        for (let n = 0; !stop; n++) {
          try {
            let ok;
            let d;
            if (kind === "many") {
              d = await lim.consumeMany([
                [hot, HOT, 1],
                [full, FULL, 1],
              ]);
              ok = d.allowed;
            } else {
              d = await lim.acquire(`${TAG}:lease`, SLOTS, {
                id: `${kind}-${n}`,
                buckets: [
                  [hot, HOT, 1],
                  [full, FULL, 1],
                ],
              });
              ok = d.acquired;
              if (ok) await lim.release(d);
            }
            calls++;
            if (d.degraded) degraded.push(d);
            else if (ok) admitted.push(performance.now());
          } catch (error) {
            errors.push(String(error));
          }
          await sleep(10);
        }
      };
      const started = performance.now();
      const loops = [load("many"), load("many"), load("acquire")];
      await moveSlot(cluster, slot, 30);
      await sleep(200);
      stop = true;
      await Promise.all(loops);
      const elapsed = (performance.now() - started) / 1000;
      assert.deepEqual(errors, []);
      assert.equal(degraded.length, 0, "a call was answered by the failure policy during the reshard");
      assert.ok(calls > 20, `${calls} calls`);
      // The drained bucket's refill over the run, plus one token of rounding.
      assert.ok(admitted.length <= HOT.rate * elapsed + 1, `${admitted.length} admitted in ${elapsed} s`);
      assert.ok(admitted.length >= 1);
    } finally {
      c.close();
    }
  });
}
