// The same decisions whoever asks: the module and the Lua library (Functions
// and EVAL) through the Node client on the same keys, for buckets and for
// leases, and the Node and Python clients taking turns on the same keys.
//
// Replies carry times that shrink as the clock runs (retry and reset count
// from now), so those are compared within the time the runs took;
// allowed and remaining must be equal. The refill rates are slow enough
// that no balance moves by a whole token during a run.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { after, test } from "node:test";
import { Bucket, Concurrency, Limiter } from "redis-tokenbucket";
import { client } from "./clients.mjs";
import { SLOW, stopAll, target } from "./servers.mjs";

after(stopAll);

const LIMITS = { A: [5, SLOW], B: [2.5, 0.002], LLM: [100_000, 0.5], D: [0.5, SLOW], F: [1, SLOW] };
const bucket = (name) => new Bucket({ max: LIMITS[name][0], rate: LIMITS[name][1] });

// [operation, arguments]: the Python package's scenario (test_differential.py).
const SCENARIO = [
  ["consume", ["a", "A", 1]],
  ["consume", ["a", "A", 3]],
  ["consume", ["a", "A", 2]], // denied: 1 left
  ["peek", ["a", "A", 1]],
  ["adjust", ["a", "A", 2]], // refund
  ["adjust", ["a", "A", -7]], // into debt
  ["consume", ["a", "A", 1]], // denied while in debt
  ["consume", ["b", "B", 2.5]],
  ["consume", ["b", "B", 0]], // cost 0 passes an empty bucket
  [
    "consume_many",
    [
      [
        ["c", "LLM", 350],
        ["d", "D", 0.5],
      ],
    ],
  ],
  [
    "consume_many",
    [
      [
        ["c", "LLM", 350],
        ["b", "B", 1],
      ],
    ],
  ], // b denies: c is not charged
  ["peek", ["e", "A", 5]],
  ["consume", ["f", "F", 0.3]],
  ["consume", ["f", "F", 0.7]],
  ["adjust", ["f", "F", 5]], // capped at max: full, the key is deleted
  ["peek", ["f", "F", 1]],
];

// The module's answers worked out by hand: 1000 * tokens / rate ms.
const EXPECTED = {
  0: [true, 4, 0, 1_000_000],
  1: [true, 1, 0, 4_000_000],
  2: [false, 1, 1_000_000, 4_000_000],
  4: [true, 3, 0, 2_000_000],
  5: [false, -4, 5_000_000, 9_000_000], // into debt: the next request of cost 1 waits
  7: [true, 0, 0, 1_250_000],
  9: [
    true,
    0,
    [
      [true, 99_650, 0, 700_000],
      [true, 0, 0, 500_000],
    ],
  ],
  10: [
    false,
    500_000,
    [
      [true, 99_650, 0, 700_000],
      [false, 0, 500_000, 1_250_000],
    ],
  ],
  11: [true, 5, 0, 0],
  14: [true, 1, 0, 0],
};

function normal(r) {
  if ("decisions" in r) return [r.allowed, r.retryAfterMs, r.decisions.map(normal)];
  return [r.allowed, r.remaining, r.retryAfterMs, r.resetAfterMs];
}

async function nodeStep(lim, prefix, [op, args]) {
  if (op === "consume_many")
    return normal(await lim.consumeMany(args[0].map(([k, b, c]) => [prefix + k, bucket(b), c])));
  return normal(await lim[op](prefix + args[0], bucket(args[1]), args[2]));
}

