// The failure model (docs/failure-model.md): policies when Redis fails, the
// breaker, the deadline from the write, shedding when the process is busy
// (never admitting), usage errors that always throw, decision events.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Breaker, Bucket, CircuitOpenError, Limiter, RedisTimeoutError } from "redis-tokenbucket";
import { client } from "./clients.mjs";
import { freePort, Server, SLOW, stopAll, target } from "./servers.mjs";

after(stopAll);

const B = new Bucket({ max: 10, rate: SLOW, name: "user" });
const quiet = { error() {}, warn() {} };

/** Blocks the event loop for `ms`: the process is busy. */
function busy(ms) {
  const end = performance.now() + ms;
  while (performance.now() < end) {}
}

/** Counts the commands the limiter hands the client. */
function counted(c) {
  const counter = { n: 0 };
  if (typeof c.call === "function") {
    const call = c.call.bind(c);
    c.call = (...a) => {
      counter.n++;
      return call(...a);
    };
  } else {
    const send = c.sendCommand.bind(c);
    c.sendCommand = (...a) => {
      counter.n++;
      return send(...a);
    };
  }
  return counter;
}

async function ownServer() {
  return new Server("redis-7.0", { module: true }).start();
}

for (const lib of ["ioredis", "redis6"]) {
  test(`${lib}: Redis killed answers by policy, degraded; raise throws`, async () => {
    const server = await ownServer();
    const c = await client(lib, server.port);
    try {
      const lims = Object.fromEntries(
        ["raise", "open", "closed", "local"].map((p) => [
          p,
          new Limiter(c.client, { onError: p, logger: quiet, breaker: false }),
        ]),
      );
      for (const lim of Object.values(lims)) assert.ok((await lim.consume("k", B)).allowed); // backend known
      await server.stopAndWait();
      const open = await lims.open.consume("k", B);
      assert.deepEqual([open.allowed, open.degraded, open.shed, open.remaining], [true, true, false, 0]);
      const closed = await lims.closed.consume("k", B);
      assert.deepEqual([closed.allowed, closed.degraded, closed.retryAfterMs], [false, true, 0]);
      const local = await lims.local.consumeMany([
        ["k", B],
        ["j", B, 3],
      ]);
      assert.ok(local.allowed && local.degraded);
      assert.deepEqual(
        local.decisions.map((d) => d.remaining),
        [9, 7],
      );
      await assert.rejects(lims.raise.consume("k", B), (e) => e instanceof Error && !(e instanceof CircuitOpenError));
      // Per call, the policy can change.
      assert.ok((await lims.raise.consume("k", B, 1, { onError: "open" })).degraded);
    } finally {
      c.close();
      server.stop();
    }
  });
}

