// make bench-node: the Node client's own overhead per call, its denial
// cache, and the peers a Node team would compare it with
// (rate-limiter-flexible's RateLimiterRedis, express-rate-limit's
// rate-limit-redis store), all on one Redis 7.0 with the module, with
// ioredis, in interleaved rounds; medians and ratios from this one run.
// Writes the section between the node-bench markers of docs/benchmarks.md
// and of clients/node/README.md. Never part of the tests.
//
//   node bench.mjs --module PATH --report docs/benchmarks.md --readme clients/node/README.md

import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import Redis from "ioredis";
import { RedisStore } from "rate-limit-redis";
import { RateLimiterRedis } from "rate-limiter-flexible";
import { Bucket, Limiter } from "redis-tokenbucket";

const arg = (name) => process.argv[process.argv.indexOf(name) + 1];
const ROUNDS = 9;
const CALLS = 2000;
const CONCURRENT = 50;

async function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const port = await freePort();
const dir = mkdtempSync(join(tmpdir(), "tb-node-bench-"));
const server = spawn(
  "/usr/bin/redis-server",
  ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--dir", dir, "--loadmodule", arg("--module")],
  { stdio: "ignore" },
);
process.on("exit", () => server.kill("SIGKILL"));
const redis = new Redis({ port });
redis.on("error", () => {}); // until the server is up
for (let i = 0; i < 100; i++) {
  try {
    await redis.ping();
    break;
  } catch {
    await sleep(50);
  }
}
const admin = new Redis({ port });
const version = (await admin.info("server")).match(/redis_version:(\S+)/)[1];

// Generous limits: every call is admitted (denials are measured apart).
const BIG = new Bucket({ max: 1e9, rate: 1e6 });
const lim = new Limiter(redis);
const limFunctions = new Limiter(redis, { backend: "functions" });
await lim.consume("warm", BIG);
await limFunctions.consume("warm", BIG);
const flexible = new RateLimiterRedis({ storeClient: redis, points: 1e9, duration: 1000, keyPrefix: "rlflx" });
const store = new RedisStore({ sendCommand: (...args) => redis.call(...args), prefix: "rl:rlr:" });
store.init({ windowMs: 1_000_000 });

let n = 0;
const key = () => `rl:bench:${n++ % 1000}`;

// A stub client: replies at once, to measure the client's own work.
const stub = {
  status: "ready",
  call: () => Promise.resolve([1, 9, 0, 1000]),
};
const limStub = new Limiter(stub, { backend: "module" });

const CASES = {
  "raw TB.CONSUME": () => redis.call("TB.CONSUME", key(), "1000000000", "1000000", "1"),
  "Limiter.consume (module)": () => lim.consume(key(), BIG),
  "raw FCALL tb_consume": () => redis.call("FCALL", "tb_consume", "1", key(), "1000000000", "1000000", "1"),
  "Limiter.consume (functions)": () => limFunctions.consume(key(), BIG),
  "client work on a stub": () => limStub.consume(key(), BIG),
  "rate-limiter-flexible RateLimiterRedis": () => flexible.consume(key(), 1),
  "express-rate-limit + rate-limit-redis": () => store.increment(key()),
};

async function sequential(fn, calls = CALLS) {
  const t0 = performance.now();
  for (let i = 0; i < calls; i++) await fn();
  return ((performance.now() - t0) * 1000) / calls; // µs per call
}

async function concurrent(fn, calls = CALLS * 2) {
  const t0 = performance.now();
  let left = calls;
  await Promise.all(
    Array.from({ length: CONCURRENT }, async () => {
      while (left-- > 0) await fn();
    }),
  );
  return (calls / (performance.now() - t0)) * 1000; // decisions/s
}

async function serverCost(fn, calls = CALLS) {
  await admin.call("CONFIG", "RESETSTAT");
  for (let i = 0; i < calls; i++) await fn();
  const info = await admin.info("commandstats");
  let commands = 0;
  let usec = 0;
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    if (m[1] === "config" || m[1] === "info") continue;
    commands += Number(m[2]);
    usec += Number(m[3]);
  }
  return { commands: commands / calls, usec: usec / calls };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const seq = Object.fromEntries(Object.keys(CASES).map((k) => [k, []]));