function assertSame(a, b, slack, where) {
  if (Array.isArray(a[2])) {
    assert.equal(a[0], b[0], where);
    assert.ok(Math.abs(a[1] - b[1]) <= slack, `${where}: ${a} vs ${b}`);
    for (const [i, x] of a[2].entries()) assertSame(x, b[2][i], slack, where);
    return;
  }
  assert.deepEqual(a.slice(0, 2), b.slice(0, 2), `${where}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
  assert.ok(Math.abs(a[2] - b[2]) <= slack && Math.abs(a[3] - b[3]) <= slack, `${where}: ${a} vs ${b}`);
}

async function runNode(lim, prefix) {
  const t0 = performance.now();
  const out = [];
  for (const step of SCENARIO) out.push(await nodeStep(lim, prefix, step));
  return [out, performance.now() - t0];
}

test("the module gives the hand-worked answers through the Node client", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  const [replies, took] = await runNode(new Limiter(c.client), "hand:");
  for (const [i, expected] of Object.entries(EXPECTED)) assertSame(replies[i], expected, took + 1, `step ${i}`);
  assert.deepEqual(replies[0], EXPECTED[0]);
  c.close();
});

test("module, Functions and EVAL give the same replies on the same keys", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("redis6", t.port);
  const runs = {};
  for (const backend of ["module", "functions", "eval"]) {
    await c.client.sendCommand(["FLUSHALL"]);
    runs[backend] = await runNode(new Limiter(c.client, { backend }), "same:");
  }
  const [ref, refTook] = runs.module;
  for (const backend of ["functions", "eval"]) {
    const [replies, took] = runs[backend];
    for (const [i, r] of replies.entries()) assertSame(ref[i], r, refTook + took + 1, `${backend} step ${i}`);
  }
  c.close();
});

// A lease's life, with buckets: [operation, lease key, arguments].
const CONCURRENCY = {
  C2: new Concurrency({ limit: 2, leaseMs: 60_000, name: "s" }),
  C3: new Concurrency({ limit: 3, leaseMs: 30_000 }),
};
const LEASES = [
  ["acquire", "s", "C2", { id: "a" }],
  ["acquire", "s", "C2", { id: "a" }], // a live id renews, counted once
  ["acquire", "s", "C2", { id: "b", buckets: [["u", "A", 2]] }],
  ["acquire", "s", "C2", { id: "c", buckets: [["u", "A", 1]] }], // full: the bucket is not charged
  [
    "acquire",
    "t",
    "C3",
    {
      id: "d",
      weight: 2,
      buckets: [
        ["u", "A", 4],
        ["v", "LLM", 100],
      ],
    },
  ], // u can't pay
  [
    "acquire",
    "t",
    "C3",
    {
      id: "d",
      weight: 3,
      buckets: [
        ["u", "A", 3],
        ["v", "LLM", 100],
      ],
    },
  ],
  ["renew", "s", "a"],
  ["release", "s", "a"],
  ["release", "s", "a"], // again: nothing
  ["renew", "s", "a"], // released: never recreated
  ["inflight", "s"],
  ["acquire", "s", "C2", { id: "e", weight: 2 }], // 1 + 2 > 2
  ["release", "s", "b"],
  ["inflight", "s"],
  ["acquire", "s", "C2", { id: "e", weight: 2 }],
  ["inflight", "t"],
  ["inflight", "nothing"],
];

async function runLeases(lim, prefix) {
  const t0 = performance.now();
  const leases = {};
  const out = [];
  for (const [op, key, ...args] of LEASES) {
    if (op === "acquire") {
      const [c, options] = args;
      const buckets = (options.buckets ?? []).map(([k, b, cost]) => [prefix + k, bucket(b), cost]);
      const l = await lim.acquire(prefix + key, CONCURRENCY[c], { ...options, buckets });
      leases[options.id] = l;
      out.push([l.acquired, l.inUse, l.retryAfterMs, l.expiresInMs, l.decisions.map(normal)]);
    } else if (op === "renew") {
      const l = leases[args[0]];
      out.push([await lim.renew(l), l.expiresInMs, l.lost]);
    } else if (op === "release") {
      out.push([await lim.release(leases[args[0]])]);
    } else {
      out.push([await lim.inFlight(prefix + key)]);
    }
  }
  return [out, performance.now() - t0];
}

/** Equal but for times, which may differ by `slack` ms (they count down from each call's clock). */
function assertClose(a, b, slack, where) {
  if (Array.isArray(a)) {
    assert.ok(Array.isArray(b) && a.length === b.length, `${where}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
    for (const [i, x] of a.entries()) assertClose(x, b[i], slack, where);
  } else if (typeof a === "number" && a > 1000) {
    assert.ok(Math.abs(a - b) <= slack, `${where}: ${a} vs ${b}`);
  } else {
    assert.equal(a, b, where);
  }
}