test("the breaker opens within K failures, then answers without the network; Redis back closes it", async () => {
  const server = await ownServer();
  const c = await client("ioredis", server.port);
  try {
    const breaker = new Breaker({ failures: 3, windowMs: 10_000, cooldownMs: 300 });
    const events = [];
    const lim = new Limiter(c.client, { onError: "closed", breaker, logger: quiet, onDecision: (e) => events.push(e) });
    assert.ok((await lim.consume("k", B)).allowed);
    const sent = counted(c.client);
    await server.stopAndWait();
    for (let i = 0; i < 3; i++) assert.ok((await lim.consume("k", B)).degraded);
    assert.equal(lim.breakerState, "open");
    assert.equal(sent.n, 3);
    const t0 = performance.now();
    for (let i = 0; i < 50; i++) {
      const d = await lim.consume("k", B);
      assert.ok(d.degraded && !d.allowed);
    }
    assert.equal(sent.n, 3, "no command while the breaker is open");
    assert.ok(performance.now() - t0 < 100 * 3, "no timeout paid while open");
    await assert.rejects(lim.consume("k", B, 1, { onError: "raise" }), CircuitOpenError);
    // Back: after the cooldown one call probes and closes it.
    await server.restart();
    await new Promise((r) => setTimeout(r, 350));
    let d;
    for (let i = 0; i < 50 && lim.breakerState !== "closed"; i++) {
      d = await lim.consume("k", B);
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(lim.breakerState, "closed");
    const after = await lim.consume("k", B);
    assert.ok(!after.degraded && after.allowed);
    assert.equal(events.at(-1).breaker, "closed");
    assert.ok(events.some((e) => e.breaker === "open" && e.degraded && e.backend === ""));
    void d;
  } finally {
    c.close();
    server.stop();
  }
});

test("a failed probe opens the breaker again", async () => {
  const server = await ownServer();
  const c = await client("ioredis", server.port);
  try {
    const lim = new Limiter(c.client, {
      onError: "open",
      breaker: new Breaker({ failures: 1, cooldownMs: 200 }),
      logger: quiet,
    });
    await lim.consume("k", B);
    await server.stopAndWait();
    await lim.consume("k", B);
    assert.equal(lim.breakerState, "open");
    await new Promise((r) => setTimeout(r, 250));
    const sent = counted(c.client);
    assert.ok((await lim.consume("k", B)).degraded); // the probe
    assert.equal(sent.n, 1);
    assert.equal(lim.breakerState, "open");
  } finally {
    c.close();
    server.stop();
  }
});

for (const lib of ["ioredis", "redis6"]) {
  test(`${lib}: a frozen Redis is a failure once the budget from the write passes`, async () => {
    const server = await ownServer();
    const c = await client(lib, server.port);
    try {
      const lim = new Limiter(c.client, { onError: "open", timeoutMs: 100, logger: quiet });
      await lim.consume("k", B);
      server.pause();
      const t0 = performance.now();
      const d = await lim.consume("k", B);
      const took = performance.now() - t0;
      assert.ok(d.allowed && d.degraded && !d.shed);
      assert.ok(took >= 95 && took < 1000, `took ${took} ms`);
      const raise = new Limiter(c.client, { timeoutMs: 100, breaker: false });
      await raise.consume("k2", B, 1, { onError: "open" }); // (backend found)
      await assert.rejects(raise.consume("k", B), RedisTimeoutError);
      for (let i = 0; i < 5; i++) await lim.consume("k", B);
      assert.equal(lim.breakerState, "open");
    } finally {
      server.resume();
      c.close();
      server.stop();
    }
  });
}

test("a reply that came while the event loop was busy is read, not failed", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const lim = new Limiter(c.client, { onError: "open", timeoutMs: 50 });
    await lim.consume("k", B);
    // From the check phase, so that the loop's next phase is its timers:
    // the deadline's timer runs before the poll that would read the reply.
    await new Promise((resolve) => setImmediate(resolve));
    const pending = lim.consume("k", B);
    busy(300); // the reply arrives meanwhile; the timer runs 250 ms late
    const d = await pending;
    assert.deepEqual([d.allowed, d.degraded, d.shed, d.remaining], [true, false, false, 8]);
    assert.equal(lim.breakerState, "closed");
  } finally {
    c.close();
  }
});

test("a busy process sheds, never admits: a connection not up while the loop lags", async () => {
  const server = await ownServer();
  try {
    server.pause(); // accepts connections (its kernel does), answers nothing
    const c = await client("ioredis", server.port, {}, { lazyConnect: true, enableReadyCheck: true });
    const events = [];
    for (const onError of ["open", "raise"]) {
      const lim = new Limiter(c.client, {
        onError,
        backend: "module",
        timeoutMs: 50,
        onDecision: (e) => events.push(e),
      });
      const pending = lim.consume("k", B);
      busy(200); // the timer runs 150 ms late: the wait can't be blamed on Redis
      const d = await pending;
      assert.deepEqual([d.allowed, d.shed, d.degraded, d.retryAfterMs], [false, true, false, 1000]);
      assert.equal(lim.breakerState, "closed", "shedding never counts against Redis");
    }
    assert.deepEqual(
      events.map((e) => [e.shed, e.allowed, e.backend]),
      [
        [true, false, ""],
        [true, false, ""],
      ],
    );
    // The same wait with a loop that keeps up is Redis's failure.
    const lim = new Limiter(c.client, { onError: "open", backend: "module", timeoutMs: 50, logger: quiet });
    const d = await lim.consume("k", B);
    assert.deepEqual([d.allowed, d.shed, d.degraded], [true, false, true]);
    c.close();
  } finally {
    server.resume();
    server.stop();
  }
});

