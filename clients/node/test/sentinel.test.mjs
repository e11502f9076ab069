// Sentinel failovers: one primary, one replica, three sentinels, each on
// its own loopback address (servers.mjs SentinelGroup), with the module
// and with the Lua library only. Two gateways (two ioredis clients with
// the `sentinels` option, a limiter each) make decisions on saturated
// buckets; the primary is SIGKILLed and Sentinel promotes the replica.
// Everything asserted is a count, never a time: the tokens admitted over
// the whole run against the exact budget, and which answers were degraded.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import Redis from "ioredis";
import { Bucket, Limiter } from "redis-tokenbucket";
import { createSentinel } from "redis6";
import { SentinelGroup, SLOW } from "./servers.mjs";

const groups = new Set();
after(() => {
  for (const g of groups) g.stop();
});

const quiet = { error() {}, warn() {} };
// The budgets (timeoutMs 1000, waitTimeoutMs 500) are wide: on a loaded
// machine a slow reply must not pass for Redis failing before the kill.
// A dead primary fails calls at once (connection refused), not by timeout.

async function sentinelGroup(module) {
  const g = new SentinelGroup("redis-7.0", { module });
  groups.add(g);
  return g.start();
}

/**
 * A gateway's client: ioredis through the sentinels. No offline queue and
 * no retries of a command: a call made while it has no primary fails at
 * once (the policy answers) instead of running later, unanswered, on the
 * next primary; it reconnects every 50 ms. A sentinel that has not yet
 * heard of the switch names the old primary, which may be back by then as
 * a replica: READONLY makes ioredis ask the sentinels again, as the
 * package's README advises, instead of staying on a replica for good.
 */
async function sentinelClient(group) {
  const c = new Redis({
    sentinels: group.addresses,
    name: SentinelGroup.NAME,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => 50,
    sentinelRetryStrategy: () => 50,
    reconnectOnError: (error) => error.message.startsWith("READONLY"),
  });
  c.on("error", () => {});
  await new Promise((resolve) => c.once("ready", resolve));
  return c;
}

/** Every answer of a run, with when its call started and ended (performance.now()). */
class Run {
  constructor(keys, max) {
    this.keys = keys;
    this.max = max;
    this.bucket = new Bucket({ max, rate: SLOW });
    this.answers = [];
    this.drained = new Set(); // keys Redis itself denied (remaining 0): spent for good
    this.began = performance.now();
    this.deadline = this.began + 60_000; // a switch that never ends fails the test, not hangs it
  }

  get admitted() {
    return this.answers.filter((a) => a.allowed && !a.degraded && !a.shed).length;
  }

  /**
   * The exact budget: every bucket's max, plus what SLOW refills over the
   * run, rounded down (a token not whole admits nothing): 0 for any run
   * under 1000 s.
   */
  get budget() {
    const seconds = (performance.now() - this.began) / 1000;
    return this.keys.length * (this.max + Math.floor(SLOW * seconds));
  }

  /**
   * `workers` loops of `lim.consume` over the keys not yet drained, each
   * answer recorded, until `stop()` says so or every key is drained.
   */
  drive(name, lim, workers, stop) {
    let next = 0;
    const loop = async () => {
      while (!stop() && this.drained.size < this.keys.length && performance.now() < this.deadline) {
        const key = this.keys[next++ % this.keys.length];
        if (this.drained.has(key)) continue;
        const start = performance.now();
        const d = await lim.consume(key, this.bucket);
        const a = { name, key, start, end: performance.now(), allowed: d.allowed, degraded: d.degraded, shed: d.shed };
        this.answers.push(a);
        if (!d.allowed && !d.degraded && !d.shed && d.remaining === 0) this.drained.add(key);
        if (d.degraded || d.shed) await sleep(2); // no busy loop while Redis is away
      }
    };
    return Promise.all(Array.from({ length: workers }, loop));
  }
}

/** The primary's writes so far are on the replica: a write of its own, acknowledged by WAIT. */
async function caughtUp(group) {
  const admin = group.primary.admin();
  try {
    await admin.call("SET", "tb:sync", "1");
    assert.equal(await admin.call("WAIT", "1", "5000"), 1, "the replica acknowledged the primary's writes");
  } finally {
    admin.disconnect();
  }
}

/**
 * The answers against the switch: none degraded before Redis failed
 * (the kill, or the replica's link cut: a call in flight then may be); each
 * degraded one its policy's (open admits, closed denies); none degraded
 * from a call that started once Redis had answered again after the kill.
 */
function checkSwitch(run, failedAt, killedAt, policies) {
  for (const [name, policy] of Object.entries(policies)) {
    const mine = run.answers.filter((a) => a.name === name);
    const degraded = mine.filter((a) => a.degraded);
    assert.equal(mine.filter((a) => a.shed).length, 0, `${name}: nothing shed`);
    assert.ok(degraded.length > 0, `${name}: the switch was seen (degraded answers while Redis failed)`);
    assert.ok(
      degraded.every((a) => a.end >= failedAt),
      `${name}: no degraded answer before Redis failed`,
    );
    assert.ok(
      degraded.every((a) => a.allowed === (policy === "open")),
      `${name}: degraded answers are onError ${policy}'s`,
    );
    // Redis's first admission after the kill: it answers again (a denial
    // alone could come while no replica acknowledges admissions).
    const back = mine.filter((a) => !a.degraded && a.allowed && a.start >= killedAt).map((a) => a.end);
    assert.ok(back.length > 0, `${name}: Redis admitted again after the switch`);
    const exactFrom = Math.min(...back);
    const late = degraded.filter((a) => a.start > exactFrom);
    assert.equal(late.length, 0, `${name}: answers after the switch are exact, not degraded`);
  }
}

