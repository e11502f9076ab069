// The Node runner of clients/spec: every scenario of the behaviour the
// clients share (clients/spec/README.md), without a server: a fake clock,
// and fake ioredis and node-redis clients that answer each command with
// the scenario's scripted reply. Limiter scenarios run once through each
// fake. It runs from the packed package (scripts/test-node.sh) and, in
// `make check`, from the built dist/ of clients/node (TB_NODE_DIST).

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

// ---- where things are --------------------------------------------------------------

function distUrl() {
  if (process.env.TB_NODE_DIST) return pathToFileURL(`${process.env.TB_NODE_DIST}/`);
  try {
    return new URL(".", import.meta.resolve("redis-tokenbucket")); // the installed package
  } catch {
    return new URL("../dist/esm/", import.meta.url); // clients/node, built
  }
}
const DIST = distUrl();
const pkg = await import(new URL("index.js", DIST).href);
const { classify } = await import(new URL("classify.js", DIST).href);
const breakerMod = await import(new URL("breaker.js", DIST).href);
const { Breaker, Bucket, CircuitOpenError, Concurrency, Decision, DenialCache, Limiter, NoBackendError, Shed } = pkg;
const { RedisTimeoutError, LIBRARY_VERSION, Quota } = pkg;

const SPEC = process.env.TB_REPO
  ? join(process.env.TB_REPO, "clients", "spec")
  : join(dirname(fileURLToPath(import.meta.url)), "..", "..", "spec");
const START_MS = 1_000_000;
const CLIENT = "node";

// The client libraries whose errors the cases name, as installed here.
const here = createRequire(import.meta.url);
function load(name) {
  try {
    return here(name);
  } catch {
    return undefined;
  }
}
const ioredis = {
  ReplyError: load("ioredis")?.ReplyError,
  MaxRetriesPerRequestError: load("ioredis/built/errors/MaxRetriesPerRequestError.js")?.default,
  ClusterAllFailedError: load("ioredis/built/errors/ClusterAllFailedError.js")?.default,
};
// node-redis majors: 4 (redis), and 6 (redis, or the test project's redis6 alias).
const nodeRedis = ["redis", "redis6"]
  .map((name) => {
    const mod = load(name);
    if (mod === undefined) return undefined;
    const major = Number(JSON.parse(readFileSync(here.resolve(`${name}/package.json`), "utf8")).version.split(".")[0]);
    return { name, major, mod };
  })
  .filter((x) => x !== undefined);
assert.ok(ioredis.ReplyError && ioredis.MaxRetriesPerRequestError, "ioredis must be installed for the spec's cases");
assert.ok(nodeRedis.length > 0, "node-redis must be installed for the spec's cases");

// ---- the scenarios -----------------------------------------------------------------

const files = readdirSync(SPEC)
  .filter((f) => f.endsWith(".json"))
  .sort();
const scenarios = files.flatMap((file) =>
  JSON.parse(readFileSync(join(SPEC, file), "utf8")).scenarios.map((s) => ({ ...s, file })),
);
const applies = (s) => s.clients === undefined || s.clients.includes(CLIENT);

for (const s of scenarios) {
  const title = `${s.file.replace(".json", "")}: ${s.name}`;
  if (!applies(s)) {
    test(title, { skip: `for ${s.clients.join(", ")} only` }, () => {});
    continue;
  }
  if (s.subject === "classify") test(title, () => runClassify(s));
  else if (s.subject === "breaker") test(title, () => runBreaker(s));
  else if (s.subject === "cache") test(title, () => runCache(s));
  else if (s.subject === "limit_strings") test(title, () => runLimitStrings(s));
  else if (s.subject === "limiter") {
    for (const fake of ["ioredis", "node-redis"]) test(`${title} [${fake}]`, () => runLimiter(s, fake));
  } else throw new Error(`${s.file}: ${s.name}: unknown subject ${s.subject}`);
}

