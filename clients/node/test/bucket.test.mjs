// Bucket and argument checks: the module's rules and texts, before any round trip.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Bucket, InvalidArgument, Limiter } from "redis-tokenbucket";
import { client } from "./clients.mjs";
import { calls, stopAll, target } from "./servers.mjs";

after(stopAll);

// [max, rate, cost, field, message]: the module's own cases, docs/commands.md.
const BAD = [
  ["x", 1, 1, "max", "max must be a finite decimal number"],
  ["nan", 1, 1, "max", "max must be a finite decimal number"],
  [Number.POSITIVE_INFINITY, 1, 1, "max", "max must be a finite decimal number"],
  ["0x10", 1, 1, "max", "max must be a finite decimal number"],
  [" 10", 1, 1, "max", "max must be a finite decimal number"],
  ["", 1, 1, "max", "max must be a finite decimal number"],
  ["1e309", 1, 1, "max", "max must be a finite decimal number"],
  ["\u0661\u0660", 1, 1, "max", "max must be a finite decimal number"],
  [true, 1, 1, "max", "max must be a finite decimal number"],
  [0, 1, 1, "max", "max must be > 0 and <= 1e12"],
  [-1, 1, 1, "max", "max must be > 0 and <= 1e12"],
  ["1e-400", 1, 1, "max", "max must be > 0 and <= 1e12"],
  [2e12, 1, 1, "max", "max must be > 0 and <= 1e12"],
  [10, "inf", 1, "rate", "rate must be a finite decimal number"],
  [10, 0, 1, "rate", "rate must be > 0 and <= 1e12"],
  [10, -0.5, 1, "rate", "rate must be > 0 and <= 1e12"],
  [10, 1e13, 1, "rate", "rate must be > 0 and <= 1e12"],
  [1e12, 1, 1, "rate", "rate is too low for max: max/rate must be <= 1e10 seconds"],
  [10, 1, "0x1", "cost", "cost must be a finite decimal number"],
  [10, 1, Number.NaN, "cost", "cost must be a finite decimal number"],
  [10, 1, -1, "cost", "cost must be >= 0"],
  [10, 1, 11, "cost", "cost must not exceed max, it could never pass"],
  [0.5, 1, 1, "cost", "cost must not exceed max, it could never pass"],
  [1e12, 1000, 0.00001, "cost", "cost is too small to charge a bucket of this max: use 0 or at least max/2^53"],
  [1, 1, 1e-17, "cost", "cost is too small to charge a bucket of this max: use 0 or at least max/2^53"],
];

test("bad arguments throw the module's error, and the module says the same", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const lim = new Limiter(c.client);
    for (const [max, rate, cost, field, text] of BAD) {
      const err = await (async () => {
        try {
          await lim.consume("rl:bad", new Bucket({ max, rate }), cost);
        } catch (e) {
          return e;
        }
        return undefined;
      })();
      assert.ok(err instanceof InvalidArgument, `${max} ${rate} ${cost}: ${err}`);
      assert.ok(err instanceof RangeError);
      assert.deepEqual([err.field, err.message], [field, text], `${max} ${rate} ${cost}`);
      // The module, given the same text, refuses it with the same words.
      const raw = [max, rate, cost].map((v) => (typeof v === "number" ? String(v) : String(v)));
      if (typeof max === "boolean") continue; // no text form
      const reply = await c.client.call("TB.CONSUME", "rl:bad", ...raw).then(
        () => "admitted",
        (e) => e.message,
      );
      assert.equal(reply, `ERR ${text}`, `the module on ${raw}`);
    }
    // Only the raw calls reached Redis.
    assert.equal(await calls(t.server, "tb.consume"), BAD.length - 1);
  } finally {
    c.close();
  }
});

test("the grammar takes decimals as the module does", () => {
  for (const [value, expected] of [
    ["10", 10],
    ["+.5", 0.5],
    ["5.", 5],
    ["1E3", 1000],
    [0.17, 0.17],
  ]) {
    assert.equal(new Bucket({ max: value, rate: 1 }).max, expected);
  }
});

test("the smallest charging cost is the module's", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const lim = new Limiter(c.client);
    for (const max of [1, 3, 1e12, 0.75, 2 ** 39]) {
      const b = new Bucket({ max, rate: max });
      const least = max / 2 ** 53;
      const d = await lim.consume(`rl:least:${max}`, b, least * 2);
      assert.ok(d.allowed);
      await assert.rejects(lim.consume(`rl:least:${max}`, b, least / 4), /cost is too small/);
      const raw = await c.client
        .call("TB.CONSUME", "rl:raw", String(max), String(max), String(least / 4))
        .catch((e) => e.message);
      assert.match(String(raw), /cost is too small/);
    }
  } finally {
    c.close();
  }
});