const conc = Object.fromEntries(Object.keys(CASES).map((k) => [k, []]));
for (let round = 0; round < ROUNDS; round++) {
  for (const [name, fn] of Object.entries(CASES)) {
    seq[name].push(await sequential(fn));
    if (name !== "client work on a stub") conc[name].push(await concurrent(fn));
  }
}
const cost = {};
for (const name of [
  "Limiter.consume (module)",
  "Limiter.consume (functions)",
  "rate-limiter-flexible RateLimiterRedis",
  "express-rate-limit + rate-limit-redis",
]) {
  cost[name] = await serverCost(CASES[name]);
}

// A client in a retry loop on a denied key.
const small = new Bucket({ max: 1, rate: 0.001 });
const cached = new Limiter(redis, { denialCache: 10_000 });
const loopFlexible = new RateLimiterRedis({ storeClient: redis, points: 1, duration: 1000, keyPrefix: "rlflx-loop" });
const retry = {
  "Limiter, denial cache off": () => lim.consume("rl:hot:a", small),
  "Limiter, denial cache on": () => cached.consume("rl:hot:b", small),
  "rate-limiter-flexible": () => loopFlexible.consume("hot", 1).catch(() => {}),
  "rate-limit-redis": () => store.increment("hot"),
};
const loop = {};
for (const [name, fn] of Object.entries(retry)) {
  await fn();
  await admin.call("CONFIG", "RESETSTAT");
  const us = await sequential(fn, 20_000);
  const info = await admin.info("commandstats");
  const total = [...info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)]
    .filter((m) => m[1] !== "config" && m[1] !== "info")
    .reduce((a, m) => a + Number(m[2]), 0);
  loop[name] = { perSecond: 1e6 / us, commands: total };
}