test("the spec has scenarios in every area", () => {
  const subjects = new Set(scenarios.map((s) => s.subject));
  for (const subject of ["classify", "breaker", "cache", "limiter", "limit_strings"]) {
    assert.ok(subjects.has(subject), subject);
  }
});

// ---- errors, as each library makes them --------------------------------------------

/** A system error as Node's net makes it: "connect EMFILE 127.0.0.1:6379", with code, errno, syscall. */
function systemError(e) {
  const error = new Error(`${e.syscall} ${e.errno} 127.0.0.1:6379`);
  return Object.assign(error, { code: e.errno, errno: -e.number, syscall: e.syscall });
}

function nodeRedisClass(name, since) {
  const found = nodeRedis.filter((r) => r.major >= (since ?? 0) && typeof r.mod[name] === "function");
  assert.ok(found.length > 0, `no installed node-redis has ${name}`);
  return found.map((r) => r.mod[name]);
}

/** The errors `e` stands for in Node: one per library that makes it; [] if it is another client's. */
function errorsOf(e) {
  if (e.reply !== undefined) {
    return [new ioredis.ReplyError(e.reply), ...nodeRedisClass("ErrorReply").map((C) => new C(e.reply))];
  }
  if (e.errno !== undefined) return [systemError(e)];
  if (e.timeout === "after_write") return [new RedisTimeoutError("no reply from Redis within 100 ms of the command")];
  if (e.package !== undefined) {
    return [
      {
        circuit_open: () => new CircuitOpenError("the circuit breaker is open: Redis failed 5 times lately"),
        shed: () => new Shed("the event loop fell 80 ms behind the call"),
        no_backend: () => new NoBackendError([["module", new Error("ERR unknown command")]]),
        wrong_shape: () => new TypeError('unexpected reply from Redis: "OK"'),
      }[e.package](),
    ];
  }
  const cause = e.cause === undefined ? undefined : errorsOf(e.cause)[0];
  if (e.library === "node") {
    const C = { Error, TypeError }[e.class];
    return [new C(e.message, cause === undefined ? undefined : { cause })];
  }
  if (e.library === "ioredis") {
    if (e.class === "Error") return [new Error(e.message, cause === undefined ? undefined : { cause })];
    if (e.class === "MaxRetriesPerRequestError") return [new ioredis.MaxRetriesPerRequestError(e.retries)];
    if (e.class === "ClusterAllFailedError") return [new ioredis.ClusterAllFailedError(e.message, cause)];
    throw new Error(`ioredis class ${e.class} unknown to the runner`);
  }
  if (e.library === "node-redis") {
    return nodeRedisClass(e.class, e.since).map((C) => {
      if (e.class === "ReconnectStrategyError") return new C(new Error(e.original), errorsOf(e.socket)[0]);
      if (e.class === "SocketTimeoutError") return new C(e.timeout);
      return new C();
    });
  }
  return []; // redis-py's, lua-resty-redis's: other clients' words
}

function runClassify(s) {
  let ran = 0;
  for (const c of s.cases) {
    if (c.clients !== undefined && !c.clients.includes(CLIENT)) continue;
    for (const error of errorsOf(c.error)) {
      ran++;
      assert.equal(classify(error), c.kind, `${JSON.stringify(c.error)} as ${error.constructor.name}`);
    }
  }
  assert.ok(ran > 0 || s.cases.every((c) => c.error.library !== undefined), "no case ran");
}

// ---- limit strings -----------------------------------------------------------------

const LIMIT_CASE_FIELDS = new Set(["parse", "parse_many", "bucket", "buckets", "error", "why", "clients"]);

