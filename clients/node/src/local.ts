// The bounded fail-open of onError "local": while Redis is failing, each
// process answers from token buckets of its own, with `max` and `rate`
// divided by the number of processes that share the limit, and from
// leases of its own, with a Concurrency's limit divided likewise (at
// least 1).
//
// The arithmetic is not written again here: these buckets and leases run
// the package's own Lua library (the tb.lua that Redis runs as Functions),
// in process, on wasmoon (Lua 5.4 compiled to WebAssembly; an optional
// peer dependency). What this file adds is the part of Redis that library
// touches: eleven commands (TIME, TYPE, HLEN, HGET, HMGET, HGETALL, HSET,
// HDEL, DEL, PEXPIREAT, GET) over a Map, and what Redis's Lua 5.1 has that 5.4
// lacks (numbers that are all doubles, math.frexp and math.ldexp, unpack).
//
// Approximate by design: each process sees only its own traffic, so the
// whole fleet admits about the limit only while load spreads evenly over
// `processes` processes, and a bucket starts full in each process when the
// breaker opens (what a client already spent in Redis is not known here).

import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { Bucket, encode } from "./bucket.js";
import { LimiterError } from "./errors.js";
import { keyId } from "./keys.js";
import { LIBRARY_SOURCE } from "./lua.js";
import { Quota, type Rule } from "./quota.js";
import type { Arg, BucketOp, Group, LeaseOp, Op, QuotaOp } from "./scripts.js";

export const MISSING = 'onError "local" needs wasmoon, an optional peer dependency: npm install wasmoon';

/**
 * This file's path (or file URL), from V8's structured stack trace: the
 * ESM and CommonJS builds compile this one source, and only ESM has
 * import.meta (CommonJS can't even parse it).
 */
function thisFile(): string {
  const prepare = Error.prepareStackTrace;
  try {
    Error.prepareStackTrace = (_error, stack) => stack;
    const stack = new Error().stack as unknown as NodeJS.CallSite[] | undefined;
    return stack?.[0]?.getFileName() ?? join(process.cwd(), "index.js");
  } finally {
    Error.prepareStackTrace = prepare;
  }
}

let found = false;

/**
 * Throws unless wasmoon can be found from here, where `import("wasmoon")`
 * looks for it: a limiter refuses onError "local" when it is built (or a
 * call that asks for it, before anything is sent), not during an outage.
 * Synchronous, so it looks for the package's folder on the resolution path
 * instead of loading it.
 */
export function requireWasmoon(): void {
  if (found) return;
  const paths = createRequire(thisFile()).resolve.paths("wasmoon") ?? [];
  found = paths.some((dir) => existsSync(join(dir, "wasmoon", "package.json")));
  if (!found) throw new LimiterError(MISSING);
}

// Redis's Lua is 5.1, where every number is a double; in 5.4 "10" reads as
// an integer, and the library's arithmetic on integers could overflow
// where 5.1 rounds. So tonumber gives doubles, as 5.1's does. 5.4 also
// dropped math.frexp and math.ldexp, which the library uses for the
// smallest charging cost: exact versions by halving and doubling; and
// 5.1's global unpack is 5.4's table.unpack.
const PRELUDE = `
local raw_tonumber = tonumber
tonumber = function(s, base)
  local v = raw_tonumber(s, base)
  if math.type(v) == 'integer' then return v + 0.0 end
  return v
end
math.frexp = function(x)
  if x == 0 or x ~= x or x == math.huge or x == -math.huge then return x, 0 end
  local m, e = math.abs(x), 0
  while m >= 1 do m = m / 2; e = e + 1 end
  while m < 0.5 do m = m * 2; e = e - 1 end
  if x < 0 then m = -m end
  return m, e
end
math.ldexp = function(m, e) return m * 2.0 ^ e end
unpack = table.unpack
__tb_functions = {}
redis = {
  call = __tb_call,
  pcall = __tb_call,
  error_reply = function(message) return { err = message } end,
  status_reply = function(message) return { ok = message } end,
  register_function = function(f) __tb_functions[f.function_name] = f.callback end,
}
`;