const f = (x, d = 1) => x.toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d });
const k = (x) => `${f(x / 1000, 1)}k`;
const own = median(seq["Limiter.consume (module)"]);
const ours = 1e6 / own;
const lines = [
  `Redis ${version} with the module on loopback, Node ${process.version}, ioredis 5.9.2, rate-limiter-flexible 11.4.0, express-rate-limit 8.7.5 + rate-limit-redis 6.0.1; medians of ${ROUNDS} interleaved rounds of ${CALLS.toLocaleString("en-US")} calls (sequential awaits) and ${(CALLS * 2).toLocaleString("en-US")} calls (${CONCURRENT} in flight); 2 shared cores, so absolute figures move between runs, ratios less.`,
  "",
  "The client's own cost per admitted call (µs):",
  "",
  "| backend | raw `call` | `Limiter.consume` | overhead |",
  "|---|---:|---:|---:|",
  `| module | ${f(median(seq["raw TB.CONSUME"]))} | ${f(own)} | ${f(own - median(seq["raw TB.CONSUME"]))} |`,
  `| functions | ${f(median(seq["raw FCALL tb_consume"]))} | ${f(median(seq["Limiter.consume (functions)"]))} | ${f(median(seq["Limiter.consume (functions)"]) - median(seq["raw FCALL tb_consume"]))} |`,
  "",
  `The client's own work, no I/O (a stub client replies at once): ${f(median(seq["client work on a stub"]), 2)} µs per call (checks, the command, the deadline's timer, the Decision).`,
  "",
  "The peers, one key pattern and loop (ratio: this package's decisions/s over the peer's):",
  "",
  "| case | redis-tokenbucket (module) | rate-limiter-flexible `RateLimiterRedis` | express-rate-limit + rate-limit-redis |",
  "|---|---:|---:|---:|",
  `| decisions/s, sequential | ${k(ours)} | ${k(1e6 / median(seq["rate-limiter-flexible RateLimiterRedis"]))} (${f(ours / (1e6 / median(seq["rate-limiter-flexible RateLimiterRedis"])), 2)}x) | ${k(1e6 / median(seq["express-rate-limit + rate-limit-redis"]))} (${f(ours / (1e6 / median(seq["express-rate-limit + rate-limit-redis"])), 2)}x) |`,
  `| decisions/s, ${CONCURRENT} in flight | ${k(median(conc["Limiter.consume (module)"]))} | ${k(median(conc["rate-limiter-flexible RateLimiterRedis"]))} (${f(median(conc["Limiter.consume (module)"]) / median(conc["rate-limiter-flexible RateLimiterRedis"]), 2)}x) | ${k(median(conc["express-rate-limit + rate-limit-redis"]))} (${f(median(conc["Limiter.consume (module)"]) / median(conc["express-rate-limit + rate-limit-redis"]), 2)}x) |`,
  `| server µs per decision (INFO commandstats) | ${f(cost["Limiter.consume (module)"].usec, 2)} (Lua library: ${f(cost["Limiter.consume (functions)"].usec, 2)}) | ${f(cost["rate-limiter-flexible RateLimiterRedis"].usec, 2)} | ${f(cost["express-rate-limit + rate-limit-redis"].usec, 2)} |`,
  `| commands per decision (those a script runs counted too) | ${f(cost["Limiter.consume (module)"].commands, 1)} | ${f(cost["rate-limiter-flexible RateLimiterRedis"].commands, 1)} | ${f(cost["express-rate-limit + rate-limit-redis"].commands, 1)} |`,
  `| one client in a retry loop on a denied key, 20,000 tries | ${k(loop["Limiter, denial cache on"].perSecond)}/s, ${loop["Limiter, denial cache on"].commands} commands (denial cache; off: ${k(loop["Limiter, denial cache off"].perSecond)}/s, ${loop["Limiter, denial cache off"].commands.toLocaleString("en-US")} commands) | ${k(loop["rate-limiter-flexible"].perSecond)}/s, ${loop["rate-limiter-flexible"].commands.toLocaleString("en-US")} commands | ${k(loop["rate-limit-redis"].perSecond)}/s, ${loop["rate-limit-redis"].commands.toLocaleString("en-US")} commands |`,
  "",
  "Server µs sums INFO commandstats over every command, so a script's time counts once for EVALSHA and again for the commands it runs; the module's is one command.",
  "",
  "Semantics differ: rate-limiter-flexible here is a fixed window (points per duration), rate-limit-redis a fixed window counter; this package is a token bucket (a smooth refill, no burst at the window's edge). @upstash/ratelimit speaks HTTP to Upstash's REST API, not the Redis protocol, so it can't run against this server and is not measured.",
];
/**
 * Prose lines over 100 characters wrapped at 100, as bench/doc_section.py
 * wraps the Python benches' sections (`make lint` refuses prose over 200);
 * tables are left whole.
 */
function wrapProse(line, width = 100) {
  if (line.length <= width || line.startsWith("|") || line.startsWith("#")) return [line];
  const out = [];
  let current = "";
  for (const word of line.split(" ")) {
    if (current && current.length + 1 + word.length > width) {
      out.push(current);
      current = word;
    } else current = current ? `${current} ${word}` : word;
  }
  if (current) out.push(current);
  return out;
}
const section = lines.flatMap((line) => wrapProse(line)).join("\n");
console.log(section);

function splice(path, begin, end, heading) {
  let text = readFileSync(path, "utf8");
  const block = `${begin}\n${section}\n${end}`;
  if (text.includes(begin)) text = text.replace(new RegExp(`${begin}[\\s\\S]*?${end}`), () => block);
  else text = `${text.trimEnd()}\n\n${heading}${block}\n`;
  writeFileSync(path, text);
}
if (arg("--report")) {
  splice(
    arg("--report"),
    "<!-- node-bench:begin -->",
    "<!-- node-bench:end -->",
    "## The Node client (`make bench-node`)\n\n`clients/node/bench/bench.mjs`: the client's overhead per call, the denial cache's effect, and the peers (the Python client's table, for Node).\n\n",
  );
}
if (arg("--readme")) splice(arg("--readme"), "<!-- bench:begin -->", "<!-- bench:end -->", "");
redis.disconnect();
admin.disconnect();
process.exit(0);
