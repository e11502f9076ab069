// How each operation is spelled on each backend, and the Lua it needs.
//
// The one place that knows the module's commands, the library's function
// names and the EVAL script's calling convention: each function turns an
// operation and its checked (key, bucket, amount) groups into the
// arguments of one Redis command. The replies are the same on every backend.

import { createHash } from "node:crypto";
import { encode, type Key } from "./bucket.js";
import { EVAL_SOURCE, LIBRARY_SOURCE } from "./lua.js";
import { Quota, type Rule } from "./quota.js";

export type BucketOp = "consume" | "peek" | "adjust" | "mconsume";
/** A calendar quota's operations (a Quota's groups). */
export type QuotaOp = "quota" | "qpeek" | "qadjust" | "charge";
export type LeaseOp = "acquire" | "release" | "renew" | "inflight";
export type Op = BucketOp | QuotaOp | LeaseOp;
export type Arg = string | Buffer;

/** What consume, peek and adjust are for a rule: a Quota's are TB.QUOTA, TB.QPEEK and TB.QADJUST. */
export function ruleOp(op: "consume" | "peek" | "adjust", rule: Rule): "consume" | "peek" | "adjust" | QuotaOp {
  if (!(rule instanceof Quota)) return op;
  return op === "consume" ? "quota" : op === "peek" ? "qpeek" : "qadjust";
}

/** The read-only operations: FCALL_RO, and routed as reads. */
export function readOnly(op: Op): boolean {
  return op === "peek" || op === "qpeek" || op === "inflight";
}

/**
 * A lease operation's key and the arguments that come before its buckets:
 * `limit lease_ms id weight` (acquire), `id` (release), `id lease_ms`
 * (renew), none (inflight). Its groups are an acquire's buckets.
 */
export interface LeaseHead {
  readonly key: Key;
  readonly head: readonly Arg[];
}

/** A checked group: key, rule (a bucket or a quota), cost (or delta for adjust). */
export interface Group {
  readonly key: Key;
  /** The key's identity (keys.ts keyId). */
  readonly id: string;
  readonly bucket: Rule;
  readonly amount: number;
  /** What follows the amount of a one-group call: `WAIT ms`, a quota's `OFFSET m`. */
  readonly tail?: readonly string[];
}

// ---- the module ---------------------------------------------------------------

const COMMANDS: Record<Op, string> = {
  consume: "TB.CONSUME",
  peek: "TB.PEEK",
  adjust: "TB.ADJUST",
  mconsume: "TB.MCONSUME",
  acquire: "TB.ACQUIRE",
  release: "TB.RELEASE",
  renew: "TB.RENEW",
  inflight: "TB.INFLIGHT",
  quota: "TB.QUOTA",
  qpeek: "TB.QPEEK",
  qadjust: "TB.QADJUST",
  charge: "TB.CHARGE",
};

/**
 * TB.<OP> key max rate amount [key max rate amount ...]; for a lease
 * operation TB.<OP> key head... [BUCKET bkey max rate cost | QUOTA qkey
 * limit period cost [OFFSET m] ...].
 */
export function moduleArgs(op: Op, groups: readonly Group[], lease?: LeaseHead, wait?: readonly string[]): Arg[] {
  if (lease !== undefined) {
    const args: Arg[] = [COMMANDS[op], lease.key, ...lease.head];
    for (const g of groups) args.push(keyword(g), g.key, ...ruleArgs(g));
    return args;
  }
  if (op === "charge") return [COMMANDS[op], String(groups.length), ...keys(groups), ...limits(groups, op, wait)];
  const args: Arg[] = [COMMANDS[op]];
  for (const g of groups) args.push(g.key, g.bucket.args[0], g.bucket.args[1], encode(g.amount), ...(g.tail ?? []));
  return args;
}

// ---- the Functions library (lua/tb.lua) ---------------------------------------

// FCALL_RO for the read-only one, so it also runs on replicas.
const FUNCTIONS: Record<Op, readonly [string, string]> = {
  consume: ["FCALL", "tb_consume"],
  peek: ["FCALL_RO", "tb_peek"],
  adjust: ["FCALL", "tb_adjust"],
  mconsume: ["FCALL", "tb_mconsume"],
  acquire: ["FCALL", "tb_acquire"],
  release: ["FCALL", "tb_release"],
  renew: ["FCALL", "tb_renew"],
  inflight: ["FCALL_RO", "tb_inflight"],
  quota: ["FCALL", "tb_quota"],
  qpeek: ["FCALL_RO", "tb_qpeek"],
  qadjust: ["FCALL", "tb_qadjust"],
  charge: ["FCALL", "tb_charge"],
};