function runLimitStrings(s) {
  let ran = 0;
  for (const c of s.cases) {
    const unknown = Object.keys(c).filter((k) => !LIMIT_CASE_FIELDS.has(k));
    assert.deepEqual(unknown, [], `the node runner can't read ${unknown} in ${JSON.stringify(c)}`);
    if (c.clients !== undefined && !c.clients.includes(CLIENT)) continue;
    ran++;
    const many = "parse_many" in c;
    const text = many ? c.parse_many : c.parse;
    const parse = () => (many ? Bucket.parseMany(text) : [Bucket.parse(text)]);
    if (c.error !== undefined) {
      assert.throws(parse, (e) => {
        assert.deepEqual({ field: e.field, message: e.message }, c.error, JSON.stringify(text));
        return e.name === "InvalidArgument";
      });
      continue;
    }
    // Exact doubles: every client computes N / (k * unit seconds) alike.
    const got = parse().map((b) => ({ max: b.max, rate: b.rate }));
    assert.deepEqual(got, many ? c.buckets : [c.bucket], JSON.stringify(text));
  }
  assert.ok(ran > 0, "no case ran");
}

// ---- the breaker -------------------------------------------------------------------

const ENTER = { call: breakerMod.CALL, probe: breakerMod.PROBE, skip: breakerMod.SKIP };

function runBreaker(s) {
  const clock = { now: START_MS };
  const b = s.breaker;
  const breaker = new Breaker({
    failures: b.failures,
    windowMs: b.window_ms,
    cooldownMs: b.cooldown_ms,
    clock: () => clock.now,
  });
  for (const [i, step] of s.steps.entries()) {
    const where = `step ${i + 1}`;
    if (step.advance_ms !== undefined) clock.now += step.advance_ms;
    else if (step.state !== undefined) assert.equal(breaker.state, step.state, where);
    else if (step.enter !== undefined) assert.equal(breaker.enter(), ENTER[step.enter], `${where}: enter`);
    else if (step.report !== undefined) breaker[step.report](step.probe === true);
    else throw new Error(`${where}: unknown step ${JSON.stringify(step)}`);
  }
}

// ---- the denial cache --------------------------------------------------------------

const bucketOf = (b) => new Bucket(b);

function decisionOf(d, key) {
  return new Decision(d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms, key, bucketOf(d.bucket), d.cost);
}

function runCache(s) {
  const clock = { now: START_MS };
  const cache = new DenialCache(s.entries, () => clock.now);
  const tickets = new Map();
  for (const [i, step] of s.steps.entries()) {
    const where = `step ${i + 1}`;
    if (step.advance_ms !== undefined) clock.now += step.advance_ms;
    else if (step.sent !== undefined) tickets.set(step.as, cache.sent(step.sent, step.keys));
    else if (step.answered !== undefined) {
      const ticket = tickets.get(step.answered);
      const decisions = step.decisions.map((d, j) => decisionOf(d, ticket.ids[j]));
      cache.answered(ticket, step.allowed, step.retry_after_ms, decisions);
    } else if (step.failed !== undefined) cache.failed(tickets.get(step.failed));
    else if (step.size !== undefined) assert.equal(cache.size, step.size, `${where}: size`);
    else if (step.lookup !== undefined) {
      const l = step.lookup;
      const hit = cache.lookup(l.keys, l.buckets.map(bucketOf), l.costs);
      if (step.expect === null) assert.equal(hit, undefined, `${where}: a miss`);
      else {
        assert.ok(hit !== undefined, `${where}: a hit`);
        expectFields(hit, step.expect, where);
      }
    } else throw new Error(`${where}: unknown step ${JSON.stringify(step)}`);
  }
}

// ---- answers compared ----------------------------------------------------------------

const FIELDS = {
  allowed: "allowed",
  remaining: "remaining",
  retry_after_ms: "retryAfterMs",
  reset_after_ms: "resetAfterMs",
  degraded: "degraded",
  shed: "shed",
  cached: "cached",
  acquired: "acquired",
  in_use: "inUse",
  expires_in_ms: "expiresInMs",
  held: "held",
  lost: "lost",
  delay_ms: "delayMs",
  slept_ms: "sleptMs",
  shadow: "shadow",
  rule: "rule",
};

// The event's fields, as the spec names them (the same words but latency).
const EVENT_FIELDS = new Set(["op", "policy", "allowed", "degraded", "shed", "cached", "backend", "outcome", "rule"]);