async function closeAll(clients) {
  for (const c of clients) c.disconnect();
}

test("node-redis's Sentinel client is refused at construction, naming the client to use", () => {
  const sentinel = createSentinel({ name: "tb", sentinelRootNodes: [{ host: "127.0.0.1", port: 1 }] });
  assert.throws(() => new Limiter(sentinel), { name: "TypeError", message: /createSentinel.*ioredis/ });
});

for (const [label, module] of [
  ["module", true],
  ["Lua library", false],
]) {
  test(`Sentinel, ${label}: once the replica has caught up, a crash failover mints nothing`, async (t) => {
    const group = await sentinelGroup(module);
    const clients = [await sentinelClient(group), await sentinelClient(group)];
    try {
      const lims = {
        closed: new Limiter(clients[0], { onError: "closed", timeoutMs: 1000, logger: quiet }),
        open: new Limiter(clients[1], { onError: "open", timeoutMs: 1000, logger: quiet }),
      };
      const keys = Array.from({ length: 8 }, (_, i) => `rl:sentinel:${i}`);
      const run = new Run(keys, 40);
      // Before: a fixed number of calls, half the budget; all of them Redis's answers.
      let calls = 0;
      const half = (keys.length * run.max) / 2;
      await Promise.all(Object.entries(lims).map(([name, lim]) => run.drive(name, lim, 2, () => calls++ >= half)));
      assert.ok(
        run.answers.every((a) => !a.degraded && a.allowed),
        "before the kill: exact admissions only",
      );
      await caughtUp(group);
      const killedAt = performance.now();
      await group.primary.stopAndWait();
      const promoted = group.promoted().then(
        () => undefined,
        (error) => error,
      );
      // Through the switch and after it, until Redis has denied every key.
      await Promise.all(Object.entries(lims).map(([name, lim]) => run.drive(name, lim, 2, () => false)));
      assert.equal(await promoted, undefined, "Sentinel promoted the replica");
      assert.equal(run.drained.size, keys.length, "Redis denied every key in the end");
      const minted = run.admitted - run.budget;
      t.diagnostic(`${label}, caught up: admitted ${run.admitted} of a budget of ${run.budget}: minted ${minted}`);
      assert.ok(minted <= 0, `minted ${minted} tokens`);
      checkSwitch(run, killedAt, killedAt, { closed: "closed", open: "open" });
      // The new primary's buckets: exactly spent, as its answers say.
      for (const key of keys) {
        const d = await lims.closed.peek(key, run.bucket);
        assert.deepEqual([d.allowed, d.degraded, d.remaining], [false, false, 0], key);
      }
    } finally {
      await closeAll(clients);
      group.stop();
    }
  });

  // A replica that keeps up (loopback), and one whose link is cut just
  // before the crash (group.cutReplica, then 100 more answers: what the
  // primary admits meanwhile reaches no replica). The second only with
  // the module: the backends differ in no way there.
  const variants = [
    [1, false],
    [0, false],
  ];
  if (module) variants.push([1, true], [0, true]);
  for (const [waitReplicas, lag] of variants) {
    const what = `${waitReplicas ? "waitReplicas: 1" : "the defaults"}${lag ? ", the replica's link lost just before" : ""}`;
    test(`Sentinel, ${label}: tokens minted by a crash failover under load, ${what}`, async (t) => {
      const group = await sentinelGroup(module);
      const clients = [await sentinelClient(group), await sentinelClient(group)];
      const admin = group.primary.admin();
      try {
        const options = { onError: "closed", timeoutMs: 1000, logger: quiet, waitReplicas, waitTimeoutMs: 500 };
        const lims = clients.map((c) => new Limiter(c, options));
        const keys = Array.from({ length: 16 }, (_, i) => `rl:load:${i}`);
        const run = new Run(keys, 100);
        // The kill comes once a quarter of the budget is admitted, the load running.
        let [failedAt, killedAt] = [Number.POSITIVE_INFINITY, Number.POSITIVE_INFINITY];
        let lagging = 0;
        const killed = (async () => {
          await admin.ping();
          while (run.admitted < (keys.length * run.max) / 4) await sleep(1);
          failedAt = performance.now();
          if (lag) {
            const [answers, admitted] = [run.answers.length, run.admitted];
            await group.cutReplica(admin);
            while (run.answers.length < answers + 100) await sleep(1);
            lagging = run.admitted - admitted;
          }
          killedAt = performance.now();
          await group.primary.stopAndWait();
          await group.promoted();
          // The new primary has no replica: with waitReplicas every
          // admission fails (onError) until the old one is back as its replica.
          await group.rejoin();
        })().then(
          () => undefined,
          (error) => error,
        );
        await Promise.all(lims.map((lim, i) => run.drive(`gateway ${i + 1}`, lim, 4, () => false)));
        assert.equal(await killed, undefined, "the primary killed, Sentinel promoted the replica");
        assert.equal(run.drained.size, keys.length, "Redis denied every key in the end");
        const before = run.answers.filter((a) => a.end < killedAt && a.allowed && !a.degraded).length;
        const minted = run.admitted - run.budget;
        const window = lag ? `, ${lagging} while the link was down` : "";
        t.diagnostic(
          `${label}, ${what}: admitted ${run.admitted} (${before} before the kill${window}) of a budget of ${run.budget}: minted ${minted}`,
        );
        if (waitReplicas > 0) assert.ok(minted <= 0, `minted ${minted} tokens`);
        checkSwitch(run, failedAt, killedAt, { "gateway 1": "closed", "gateway 2": "closed" });
      } finally {
        admin.disconnect();
        await closeAll(clients);
        group.stop();
      }
    });
  }
}
