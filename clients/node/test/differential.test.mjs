// The same decisions whoever asks: the module and the Lua library (Functions
// and EVAL) through the Node client on the same keys, and the Node and
// Python clients taking turns on the same keys.
//
// Replies carry times that shrink as the clock runs (retry and reset count
// from now), so those are compared within the time the runs took;
// allowed and remaining must be equal. The refill rates are slow enough
// that no balance moves by a whole token during a run.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { after, test } from "node:test";
import { Bucket, Limiter } from "redis-tokenbucket";
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