/** Compares the one event a call reported with the step's `event`, and forgets the events. */
function checkEvent(events, step, where) {
  const got = events.splice(0);
  if (step.event === undefined) return;
  assert.equal(got.length, 1, `${where}: ${got.length} events, expected one`);
  for (const [name, value] of Object.entries(step.event)) {
    assert.ok(EVENT_FIELDS.has(name), `${where}: the runner knows no event field ${name}`);
    assert.equal(got[0][name], value, `${where}: event ${name}`);
  }
}

function expectFields(got, want, where) {
  for (const [name, value] of Object.entries(want)) {
    if (name === "decisions") {
      assert.ok(got.decisions.length >= value.length, `${where}: decisions`);
      for (const [i, d] of value.entries()) expectFields(got.decisions[i], d, `${where}: decision ${i + 1}`);
      continue;
    }
    const field = FIELDS[name];
    assert.ok(field !== undefined, `${where}: the runner knows no field ${name}`);
    assert.equal(got[field], value, `${where}: ${name}`);
  }
}

// ---- limiter scenarios: a fake Redis that answers from the script ------------------

/** A command as the spec names it (README.md, "Commands"): its name and the words that tell it apart. */
export function commandText(args) {
  const w = args.map((a) => (Buffer.isBuffer(a) ? a.toString("latin1") : String(a)));
  const name = w[0].toUpperCase();
  switch (name) {
    case "TB.CONSUME":
    case "TB.PEEK":
    case "TB.ADJUST":
    case "TB.INFLIGHT":
      return `${name} ${w[1]}${tailText(w.slice(5), "WAIT")}`;
    case "TB.QUOTA":
    case "TB.QPEEK":
    case "TB.QADJUST":
      return `${name} ${w[1]} ${w[3]}${tailText(w.slice(5), "OFFSET")}`;
    case "TB.MCONSUME":
      return [name, ...w.slice(1).filter((_, i) => i % 4 === 0)].join(" ");
    case "TB.CHARGE": {
      const n = Number(w[1]);
      return [name, ...w.slice(2, 2 + n)].join(" ") + tailText(w.slice(2 + n), "WAIT");
    }
    case "TB.ACQUIRE":
      return `${name} ${w[1]} ${w[4]}`;
    case "TB.RELEASE":
    case "TB.RENEW":
      return `${name} ${w[1]} ${w[2]}`;
    case "FCALL":
    case "FCALL_RO": {
      if (!(Number(w[2]) > 0)) return `${name} ${w[1]}`;
      return `${name} ${w[1]} ${w[3]}${libraryTail(w[1].replace(/^tb_/, ""), w.slice(4))}`;
    }
    case "EVALSHA":
    case "EVAL": {
      const n = Number(w[2]);
      return `${name} ${w[3 + n]} ${w[3]}${libraryTail(w[3 + n], w.slice(4 + n))}`;
    }
    case "FUNCTION":
      return `FUNCTION ${w[1].toUpperCase()}`;
    case "WAIT":
      return `WAIT ${w[1]}`;
    default:
      return [name, ...w.slice(1)].join(" ");
  }
}

/** ` WORD value` when the words after the amount are `WORD value`, else "". */
function tailText(rest, word) {
  return rest[0]?.toUpperCase() === word ? ` ${word} ${rest[1]}` : "";
}

/**
 * The words that tell a library call apart, after `fn key`: a quota's
 * period and OFFSET, a one-bucket call's WAIT (`args`: what follows the keys).
 */
function libraryTail(fn, args) {
  if (fn === "quota" || fn === "qpeek" || fn === "qadjust") return ` ${args[1]}${tailText(args.slice(3), "OFFSET")}`;
  if (fn === "consume" || fn === "peek") return tailText(args.slice(3), "WAIT");
  return "";
}