/**
 * FCALL tb_<op> numkeys key... max rate amount ...; for a lease operation
 * the lease key comes first, then the clause keys, then its head, then
 * the clauses (lua/tb.lua's form, docs/fallback.md; see leaseClauses).
 */
export function fcallArgs(op: Op, groups: readonly Group[], lease?: LeaseHead, wait?: readonly string[]): Arg[] {
  const [command, name] = FUNCTIONS[op];
  if (lease !== undefined) {
    return [
      command,
      name,
      String(1 + groups.length),
      lease.key,
      ...keys(groups),
      ...lease.head,
      ...leaseClauses(groups),
    ];
  }
  return [command, name, String(groups.length), ...keys(groups), ...limits(groups, op, wait)];
}

/** The library's version: FCALL_RO tb_version 0. */
export const VERSION_ARGS: readonly Arg[] = ["FCALL_RO", "tb_version", "0"];

/** FUNCTION LOAD REPLACE <library>: idempotent when gateways race. */
export const LOAD_ARGS: readonly Arg[] = ["FUNCTION", "LOAD", "REPLACE", LIBRARY_SOURCE];

// Lua takes keys and arguments apart: every key first, then one
// `max rate amount` group per key, in the same order.

function keys(groups: readonly Group[]): Key[] {
  return groups.map((g) => g.key);
}

/**
 * Each group's `max rate amount` (a quota's `limit period amount [OFFSET
 * m]`); for TB.CHARGE, `[WAIT max_ms]` first and each a clause, BUCKET or
 * QUOTA before it.
 */
function limits(groups: readonly Group[], op?: Op, wait?: readonly string[]): string[] {
  const out: string[] = op === "charge" ? [...(wait ?? [])] : [];
  for (const g of groups) {
    if (op === "charge") out.push(keyword(g));
    out.push(...ruleArgs(g));
  }
  return out;
}

/** A group's rule and amount: `max rate amount`, a quota's `limit period amount [OFFSET m]`. */
function ruleArgs(g: Group): string[] {
  return [g.bucket.args[0], g.bucket.args[1], encode(g.amount), ...(g.tail ?? [])];
}

/** The keyword of a group's clause in TB.CHARGE and TB.ACQUIRE. */
function keyword(g: Group): "QUOTA" | "BUCKET" {
  return g.bucket instanceof Quota ? "QUOTA" : "BUCKET";
}

/**
 * tb_acquire's clauses: with a quota among them, as tb_charge's; of
 * buckets alone, `max rate cost` each, the form every version of the
 * library reads.
 */
function leaseClauses(groups: readonly Group[]): string[] {
  return groups.some((g) => g.bucket instanceof Quota) ? limits(groups, "charge") : limits(groups);
}

/** consumeMany's operation: TB.CHARGE with a quota among the rules, or a wait; else TB.MCONSUME. */
export function manyOp(groups: readonly Group[], wait?: readonly string[]): "mconsume" | "charge" {
  return wait !== undefined || groups.some((g) => g.bucket instanceof Quota) ? "charge" : "mconsume";
}

// ---- the EVAL script (lua/gen_eval.py) ---------------------------------------

/** The EVAL script and its SHA1. */
export const EVAL_SCRIPT = { source: EVAL_SOURCE, sha: createHash("sha1").update(EVAL_SOURCE).digest("hex") };

/**
 * What follows `EVALSHA <sha>` (or `EVAL <source>`): numkeys key... <op>
 * max rate amount ..., the operation named as in FCALL tb_<op>, then what
 * that function takes (a lease operation: its key first, its head after
 * the operation). Plain EVALSHA for peek and inflight too: EVALSHA_RO
 * needs Redis 7, and Redis 6.2 is what this backend is mostly for.
 */
export function evalArgs(op: Op, groups: readonly Group[], lease?: LeaseHead, wait?: readonly string[]): Arg[] {
  if (lease !== undefined) {
    return [String(1 + groups.length), lease.key, ...keys(groups), op, ...lease.head, ...leaseClauses(groups)];
  }
  return [String(groups.length), ...keys(groups), op, ...limits(groups, op, wait)];
}

export { EVAL_SOURCE, LIBRARY_SOURCE };