test("a Bucket is an immutable value with a checked name", () => {
  const b = new Bucket({ max: 10, rate: 0.17, name: "user" });
  assert.deepEqual([b.max, b.rate, b.name, b.args], [10, 0.17, "user", ["10", "0.17"]]);
  assert.throws(() => {
    b.max = 3;
  }, TypeError);
  assert.equal(b.named("ip").name, "ip");
  assert.ok(b.named("ip").sameLimits(b));
  assert.throws(() => new Bucket({ max: 1, rate: 1, name: "" }), /name must be a non-empty string of printable ASCII/);
  assert.throws(() => new Bucket({ max: 1, rate: 1, name: "é" }), /printable ASCII/);
  assert.throws(() => new Bucket(10), TypeError);
});

test("consumeMany reports the module's first error, with its group", async () => {
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const lim = new Limiter(c.client);
    const b = new Bucket({ max: 5, rate: 1 });
    const cases = [
      [
        [
          ["a", b, 1],
          ["b", b, 6],
        ],
        "cost",
        "cost must not exceed max, it could never pass (group 2)",
      ],
      [
        [
          ["a", b, 1],
          ["b", b, 1],
          [Buffer.from("a"), b, 1],
        ],
        "key",
        "duplicate key: group 3 repeats the key of group 1",
      ],
    ];
    for (const [groups, field, text] of cases) {
      await assert.rejects(
        lim.consumeMany(groups),
        (e) => e instanceof InvalidArgument && e.field === field && e.message === text,
      );
      const raw = ["TB.MCONSUME", ...groups.flatMap(([k, bb, cost]) => [k, ...bb.args, String(cost)])];
      assert.equal(await c.client.call(...raw).catch((e) => e.message), `ERR ${text}`);
    }
    await assert.rejects(lim.consumeMany([]), /at least one/);
    const many = Array.from({ length: 10_001 }, (_, i) => [`k${i}`, b, 1]);
    await assert.rejects(lim.consumeMany(many), /too many buckets: at most 10000 groups per call/);
    await assert.rejects(lim.consumeMany([["a", { max: 1, rate: 1 }, 1]]), /expected a Bucket \(group 1\)/);
    await assert.rejects(lim.consume(42, b), /a key must be a string or a Buffer/);
  } finally {
    c.close();
  }
});

// The grammar error after the limit it names (contract.json, as rendered).
const GRAMMAR = ": expected N/unit or N per [k] unit, units: second, minute, hour, day, month, year";

test("Bucket.parse reads limits' strings as the other packages do", () => {
  const b = Bucket.parse("10/minute", "user");
  assert.deepEqual([b.max, b.rate, b.name], [10, 10 / 60, "user"]);
  assert.deepEqual([Bucket.parse(" 3 / second ").max, Bucket.parse("86400/day").rate], [3, 1]);
  for (const [limit, max, seconds] of [
    ["10/min", 10, 60],
    ["10 per minute", 10, 60],
    ["100/5minutes", 100, 300],
    ["100 per 5 minutes", 100, 300],
    ["7 PER 2 Hrs", 7, 7200],
    ["1/mo", 1, 30 * 86400],
    ["12/year", 12, 360 * 86400],
    ["1e3/d", 1000, 86400],
  ]) {
    const parsed = Bucket.parse(limit);
    assert.deepEqual([parsed.max, parsed.rate], [max, max / seconds], limit);
  }
  for (const limit of [
    "10/fortnight",
    "10 perminute",
    "10/0 minutes",
    "10/second;1000/day",
    "10/mínute",
    "10/constructor",
  ]) {
    assert.throws(
      () => Bucket.parse(` ${limit} `),
      (e) => e instanceof InvalidArgument && e.field === "limit" && e.message === `invalid limit '${limit}'${GRAMMAR}`,
      limit,
    );
  }
  assert.throws(() => Bucket.parse("x/minute"), /max must be a finite decimal number/);
  assert.throws(() => Bucket.parse("0/minute"), /max must be > 0/);
  assert.throws(() => Bucket.parse("1/400 years"), /rate is too low for max/);
});

test("Bucket.parseMany reads each limit of a list in order, and names the one it refuses", () => {
  const buckets = Bucket.parseMany("10/second; 1000/day, 5 per hour|1/y");
  assert.deepEqual(
    buckets.map((b) => [b.max, b.rate]),
    [
      [10, 10],
      [1000, 1000 / 86400],
      [5, 5 / 3600],
      [1, 1 / (360 * 86400)],
    ],
  );
  assert.throws(() => Bucket.parseMany("10/second;"), { field: "limit", message: `invalid limit ''${GRAMMAR}` });
  assert.throws(() => Bucket.parseMany("10/second; 1/fortnight"), {
    message: `invalid limit '1/fortnight'${GRAMMAR}`,
  });
});