/** Whether an expected command (words, `$name` capturing a word) names `text`; captures in `vars`. */
function matches(expected, text, vars, bind) {
  const want = expected.split(" ");
  const got = text.split(" ");
  if (want.length > got.length) return false;
  const bound = {};
  for (const [i, word] of want.entries()) {
    if (word.startsWith("$")) {
      const known = vars.get(word) ?? bound[word];
      if (known === undefined) bound[word] = got[i];
      else if (known !== got[i]) return false;
    } else if (word !== got[i]) return false;
  }
  if (bind) for (const [k, v] of Object.entries(bound)) vars.set(k, v);
  return true;
}

function replyOf(reply) {
  if (reply === "$LIBRARY_VERSION") return LIBRARY_VERSION;
  return structuredClone(reply);
}

class FakeRedis {
  constructor(fake) {
    this.fake = fake;
    this.vars = new Map();
    this.active = []; // steps whose scripted replies are in play
    this.unexpected = [];
    this.sent = [];
  }

  client() {
    const command = (args) => this.command(args);
    if (this.fake === "ioredis") return { status: "ready", call: (...args) => command(args) };
    return { isReady: true, sendCommand: (args) => command(args) };
  }

  replyError(text) {
    if (this.fake === "ioredis") return new ioredis.ReplyError(text);
    const [ErrorReply] = nodeRedisClass("ErrorReply").slice(-1);
    return new ErrorReply(text);
  }

  failure(f) {
    if (f.errno !== undefined) return systemError(f);
    throw new Error(`the node runner can't make ${JSON.stringify(f)}`);
  }

  /** The entry of an active step that answers `text`: a strict step's next one, or any repeat or burst entry. */
  take(text) {
    for (const step of this.active) {
      const candidates = step.burst
        ? step.entries.filter((e) => e.repeat || e.used === 0)
        : [step.entries.find((e) => !e.repeat && e.used === 0), ...step.entries.filter((e) => e.repeat)];
      for (const e of candidates) {
        if (e !== undefined && matches(e.command, text, this.vars, false)) {
          matches(e.command, text, this.vars, true);
          e.used++;
          return { entry: e, step };
        }
      }
    }
    return undefined;
  }

  command(args) {
    const text = commandText(args);
    this.sent.push(text);
    const found = this.take(text);
    if (found === undefined) {
      this.unexpected.push(text);
      return Promise.reject(new Error(`the scenario expects no ${text}`));
    }
    const { entry, step } = found;
    const answer = () => {
      if (entry.reply !== undefined) return Promise.resolve(replyOf(entry.reply));
      if (entry.error !== undefined) return Promise.reject(this.replyError(entry.error));
      if (entry.fail?.timeout === "after_write") return new Promise(() => {}); // never: the budget runs out
      return Promise.reject(this.failure(entry.fail));
    };
    if (!entry.hold) return answer();
    return new Promise((resolve) => step.held.push(() => resolve(answer())));
  }

  begin(step, name, burst = false) {
    const entries = (step.redis ?? []).map((e) => ({ ...e, used: 0 }));
    const active = { name, entries, held: [], burst };
    this.active.unshift(active);
    return active;
  }

  end(active, where) {
    this.active = this.active.filter((a) => a !== active);
    const left = active.entries.filter((e) => !e.repeat && e.used === 0).map((e) => e.command);
    assert.deepEqual(left, [], `${where}: scripted commands never sent`);
    assert.deepEqual(this.unexpected, [], `${where}: commands the scenario does not expect`);
  }
}

/** Lets every call run until it is done or waits for a held reply. */
async function settle(redis) {
  let seen = -1;
  while (seen !== redis.sent.length) {
    seen = redis.sent.length;
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve));
  }
}

const LIMITER_OPTIONS = new Set([
  "backend",
  "on_error",
  "timeout_ms",
  "denial_cache",
  "breaker",
  "wait_replicas",
  "wait_timeout_ms",
  "shadow",
  "near_limit_ratio",
]);