test("onError local admits about a processes' share of each key while Redis is down", async () => {
  const server = await ownServer();
  const c = await client("ioredis", server.port);
  try {
    const lim = new Limiter(c.client, {
      onError: "local",
      processes: 4,
      logger: quiet,
      breaker: new Breaker({ failures: 1 }),
    });
    const bucket = new Bucket({ max: 40, rate: SLOW });
    await lim.consume("warm", bucket);
    await server.stopAndWait();
    for (const key of ["a", "b"]) {
      let admitted = 0;
      for (let i = 0; i < 40; i++) {
        const d = await lim.consume(key, bucket);
        assert.ok(d.degraded);
        if (d.allowed) admitted++;
      }
      assert.equal(admitted, 10, key);
    }
    const denied = await lim.consume("a", bucket);
    assert.ok(!denied.allowed && denied.retryAfterMs > 0, "a local denial has its wait");
    // A cost above the share can't pass here.
    assert.ok(!(await lim.consume("c", bucket, 20)).allowed);
    // Plain "open" is unlimited meanwhile.
    const open = new Limiter(c.client, { onError: "open", logger: quiet, breaker: new Breaker({ failures: 1 }) });
    await open.consume("z", bucket, 1, { timeoutMs: 50 });
    let admitted = 0;
    for (let i = 0; i < 100; i++) if ((await open.consume("a", bucket, 1, { timeoutMs: 50 })).allowed) admitted++;
    assert.equal(admitted, 100);
  } finally {
    c.close();
    server.stop();
  }
});

// Real servers that refuse writes for now: each is Redis failing, answered
// by the policy (docs/failure-model.md), never thrown as a usage error.
const REFUSALS = [
  ["NOREPLICAS", ["CONFIG", "SET", "min-replicas-to-write", "1"], ["CONFIG", "SET", "min-replicas-to-write", "0"]],
  ["OOM", ["CONFIG", "SET", "maxmemory", "1"], ["CONFIG", "SET", "maxmemory", "0"]],
  ["READONLY", null, ["REPLICAOF", "NO", "ONE"]],
];
for (const lib of ["ioredis", "redis6"]) {
  test(`${lib}: a server that refuses writes for now (NOREPLICAS, OOM, READONLY) is Redis failing`, async () => {
    const server = await ownServer();
    const admin = server.admin();
    const c = await client(lib, server.port);
    try {
      const lim = (onError) => new Limiter(c.client, { onError, logger: quiet, breaker: false });
      const lims = { raise: lim("raise"), open: lim("open"), closed: lim("closed") };
      for (const l of Object.values(lims)) assert.ok((await l.consume("k", B)).allowed); // backend known
      for (const [code, refuse, restore] of REFUSALS) {
        // A replica of a primary that isn't there: writes are READONLY.
        await admin.call(...(refuse ?? ["REPLICAOF", "127.0.0.1", String(await freePort())]));
        await assert.rejects(lims.raise.consume("k", B), new RegExp(code), code);
        const open = await lims.open.consume("k", B);
        assert.deepEqual([code, open.allowed, open.degraded, open.shed], [code, true, true, false]);
        const closed = await lims.closed.consume("k", B);
        assert.deepEqual([code, closed.allowed, closed.degraded, closed.shed], [code, false, true, false]);
        await admin.call(...restore);
        assert.deepEqual([code, (await lims.closed.consume("k", B)).degraded], [code, false]);
      }
    } finally {
      admin.disconnect();
      c.close();
      server.stop();
    }
  });
}

test("usage errors throw under every policy and never open the breaker", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    await c.client.set("rl:str", "x");
    await c.client.hset("rl:hash", "a", "1");
    for (const onError of ["raise", "open", "closed", "local"]) {
      const lim = new Limiter(c.client, { onError, breaker: new Breaker({ failures: 1 }), logger: quiet });
      await assert.rejects(lim.consume("rl:str", B), /^ReplyError: WRONGTYPE/);
      await assert.rejects(lim.consume("rl:hash", B), /key is not a token bucket/);
      await assert.rejects(lim.consume("rl:k", B, 11), /cost must not exceed max/);
      assert.equal(lim.breakerState, "closed");
    }
  } finally {
    c.close();
  }
});