const FUNCTIONS: Record<Op, string> = {
  consume: "tb_consume",
  peek: "tb_peek",
  adjust: "tb_adjust",
  mconsume: "tb_mconsume",
  acquire: "tb_acquire",
  release: "tb_release",
  renew: "tb_renew",
  inflight: "tb_inflight",
  quota: "tb_quota",
  qpeek: "tb_qpeek",
  qadjust: "tb_qadjust",
  charge: "tb_charge",
};

// Sweep out expired buckets after this many writes (buckets also expire
// when next read), so memory follows the live keys.
const SWEEP_EVERY = 4096;

/** A reply error of the library, as Redis would send it. */
export class LocalReplyError extends Error {
  override name = "ReplyError";
}

interface Stored {
  fields: Map<string, string>;
  expiresAt: number | undefined; // ms since the epoch
}

type LuaFunction = (keys: string[], args: string[]) => unknown;

/** Token buckets in this process, run by the package's Lua library. */
export class LocalBuckets {
  private readonly data = new Map<string, Stored>();
  private writes = 0;
  private readonly shares = new Map<Rule, Rule>();

  private constructor(
    readonly processes: number,
    private readonly functions: Record<Op, LuaFunction>,
  ) {}

  /** Starts a Lua VM with the library loaded (wasmoon compiles its WebAssembly once). */
  static async create(processes: number): Promise<LocalBuckets> {
    let wasmoon: { LuaFactory: new () => { createEngine(options?: object): Promise<LuaEngine> } };
    try {
      const name = "wasmoon"; // an optional peer: not resolved at build time
      wasmoon = await import(name);
    } catch (error) {
      throw new LimiterError(MISSING, { cause: error });
    }
    const engine = await new wasmoon.LuaFactory().createEngine({ injectObjects: false, enableProxy: false });
    let self: LocalBuckets | undefined;
    engine.global.set("__tb_call", (command: string, ...args: unknown[]) => {
      if (self === undefined) throw new Error("the local buckets are not ready");
      return self.call(command, args);
    });
    await engine.doString(PRELUDE);
    // The shebang line is Redis's, not Lua's.
    await engine.doString(LIBRARY_SOURCE.replace(/^#![^\n]*\n/, ""));
    const registered = engine.global.get("__tb_functions") as Record<string, LuaFunction>;
    const functions = {} as Record<Op, LuaFunction>;
    for (const [op, name] of Object.entries(FUNCTIONS) as [Op, string][]) {
      const fn = registered[name];
      if (typeof fn !== "function") throw new Error(`the Lua library has no ${name}`);
      functions[op] = fn;
    }
    self = new LocalBuckets(processes, functions);
    return self;
  }

  /** This process's part of a bucket. */
  share(bucket: Rule): Rule {
    if (this.processes === 1) return bucket;
    let part = this.shares.get(bucket);
    if (part === undefined) {
      const n = this.processes;
      part =
        bucket instanceof Quota
          ? new Quota({ limit: bucket.limit / n, period: bucket.period, offset: bucket.offset, name: bucket.name })
          : new Bucket({ max: bucket.max / n, rate: bucket.rate / n, name: bucket.name });
      if (this.shares.size > 4096) this.shares.clear();
      this.shares.set(bucket, part);
    }
    return part;
  }

  /**
   * What FCALL tb_<op> would answer for `groups`, here, on this process's
   * share of each bucket. A reply error is thrown as a LocalReplyError.
   */
  run(op: BucketOp | QuotaOp, groups: readonly Group[], wait?: readonly string[]): unknown {
    const keys = groups.map((g) => g.id);
    // tb_charge: `[WAIT max_ms]`, then a BUCKET or QUOTA clause per key.
    const args: string[] = op === "charge" ? [...(wait ?? [])] : [];
    for (const g of groups) {
      const part = this.share(g.bucket);
      if (op === "charge") args.push(part instanceof Quota ? "QUOTA" : "BUCKET");
      args.push(part.args[0], part.args[1], encode(g.amount), ...(g.tail ?? []));
    }
    return reply(this.functions[op](keys, args));
  }

  /** This process's part of a Concurrency's limit: at least 1. */
  shareOfLimit(concurrency: { readonly limit: number }): number {
    return Math.max(1, Math.floor(concurrency.limit / this.processes));
  }

  /**
   * What FCALL tb_<op> would answer for a lease operation on the key
   * `leaseKey` (its keys.ts keyId), here: an acquire's limit (at least 1) and its
   * buckets are this process's share. `head` is what the operation takes
   * before its buckets (scripts.ts LeaseHead), the lease id first for all
   * but acquire and inflight. A weight above the share is a reply error.
   */
  runLease(op: LeaseOp, leaseKey: string, head: readonly Arg[], groups: readonly Group[]): unknown {
    const args = head.map((a) => keyId(a));
    const at = op === "acquire" ? 2 : 0; // where the lease id is
    if (op !== "inflight") args[at] = localId(args[at] as string);
    if (op === "acquire") args[0] = String(this.shareOfLimit({ limit: Number(args[0]) }));
    for (const g of groups) {
      const part = this.share(g.bucket);
      args.push(part.args[0], part.args[1], encode(g.amount));
    }
    return reply(this.functions[op]([leaseKey, ...groups.map((g) => g.id)], args));
  }

  get size(): number {
    return this.data.size;
  }

  // ---- the Redis the library sees ------------------------------------------

  private call(command: string, args: unknown[]): unknown {
    const name = command.toUpperCase();
    const nowMs = Date.now();
    if (name === "TIME") {
      const us = BigInt(Math.round(performance.timeOrigin * 1000 + performance.now() * 1000));
      return [String(us / 1_000_000n), String(us % 1_000_000n)];
    }
    const key = String(args[0]);
    const entry = this.live(key, nowMs);
    switch (name) {
      case "TYPE":
        return { ok: entry === undefined ? "none" : "hash" };
      case "HLEN":
        return entry === undefined ? 0 : entry.fields.size;
      case "HGET":
        return entry?.fields.get(String(args[1])) ?? false;
      case "HMGET":
        return args.slice(1).map((f) => entry?.fields.get(String(f)) ?? false);
      case "HGETALL":
        return entry === undefined ? [] : [...entry.fields].flat();
      case "HDEL": {
        if (entry === undefined) return 0;
        let gone = 0;
        for (const f of args.slice(1)) if (entry.fields.delete(String(f))) gone++;
        if (entry.fields.size === 0) this.data.delete(key); // Redis deletes a hash left empty
        return gone;
      }
      case "HSET": {
        let target = entry;
        if (target === undefined) {
          target = { fields: new Map(), expiresAt: undefined };
          this.data.set(key, target);
        }
        for (let i = 1; i + 1 < args.length; i += 2) target.fields.set(String(args[i]), String(args[i + 1]));
        this.wrote(nowMs);
        return (args.length - 1) / 2;
      }
      case "PEXPIREAT":
        if (entry === undefined) return 0;
        entry.expiresAt = Number(args[1]);
        return 1;
      case "DEL":
        return this.data.delete(key) ? 1 : 0;
      case "GET":
        return false; // no key here ever holds a string
      default:
        throw new Error(`ERR the local fallback does not run ${command}`);
    }
  }

  private live(key: string, nowMs: number): Stored | undefined {
    const entry = this.data.get(key);
    if (entry?.expiresAt !== undefined && entry.expiresAt <= nowMs) {
      this.data.delete(key);
      return undefined;
    }
    return entry;
  }

  private wrote(nowMs: number): void {
    this.writes++;
    if (this.writes % SWEEP_EVERY !== 0) return;
    for (const [key, entry] of this.data) {
      if (entry.expiresAt !== undefined && entry.expiresAt <= nowMs) this.data.delete(key);
    }
  }
}

/**
 * A lease id as the local library sees it: Lua gets JavaScript strings as
 * UTF-8, so an id of bytes (keys.ts keyId) could grow past the 256 bytes
 * the library takes; such an id goes as its SHA-256.
 */
function localId(id: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the ASCII range, NUL included
  if (/^[\x00-\x7f]*$/.test(id)) return id;
  return createHash("sha256").update(id, "latin1").digest("hex");
}

interface LuaEngine {
  global: { set(name: string, value: unknown): void; get(name: string): unknown };
  doString(source: string): Promise<unknown>;
}

/** A Lua reply as Redis would send it: integers, arrays, errors thrown. */
function reply(value: unknown): unknown {
  if (typeof value === "number") return Math.trunc(value);
  if (Array.isArray(value)) return value.map(reply);
  if (value !== null && typeof value === "object" && "err" in value) {
    throw new LocalReplyError(String((value as { err: unknown }).err));
  }
  return value;
}