function limiterOf(s, fake, clock, slept, events) {
  const o = s.limiter ?? {};
  for (const name of Object.keys(o)) assert.ok(LIMITER_OPTIONS.has(name), `the runner knows no limiter option ${name}`);
  const b = o.breaker;
  const breaker =
    b === false
      ? false
      : new Breaker({
          ...(b === undefined ? {} : { failures: b.failures, windowMs: b.window_ms, cooldownMs: b.cooldown_ms }),
          clock: () => clock.now,
        });
  const denialCache = o.denial_cache ? new DenialCache(o.denial_cache, () => clock.now) : undefined;
  return new Limiter(fake, {
    backend: o.backend,
    timeoutMs: o.timeout_ms ?? 100,
    onError: o.on_error ?? "raise",
    breaker,
    denialCache,
    ...(o.wait_replicas === undefined ? {} : { waitReplicas: o.wait_replicas }),
    ...(o.wait_timeout_ms === undefined ? {} : { waitTimeoutMs: o.wait_timeout_ms }),
    ...(o.shadow === undefined ? {} : { shadow: o.shadow }),
    ...(o.near_limit_ratio === undefined ? {} : { nearLimitRatio: o.near_limit_ratio }),
    onDecision: (event) => events.push(event),
    logger: { error() {}, warn() {} },
    // wait's sleep: the fake clock moves by it, and the call reports it.
    sleep: async (ms) => {
      clock.now += ms;
      slept.ms += ms;
    },
  });
}

/** A step's rule: its `bucket`, or its `quota` ({limit, period, offset?, name?}). */
function ruleOf(step) {
  if (step.quota === undefined) return bucketOf(step.bucket);
  assert.equal(step.bucket, undefined, "a step gives a bucket or a quota, not both");
  return new Quota(step.quota);
}

/** What a call answers, and for `wait` how long it slept (the fake sleep's total). */
async function invoke(limiter, step, leases, slept) {
  const options = step.on_error === undefined ? {} : { onError: step.on_error };
  if (step.max_wait_ms !== undefined) options.maxWaitMs = step.max_wait_ms;
  if (step.block_ms !== undefined) {
    assert.equal(step.call, "consume", "block_ms is a consume's");
    options.blockMs = step.block_ms;
  }
  if (step.shadow !== undefined) {
    assert.ok(["consume", "consume_many"].includes(step.call), `shadow is a consume's or a consume_many's`);
    options.shadow = step.shadow;
  }
  // A group's rule: a bucket, or a quota (it has a period).
  const ruleIn = (b) => (b.period === undefined ? bucketOf(b) : new Quota(b));
  const group = ([key, b, cost]) => (cost === undefined ? [key, ruleIn(b)] : [key, ruleIn(b), cost]);
  switch (step.call) {
    case "consume":
    case "peek":
      return limiter[step.call](step.key, ruleOf(step), step.cost ?? 1, options);
    case "adjust":
      return limiter.adjust(step.key, ruleOf(step), step.delta, options);
    case "wait": {
      slept.ms = 0;
      const d = await limiter.wait(step.key, ruleOf(step), step.cost ?? 1, options);
      return Object.assign(Object.create(d), { sleptMs: slept.ms });
    }
    case "consume_many":
      return limiter.consumeMany(step.groups.map(group), options);
    case "acquire": {
      const c = step.concurrency;
      const concurrency = new Concurrency({ limit: c.limit, leaseMs: c.lease_ms, name: c.name });
      return limiter.acquire(step.key, concurrency, {
        ...options,
        weight: step.weight,
        id: step.id,
        buckets: (step.buckets ?? []).map(group),
      });
    }
    case "renew":
    case "release":
      return limiter[step.call](leases.get(step.lease));
    case "in_flight":
      return limiter.inFlight(step.key);
    case "reset":
      return limiter.reset(step.key);
    case "detect":
      return limiter.detect();
    default:
      throw new Error(`unknown call ${step.call}`);
  }
}

function kindOf(error) {
  return error instanceof CircuitOpenError ? "circuit_open" : classify(error);
}