test("onDecision sees each decision once, and a hook that throws never breaks the call", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const events = [];
    const lim = new Limiter(c.client, { onDecision: (e) => events.push(e), denialCache: 10 });
    await lim.consume("a", B, 10);
    await lim.consume("a", B); // denied
    await lim.consume("a", B); // cached
    await lim.peek("b", B);
    await lim.adjust("b", B, 1);
    await lim.consumeMany([
      ["c", B],
      ["d", new Bucket({ max: 1, rate: 1, name: "ip" })],
    ]);
    await lim.detect();
    assert.deepEqual(
      events.map((e) => [e.op, e.policy, e.allowed, e.degraded, e.shed, e.cached, e.backend, e.breaker]),
      [
        ["consume", "user", true, false, false, false, "module", "closed"],
        ["consume", "user", false, false, false, false, "module", "closed"],
        ["consume", "user", false, false, false, true, "module", "closed"],
        ["peek", "user", true, false, false, false, "module", "closed"],
        ["adjust", "user", true, false, false, false, "module", "closed"],
        ["consume_many", "user,ip", true, false, false, false, "module", "closed"],
      ],
    );
    assert.ok(events.every((e) => e.latencyMs >= 0 && e.latencyMs < 5000));
    const logged = [];
    const throwing = new Limiter(c.client, {
      onDecision: () => {
        throw new Error("hook");
      },
      logger: { error: (m) => logged.push(m), warn() {} },
    });
    assert.ok((await throwing.consume("e", B)).allowed);
    assert.match(logged[0], /onDecision hook threw/);
  } finally {
    c.close();
  }
});

test("degraded answers are logged, at most one line a second per policy", async () => {
  const server = await ownServer();
  const c = await client("ioredis", server.port);
  try {
    const logged = [];
    const lim = new Limiter(c.client, {
      onError: "open",
      breaker: new Breaker({ failures: 1, cooldownMs: 60_000 }),
      logger: { error: (m) => logged.push(m), warn() {} },
    });
    await lim.consume("k", B);
    await server.stopAndWait();
    for (let i = 0; i < 20; i++) await lim.consume("k", B);
    assert.equal(logged.length, 1);
    assert.match(logged[0], /rate limiter unavailable \(fail-open: admitted\) for consume "k"/);
    await new Promise((r) => setTimeout(r, 1050));
    await lim.consume("k", B);
    assert.match(logged[1], /19 more degraded answers since the last report/);
  } finally {
    c.close();
    server.stop();
  }
});

test("options are checked", () => {
  const fake = { call() {}, status: "ready" };
  assert.throws(() => new Limiter(fake, { onError: "maybe" }), /onError must be one of raise, open, closed, local/);
  assert.throws(() => new Limiter(fake, { timeoutMs: 0 }), /timeoutMs must be a number of ms > 0/);
  assert.throws(() => new Limiter(fake, { processes: 0 }), /processes must be an integer >= 1/);
  assert.throws(() => new Limiter(fake, { breaker: "yes" }), /breaker must be a Breaker/);
  assert.throws(() => new Limiter({}), /needs an ioredis Redis or Cluster, or a node-redis client or cluster/);
  assert.throws(() => new Breaker({ failures: 0 }), /failures must be an integer >= 1/);
  assert.throws(() => new Breaker({ cooldownMs: -1 }), /cooldownMs must be > 0/);
  assert.equal(new Limiter(fake).timeoutMs, 100);
  assert.equal(new Limiter(fake, { timeoutMs: null }).timeoutMs, null);
});

test("nearLimitRatio outside (0, 1] and a shadow that is not a boolean are refused, naming them", () => {
  const fake = { status: "ready", call: async () => null };
  for (const ratio of [0, -0.5, 1.5, "0.8", Number.NaN]) {
    assert.throws(() => new Limiter(fake, { nearLimitRatio: ratio }), /nearLimitRatio must be a number in \(0, 1\]/);
  }
  assert.throws(() => new Limiter(fake, { shadow: "yes" }), /shadow must be true or false, got yes/);
});