test("module, Functions and EVAL give the same lease replies and the same lease hashes", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const runs = {};
    const hashes = {};
    for (const backend of ["module", "functions", "eval"]) {
      runs[backend] = await runLeases(new Limiter(c.client, { backend }), `${backend}:`);
      const fields = await c.client.hgetall(`${backend}:t`);
      hashes[backend] = Object.entries(fields).map(([id, v]) => [id, v.split(":")[1]]);
    }
    const [ref, refTook] = runs.module;
    // The hand-worked answers of a few steps, on the module.
    assert.deepEqual(ref[1].slice(0, 3), [true, 1, 0]);
    assert.deepEqual(ref[3].slice(0, 2), [false, 2]);
    assert.deepEqual(
      ref[3][4].map((d) => d.slice(0, 2)),
      [[true, 3]],
    );
    // Denied: no bucket charged; each says whether it alone could pay, and what it holds.
    assert.deepEqual(
      ref[4][4].map((d) => d.slice(0, 2)),
      [
        [false, 3],
        [true, 100_000],
      ],
    );
    assert.deepEqual([ref[7], ref[8], ref[9].slice(0, 1), ref[9][2]], [[true], [false], [false], true]);
    assert.deepEqual([ref[10], ref[13], ref[14][0], ref[15], ref[16]], [[1], [0], true, [3], [0]]);
    assert.deepEqual(hashes.module, [["d", "3"]]);
    for (const backend of ["functions", "eval"]) {
      const [replies, took] = runs[backend];
      for (const [i, r] of replies.entries()) assertClose(ref[i], r, refTook + took + 1, `${backend} step ${i}`);
      assert.deepEqual(hashes[backend], hashes.module);
    }
  } finally {
    c.close();
  }
});

/** The Python package's Limiter in a child process, one step per line. */
function python(port) {
  const code = `
import json, sys, redis
from redis_tokenbucket import Bucket, Limiter
lim = Limiter(redis.Redis(port=int(sys.argv[1])))
for line in sys.stdin:
    prefix, (op, args), limits = json.loads(line)
    b = lambda n: Bucket(*limits[n])
    if op == "consume_many":
        r = lim.consume_many([(prefix + k, b(n), c) for k, n, c in args[0]])
        out = [r.allowed, r.retry_after_ms, [[d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms] for d in r.decisions]]
    else:
        d = getattr(lim, op)(prefix + args[0], b(args[1]), args[2])
        out = [d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms]
    print(json.dumps(out), flush=True)
`;
  const proc = spawn(process.env.TB_PYTHON ?? "python3", ["-c", code, String(port)], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: proc.stdout })[Symbol.asyncIterator]();
  return {
    async step(prefix, step) {
      proc.stdin.write(`${JSON.stringify([prefix, step, LIMITS])}\n`);
      const { value } = await lines.next();
      return JSON.parse(value);
    },
    close: () => proc.stdin.end(),
  };
}

for (const name of ["redis-7.0+module", "redis-7.0", "redis-6.2"]) {
  test(`${name}: the Node and Python clients taking turns on the same keys decide as Node alone`, async () => {
    const t = await target(name);
    const c = await client("ioredis", t.port);
    const py = python(t.port);
    try {
      const lim = new Limiter(c.client);
      const [ref, refTook] = await runNode(lim, "ref:");
      const t0 = performance.now();
      const mixed = [];
      for (const [i, step] of SCENARIO.entries()) {
        mixed.push(i % 2 ? await py.step("mix:", step) : await nodeStep(lim, "mix:", step));
      }
      const pyOnly = [];
      for (const step of SCENARIO) pyOnly.push(await py.step("py:", step));
      const took = performance.now() - t0;
      for (const [i, r] of mixed.entries()) assertSame(ref[i], r, refTook + took + 1, `mixed step ${i}`);
      for (const [i, r] of pyOnly.entries()) assertSame(ref[i], r, refTook + took + 1, `python step ${i}`);
      // And the stored balances agree, but for the refill between the runs (< 0.01 token).
      for (const k of ["a", "b", "c"]) {
        const [x, y] = [await c.client.hget(`ref:${k}`, "tokens"), await c.client.hget(`mix:${k}`, "tokens")];
        assert.ok(Math.abs(Number(x) - Number(y)) < 0.01, `${k}: ${x} vs ${y}`);
      }
    } finally {
      py.close();
      c.close();
    }
  });
}