/** Compares a call's outcome ({value} or {error}) with `expect`; keeps a lease under `as`. */
function judge(outcome, step, leases, where) {
  const want = step.expect ?? {};
  if (want.raises !== undefined) {
    assert.ok("error" in outcome, `${where}: expected it to raise (${want.raises}), got ${String(outcome.value)}`);
    assert.equal(kindOf(outcome.error), want.raises, `${where}: raised ${outcome.error?.stack}`);
    return;
  }
  if ("error" in outcome) throw outcome.error;
  if (step.as !== undefined) leases.set(step.as, outcome.value);
  const { result, ...fields } = want;
  if (result !== undefined) assert.equal(outcome.value, result, `${where}: result`);
  expectFields(outcome.value, fields, where);
}

const outcomeOf = (promise) =>
  promise.then(
    (value) => ({ value }),
    (error) => ({ error }),
  );

function checkState(limiter, check, where) {
  for (const [name, value] of Object.entries(check)) {
    const got = {
      breaker: () => limiter.breakerState,
      backend: () => limiter.backend ?? null,
      leases_held: () => limiter.leasesHeld,
      cache_size: () => limiter.denialCache.size,
    }[name];
    assert.ok(got !== undefined, `${where}: the runner knows no state ${name}`);
    assert.equal(got(), value, `${where}: ${name}`);
  }
}

async function runLimiter(s, fake) {
  const clock = { now: START_MS };
  const redis = new FakeRedis(fake);
  const slept = { ms: 0 };
  const events = [];
  const limiter = limiterOf(s, redis.client(), clock, slept, events);
  const leases = new Map();
  const started = new Map(); // name -> {active, outcome}
  for (const [i, step] of s.steps.entries()) {
    const where = `step ${i + 1}`;
    if (step.advance_ms !== undefined) {
      clock.now += step.advance_ms;
    } else if (step.check !== undefined) {
      checkState(limiter, step.check, where);
    } else if (step.inspect !== undefined) {
      expectFields(leases.get(step.inspect), step.expect, where);
    } else if (step.call !== undefined) {
      const active = redis.begin(step, where);
      const outcome = await outcomeOf(invoke(limiter, step, leases, slept));
      redis.end(active, where);
      judge(outcome, step, leases, where);
      checkEvent(events, step, where);
    } else if (step.start !== undefined) {
      assert.equal(step.event, undefined, `${where}: a started call's event is not compared`);
      const call = { ...step, call: step.start };
      const active = redis.begin(call, step.as);
      started.set(step.as, { active, call, outcome: outcomeOf(invoke(limiter, call, leases, slept)) });
      await settle(redis);
    } else if (step.resume !== undefined) {
      const run = started.get(step.resume);
      for (const release of run.active.held.splice(0)) release();
      const outcome = await run.outcome;
      redis.end(run.active, where);
      judge(outcome, { ...run.call, expect: step.expect }, leases, where);
      events.splice(0);
    } else if (step.burst !== undefined) {
      const active = redis.begin(step, where, true);
      const before = redis.sent.length;
      const outcomes = step.burst.map((call) => outcomeOf(invoke(limiter, call, leases, slept)));
      await settle(redis);
      for (const release of active.held.splice(0)) release();
      const all = await Promise.all(outcomes);
      assert.ok(!step.burst.some((c) => c.event !== undefined), `${where}: a burst's events are not compared`);
      events.splice(0);
      redis.end(active, where);
      for (const [j, o] of all.entries()) {
        judge(o, { ...step.burst[j], expect: step.expect_each }, leases, `${where}, call ${j + 1}`);
      }
      const sent = redis.sent.slice(before);
      for (const [command, n] of Object.entries(step.counts ?? {})) {
        const count = sent.filter((text) => matches(command, text, new Map(), false)).length;
        assert.equal(count, n, `${where}: ${command} sent ${count} times: ${sent.join(", ")}`);
      }
    } else {
      throw new Error(`${where}: unknown step ${JSON.stringify(step)}`);
    }
  }
}
