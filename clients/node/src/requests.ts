// Requests: every call's arguments checked before anything is sent (in
// the module's order, with its messages), made into a Job, and the Job's
// plan, the commands it sends and what it makes of their replies, the
// denial cache's part included. How a Job runs, and what it answers when
// Redis can't, is policy.ts. The Python package's twin is _requests.py.

import type { Arg, Connection } from "./adapters.js";
import { type Amount, Bucket, checkCost, checkDelta, InvalidArgument, type Key, refusal } from "./bucket.js";
import type { CacheOp, DenialCache, Ticket } from "./cache.js";
import { MAX_GROUPS, MAX_WAIT_MS } from "./contract.js";
import { Decision, MultiDecision } from "./decision.js";
import type { Engine, IO } from "./engine.js";
import { CrossSlotError } from "./errors.js";
import type { DecisionEvent } from "./events.js";
import { keyId } from "./keys.js";
import { Concurrency, checkId, Lease, newId } from "./lease.js";
import { requireWasmoon } from "./local.js";
import { checkQuotaCost, Quota, type Rule } from "./quota.js";
import { type Group, type LeaseHead, type LeaseOp, manyOp, ruleOp } from "./scripts.js";

export type OnError = "raise" | "open" | "closed" | "local";
export const ON_ERROR: readonly OnError[] = ["raise", "open", "closed", "local"];

export interface CallOptions {
  /** This call's budget in ms (default: the limiter's). */
  timeoutMs?: number;
  /** This call's policy (default: the limiter's). */
  onError?: OnError;
}

/** Options of consume and peek: a call's, and a reservation's wait. */
export interface ConsumeOptions extends CallOptions {
  /**
   * A reservation (`WAIT max_ms`, buckets only): a request the bucket can't
   * pay now is admitted if its turn comes within this many ms (an integer,
   * 0 to 1e14), the bucket going into debt; its `delayMs` is how long to
   * wait before going ahead. Such a call neither reads nor feeds the denial cache.
   */
  maxWaitMs?: number;
  /** consume only: this call in shadow mode (default: the limiter's `shadow`). */
  shadow?: boolean;
  /**
   * consume only, buckets only: a penalty. A denial charges the bucket into
   * debt (TB.ADJUST) so the caller is refused for this many ms; at most
   * `1000 * (max + cost) / rate`, the floor of `-max`.
   */
  blockMs?: number;
}

/** Options of wait: a call's, and the longest wait it may be given (required). */
export interface WaitOptions extends CallOptions {
  maxWaitMs: number;
}

export interface ManyOptions extends CallOptions {
  /**
   * On a Cluster with keys in several slots: undefined (default) charges
   * bucket by bucket and refunds on a denial; true throws CrossSlotError
   * (strict); false always goes bucket by bucket.
   */
  atomic?: boolean;
  /**
   * A reservation of the buckets' tokens (TB.CHARGE ... WAIT max_ms), as
   * consume's: admitted, the MultiDecision's `delayMs` is the wait.
   */
  maxWaitMs?: number;
  /** This call in shadow mode (default: the limiter's `shadow`). */
  shadow?: boolean;
}

/** `[key, rule]` or `[key, rule, cost]`: a Bucket or a Quota. */
export type GroupIn = readonly [Key, Rule] | readonly [Key, Rule, Amount];

export interface AcquireOptions extends CallOptions {
  /** The slots this lease takes, `1 <= weight <= limit` (default 1). */
  weight?: number;
  /**
   * `[key, rule, cost]` groups (a Bucket or a Quota) charged in the same
   * decision, all or nothing (TB.ACQUIRE's BUCKET and QUOTA clauses). On
   * a Cluster their keys must share the lease key's hash slot.
   */
  buckets?: Iterable<GroupIn>;
  /** The lease's id, 1 to 256 bytes (default: a new UUID). Acquiring a live id again renews it. */
  id?: Key;
}

/** Options of renew, release, inFlight and reset: they decide nothing, so no policy applies. */
export interface UpkeepOptions {
  /** This call's budget in ms (default: the limiter's). */
  timeoutMs?: number;
}

export type OneOp = "consume" | "peek" | "adjust";

/** What a Job is, by the name its decision event and log line give it. */
export type JobOp = DecisionEvent["op"] | "detect" | "renew" | "release" | "inflight" | "reset";

/** A lease operation as sent: its key, the lease, and what goes before the buckets. */
export interface LeaseCall {
  readonly op: LeaseOp;
  readonly id: string; // keyId of the lease key
  readonly head: LeaseHead;
  readonly concurrency: Concurrency | undefined; // undefined for inflight
  readonly leaseId: Key;
  readonly weight: number;
}

/**
 * One call, ready to run: its plan, or `done` when it needs no round trip
 * (a cached denial); its budget and policy; and the request, for the
 * answers without Redis, the log line and the decision event. `source`
 * names who answered when it was not the backend: "local" (the in-process
 * buckets) or "" (the policy, a shed).
 */
export interface Job<T> {
  readonly op: JobOp;
  readonly groups: readonly Group[];
  readonly lease?: LeaseCall;
  readonly each: boolean; // bucket by bucket (consumeMany across slots)
  /** consumeMany's `WAIT max_ms` (TB.CHARGE). */
  readonly wait?: readonly string[];
  readonly timeoutMs: number | null;
  readonly onError: OnError;
  readonly plan: (io: IO) => Promise<T>;
  readonly done?: T;
  source?: string;
}

/** What the requests need of the limiter: its backend, cache, connection and defaults. */
export interface Context {
  readonly engine: Engine;
  readonly cache: DenialCache | undefined;
  readonly conn: Connection;
  readonly timeoutMs: number | null;
  readonly onError: OnError;
}

// ---- jobs ------------------------------------------------------------------------------

export function oneJob(
  ctx: Context,
  op: OneOp,
  key: Key,
  bucket: Rule,
  amount: Amount,
  options: ConsumeOptions = {},
): Job<Decision> {
  checkRule(bucket);
  const quota = bucket instanceof Quota;
  let value: number;
  if (op === "adjust") value = checkDelta(amount);
  else value = quota ? checkQuotaCost(amount, bucket) : checkCost(amount, bucket);
  const wait = options.maxWaitMs === undefined ? undefined : checkMaxWait(options.maxWaitMs, op, bucket);
  const tail: string[] = [...(quota ? bucket.tail : []), ...(wait === undefined ? [] : ["WAIT", String(wait)])];
  const group: Group = { key, id: keyId(key), bucket, amount: value, ...(tail.length > 0 ? { tail } : {}) };
  const reserves = wait !== undefined;
  const job: Job<Decision> = {
    op,
    groups: [group],
    each: false,
    ...callOptions(ctx, options),
    plan: (io) => planOne(reserves ? undefined : ctx.cache, ctx, op, group, io),
  };
  // A plain denial says nothing of a reservation, which may be admitted.
  if (ctx.cache === undefined || op === "adjust" || reserves) return job;
  const hit = ctx.cache.lookup([group.id], [bucket], [value]);
  return hit === undefined ? job : { ...job, done: hit.decisions[0] as Decision };
}

export function manyJob(ctx: Context, given: Iterable<GroupIn>, options: ManyOptions): Job<MultiDecision> {
  // The module's order: the group count, each group left to right, then
  // duplicate keys; the first error wins.
  const list = [...given];
  if (list.length === 0) throw new InvalidArgument("groups", "consumeMany needs at least one [key, bucket, cost]");
  const groups = checkGroups(list);
  checkDuplicates(groups);
  const wait = options.maxWaitMs === undefined ? undefined : ["WAIT", String(checkWait(options.maxWaitMs))];
  const conn = ctx.conn;
  const split = conn.cluster && groups.length > 1 && new Set(groups.map((g) => conn.slot(g.id))).size > 1;
  if (split && options.atomic === true) {
    const slots = groups.map((g) => `${JSON.stringify(g.id)}: ${conn.slot(g.id)}`).join(", ");
    throw new CrossSlotError(
      `atomic consumeMany needs every key in one Cluster hash slot, got ${slots}; ` +
        "put the shared part in a hash tag (hashTagged) or leave atomic unset",
    );
  }
  const each = split || options.atomic === false;
  // A reservation is kept out of the denial cache, both ways.
  const cache = wait === undefined ? ctx.cache : undefined;
  const job: Job<MultiDecision> = {
    op: "consume_many",
    groups,
    each,
    ...(wait === undefined ? {} : { wait }),
    ...callOptions(ctx, options),
    plan: (io) => planMany({ ...ctx, cache }, groups, each, io, wait),
  };
  if (cache === undefined) return job;
  const hit = cache.lookup(
    groups.map((g) => g.id),
    groups.map((g) => g.bucket),
    groups.map((g) => g.amount),
  );
  if (hit === undefined) return job;
  return { ...job, done: new MultiDecision(false, hit.retryAfterMs, hit.decisions, { atomic: !each, cached: true }) };
}

export function acquireJob(ctx: Context, key: Key, concurrency: Concurrency, options: AcquireOptions): Job<Lease> {
  // The module's order: the id, the weight, the rules (their count, each
  // left to right), a rule on the lease key, duplicates.
  const id = keyId(key);
  checkConcurrency(concurrency);
  const leaseId = options.id === undefined ? newId() : checkId(options.id);
  const weight = concurrency.checkWeight(options.weight ?? 1);
  const groups = checkGroups([...(options.buckets ?? [])]);
  checkDuplicates(groups, id);
  const conn = ctx.conn;
  if (conn.cluster && groups.length > 0) {
    const ids = [id, ...groups.map((g) => g.id)];
    if (new Set(ids.map((k) => conn.slot(k))).size > 1) {
      const where = ids.map((k) => `${JSON.stringify(k)}: ${conn.slot(k)}`);
      throw new CrossSlotError(
        `acquire needs the lease key and its rules' keys in one Cluster hash slot, got ${where.join(", ")}; ` +
          "put the shared part in a hash tag (hashTagged)",
      );
    }
  }
  const head: Arg[] = [String(concurrency.limit), String(concurrency.leaseMs), leaseId, String(weight)];
  const call: LeaseCall = { op: "acquire", id, head: { key, head }, concurrency, leaseId, weight };
  return {
    op: "acquire",
    groups,
    lease: call,
    each: false,
    ...callOptions(ctx, options),
    plan: (io) => planAcquire(ctx, call, groups, io),
  };
}

/** A renewal or a release of a lease Redis holds (limiter.ts answers for the others). */
export function upkeepJob(ctx: Context, op: "renew" | "release", lease: Lease, options: UpkeepOptions): Job<boolean> {
  const call = leaseCall(op, lease);
  const plan =
    op === "renew"
      ? async (io: IO) => {
          const [renewed, expiresInMs] = pair(await ctx.engine.call("renew", [], io, call.head));
          return renewedOrLost(lease, renewed === 1, expiresInMs);
        }
      : async (io: IO) => {
          const [released] = pair(await ctx.engine.call("release", [], io, call.head));
          lease.released = true;
          return released === 1;
        };
  return noPolicyJob(ctx, op, call, options, plan);
}

export function inflightJob(ctx: Context, key: Key, options: UpkeepOptions): Job<number> {
  const call: LeaseCall = {
    op: "inflight",
    id: keyId(key),
    head: { key, head: [] },
    concurrency: undefined,
    leaseId: "",
    weight: 0,
  };
  return noPolicyJob(ctx, "inflight", call, options, async (io) => {
    const reply = await ctx.engine.call("inflight", [], io, call.head);
    if (typeof reply !== "number" && typeof reply !== "string") {
      throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
    }
    return Number(reply);
  });
}

/** DEL of a bucket's key: it is full again; its cached denials are dropped. */
export function resetJob(ctx: Context, key: Key, options: UpkeepOptions): Job<boolean> {
  const id = keyId(key);
  return {
    op: "reset",
    groups: [],
    each: false,
    timeoutMs: upkeepTimeout(ctx, options),
    onError: "raise",
    plan: (io) =>
      ticketed(ctx.cache, "reset", [id], async () => {
        // No key is a full bucket. A cluster client routes DEL by its key.
        const deleted = await io.send(["DEL", key], key, false);
        return { result: Number(deleted) === 1, allowed: true, retryAfterMs: 0, decisions: [] };
      }),
  };
}

/** A read-only TB.PEEK of `probeKey`, which finds the backend (readiness checks). */
export function detectJob(ctx: Context, probeKey: Key, options: { timeoutMs?: number }): Job<string> {
  const group: Group = { key: probeKey, id: keyId(probeKey), bucket: PROBE_BUCKET, amount: 1 };
  return {
    op: "detect",
    groups: [group],
    each: false,
    timeoutMs: upkeepTimeout(ctx, options),
    onError: "raise",
    plan: async (io) => {
      await ctx.engine.call("peek", [group], io);
      // The Lua library can't say that the server may evict its keys, as
      // the module does: the readiness probe looks, once.
      const backend = ctx.engine.backend;
      if ((backend === "functions" || backend === "eval") && !ctx.engine.memoryChecked) {
        await ctx.engine.checkMemory(io);
      }
      return backend as string;
    },
  };
}

const PROBE_BUCKET = new Bucket({ max: 1, rate: 1 });

/**
 * The best-effort release of an acquire that got no answer: it may have
 * taken its slot all the same (a timeout after the write, a connection
 * lost with the command on it), and only this process knows the id.
 */
export function releaseUnanswered(ctx: Context, call: LeaseCall, io: IO): Promise<unknown> {
  return ctx.engine.call("release", [], io, { key: call.head.key, head: [call.leaseId] });
}

function noPolicyJob<T>(
  ctx: Context,
  op: "renew" | "release" | "inflight",
  call: LeaseCall,
  options: UpkeepOptions,
  plan: (io: IO) => Promise<T>,
): Job<T> {
  return { op, groups: [], lease: call, each: false, timeoutMs: upkeepTimeout(ctx, options), onError: "raise", plan };
}

function callOptions(ctx: Context, options: CallOptions): { timeoutMs: number | null; onError: OnError } {
  const onError = options.onError === undefined ? ctx.onError : checkOnError(options.onError);
  if (onError === "local") requireWasmoon();
  return {
    timeoutMs: options.timeoutMs === undefined ? ctx.timeoutMs : checkTimeout(options.timeoutMs, false),
    onError,
  };
}

function upkeepTimeout(ctx: Context, options: { timeoutMs?: number }): number | null {
  return options.timeoutMs === undefined ? ctx.timeoutMs : checkTimeout(options.timeoutMs, false);
}

// ---- plans -----------------------------------------------------------------------------

interface Answered<T> {
  result: T;
  allowed: boolean;
  retryAfterMs: number;
  decisions: readonly Decision[];
}

/**
 * Runs a request's commands between the cache's `sent` (read before
 * anything goes out: a denial's deadline counts from here) and its
 * `answered`, or `failed` if no answer came (an error, a reply of the
 * wrong shape).
 */
async function ticketed<T>(
  cache: DenialCache | undefined,
  op: CacheOp,
  ids: readonly string[],
  work: () => Promise<Answered<T>>,
): Promise<T> {
  if (cache === undefined || ids.length === 0) return (await work()).result;
  const ticket: Ticket = cache.sent(op, ids);
  let answer: Answered<T>;
  try {
    answer = await work();
  } catch (error) {
    cache.failed(ticket);
    throw error;
  }
  cache.answered(ticket, answer.allowed, answer.retryAfterMs, answer.decisions);
  return answer.result;
}

/** One rule's call; `cache` is undefined for a reservation, kept out of the denial cache. */
function planOne(cache: DenialCache | undefined, ctx: Context, op: OneOp, g: Group, io: IO): Promise<Decision> {
  return ticketed(cache, op, [g.id], async () => {
    const reply = await ctx.engine.call(ruleOp(op, g.bucket), [g], io);
    const d =
      op === "adjust"
        ? Decision.fromAdjust(reply, g.key, g.bucket, g.amount)
        : Decision.fromReply(reply, g.key, g.bucket, g.amount);
    return { result: d, allowed: d.allowed, retryAfterMs: d.retryAfterMs, decisions: [d] };
  });
}

function planMany(
  ctx: Context,
  groups: readonly Group[],
  each: boolean,
  io: IO,
  wait?: readonly string[],
): Promise<MultiDecision> {
  const ids = groups.map((g) => g.id);
  const byKey = () =>
    ticketed(ctx.cache, "each", ids, async () => {
      const m = await planEach(ctx.engine, groups, io, wait);
      return { result: m, allowed: m.allowed, retryAfterMs: m.retryAfterMs, decisions: m.decisions };
    });
  if (each) return byKey();
  const atomic = ticketed(ctx.cache, "mconsume", ids, async () => {
    // TB.CHARGE with a quota among the rules, or a wait.
    const reply = await ctx.engine.call(manyOp(groups, wait), groups, io, undefined, wait);
    if (!Array.isArray(reply) || reply.length !== groups.length + 2) {
      throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
    }
    const decisions = groups.map((g, i) => Decision.fromReply(reply[i + 2], g.key, g.bucket, g.amount));
    const m = new MultiDecision(Number(reply[0]) === 1, Number(reply[1]), decisions);
    return { result: m, allowed: m.allowed, retryAfterMs: m.retryAfterMs, decisions: m.decisions };
  });
  // A slot moving: nothing ran, and the keys are not all on one node until
  // it has moved. Key by key meanwhile (the failed ticket forgot the keys).
  return atomic.catch((error: unknown) => {
    if (!migrating(error)) throw error;
    return byKey();
  });
}

/**
 * A multi-key call refused because its slot is moving (TRYAGAIN, or ASK,
 * before anything ran), directly or after the client followed redirects
 * to its limit (ioredis's "Too many Cluster redirections").
 */
export function migrating(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const text = error.message;
  if (/^(TRYAGAIN|ASK )/.test(text)) return true;
  return text.startsWith("Too many Cluster redirections") && /TRYAGAIN|ASK /.test(text);
}

/**
 * All-or-nothing without TB.MCONSUME, for keys in several Cluster slots:
 * charge bucket by bucket in order; when one denies, refund those already
 * charged and peek at the rest, so the answer is the one TB.MCONSUME
 * would give. Not atomic: until the refunds land, the refunded tokens are
 * missing and a concurrent request can be denied for it; and if Redis
 * fails between a charge and its refund, the charge stays.
 */
async function planEach(
  engine: Engine,
  groups: readonly Group[],
  io: IO,
  wait?: readonly string[],
): Promise<MultiDecision> {
  const charged: Decision[] = [];
  for (const [i, g] of groups.entries()) {
    // A wait reserves a bucket's tokens; a quota never waits.
    const own = wait !== undefined && g.bucket instanceof Bucket ? { ...g, tail: [...(g.tail ?? []), ...wait] } : g;
    const reply = await engine.call(ruleOp("consume", g.bucket), [own], io);
    const decision = Decision.fromReply(reply, g.key, g.bucket, g.amount);
    if (decision.allowed) {
      charged.push(decision);
      continue;
    }
    const refunded = await refund(engine, charged, groups, io);
    const rest: Decision[] = [];
    for (const r of groups.slice(i + 1)) {
      rest.push(Decision.fromReply(await engine.call(ruleOp("peek", r.bucket), [r], io), r.key, r.bucket, r.amount));
    }
    const decisions = [...refunded, decision, ...rest];
    return new MultiDecision(false, Math.max(...decisions.map((d) => d.retryAfterMs)), decisions, { atomic: false });
  }
  return new MultiDecision(true, Math.max(0, ...charged.map((d) => d.retryAfterMs)), charged, { atomic: false });
}

/**
 * Gives back what a decision key by key charged before a later key denied:
 * each charge (the decisions of `groups`' first keys) refunded with
 * TB.ADJUST, or TB.QADJUST for a quota, its decision what the
 * all-or-nothing call would report.
 */
async function refund(
  engine: Engine,
  charged: readonly Decision[],
  groups: readonly Group[],
  io: IO,
): Promise<Decision[]> {
  const refunded: Decision[] = [];
  for (const [j, c] of charged.entries()) {
    if (c.cost > 0) {
      const back = groups[j] as Group;
      const reply = await engine.call(ruleOp("adjust", back.bucket), [back], io);
      // It could pay on its own, as TB.MCONSUME would report it;
      // ADJUST's retry time (for cost 1) means nothing here.
      refunded.push(Decision.fromReply(reply, c.key, c.bucket, c.cost).with({ retryAfterMs: 0 }));
    } else {
      refunded.push(c);
    }
  }
  return refunded;
}

function planAcquire(ctx: Context, call: LeaseCall, groups: readonly Group[], io: IO): Promise<Lease> {
  // The buckets it charges: their cached denials are forgotten. An
  // acquire's own denial is never cached (a release can free a slot at
  // any time).
  const ids = groups.map((g) => g.id);
  return ticketed(ctx.cache, "acquire", ids, async () => {
    let lease: Lease;
    try {
      lease = leaseFromReply(await ctx.engine.call("acquire", groups, io, call.head), call, groups, false);
    } catch (error) {
      if (!(groups.length > 0 && migrating(error))) throw error;
      lease = await planAcquireEach(ctx.engine, call, groups, io);
    }
    return { result: lease, allowed: lease.acquired, retryAfterMs: lease.retryAfterMs, decisions: lease.decisions };
  });
}

/**
 * An acquire whose rules are in a slot that is moving: the rules charged
 * key by key (all or none, as planEach), then the lease alone, whose
 * being busy gives them back. The answer TB.ACQUIRE would give, but
 * not atomic: a call in between may see the buckets charged for a lease
 * that does not come.
 */
async function planAcquireEach(engine: Engine, call: LeaseCall, groups: readonly Group[], io: IO): Promise<Lease> {
  const many = await planEach(engine, groups, io);
  const fields = {
    id: call.leaseId,
    key: call.head.key,
    concurrency: call.concurrency as Concurrency,
    weight: call.weight,
  };
  if (!many.allowed) {
    // Denied by a bucket: no lease taken; in_use as the key has it.
    const inUse = Number(await engine.call("inflight", [], io, { key: call.head.key, head: [] }));
    return new Lease({
      ...fields,
      acquired: false,
      inUse,
      retryAfterMs: many.retryAfterMs,
      expiresInMs: 0,
      decisions: many.decisions,
      degraded: false,
      held: "none",
    });
  }
  const alone = leaseFromReply(await engine.call("acquire", [], io, call.head), call, [], false);
  // Busy: the rules are given back, and could pay, as TB.ACQUIRE reports them.
  const decisions = alone.acquired ? many.decisions : await refund(engine, many.decisions, groups, io);
  return new Lease({
    ...fields,
    acquired: alone.acquired,
    inUse: alone.inUse,
    retryAfterMs: alone.retryAfterMs,
    expiresInMs: alone.expiresInMs,
    decisions,
    degraded: false,
    held: alone.acquired ? "redis" : "none",
  });
}

// ---- leases ----------------------------------------------------------------------------

export function leaseCall(op: "renew" | "release", lease: Lease): LeaseCall {
  const head: Arg[] = op === "renew" ? [lease.id, String(lease.concurrency.leaseMs)] : [lease.id];
  return {
    op,
    id: keyId(lease.key),
    head: { key: lease.key, head },
    concurrency: lease.concurrency,
    leaseId: lease.id,
    weight: lease.weight,
  };
}

/**
 * A lease from TB.ACQUIRE's reply: the module's, or the in-process
 * library's (`degraded`, decided against `concurrency`, this process's share).
 */
export function leaseFromReply(
  reply: unknown,
  call: LeaseCall,
  groups: readonly Group[],
  degraded: boolean,
  concurrency = call.concurrency as Concurrency,
): Lease {
  if (!Array.isArray(reply) || reply.length !== 4 + groups.length) {
    throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
  }
  const [acquired, inUse, retry, expires] = reply.slice(0, 4).map(Number) as [number, number, number, number];
  const decisions = groups.map((g, i) => {
    const d = Decision.fromReply(reply[4 + i], g.key, g.bucket, g.amount);
    return degraded ? d.with({ degraded: true }) : d;
  });
  return new Lease({
    acquired: acquired === 1,
    inUse,
    retryAfterMs: retry,
    expiresInMs: expires,
    id: call.leaseId,
    key: call.head.key,
    concurrency,
    weight: call.weight,
    decisions,
    degraded,
    held: acquired === 1 ? (degraded ? "local" : "redis") : "none",
  });
}

/** `[a, b]` of integers: TB.RENEW's and TB.RELEASE's replies. */
export function pair(reply: unknown): [number, number] {
  if (!Array.isArray(reply) || reply.length !== 2) {
    throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
  }
  return [Number(reply[0]), Number(reply[1])];
}

/** A renewal's answer: the lease's new time to live, or lost (expired, or released). */
export function renewedOrLost(lease: Lease, renewed: boolean, expiresInMs: number): boolean {
  if (renewed) lease.expiresInMs = expiresInMs;
  else lease.lost = true;
  return renewed;
}

// ---- checks ----------------------------------------------------------------------------

/**
 * Rules given as `[key, rule]` or `[key, rule, cost]`, checked in the
 * module's order: their count, then each left to right.
 */
function checkGroups(list: readonly unknown[]): Group[] {
  if (list.length > MAX_GROUPS) throw refusal("groups", "too_many_groups");
  return list.map((entry, i) => {
    if (!Array.isArray(entry) || entry.length < 2 || entry.length > 3) {
      throw new TypeError(`group ${i + 1}: expected [key, bucket] or [key, bucket, cost]`);
    }
    const [key, rule, cost] = entry as [Key, Rule, Amount | undefined];
    if (rule instanceof Quota) {
      const amount = checkQuotaCost(cost ?? 1, rule, i + 1);
      return { key, id: keyId(key, i + 1), bucket: rule, amount, ...(rule.tail.length > 0 ? { tail: rule.tail } : {}) };
    }
    checkBucket(rule, i + 1);
    return { key, id: keyId(key, i + 1), bucket: rule, amount: checkCost(cost ?? 1, rule as Bucket, i + 1) };
  });
}

/** The module's last checks: a bucket on the lease key (`leaseId`, a keyId), then a key in two groups. */
function checkDuplicates(groups: readonly Group[], leaseId?: string): void {
  if (leaseId !== undefined) {
    const at = groups.findIndex((g) => g.id === leaseId);
    if (at >= 0) throw refusal("buckets", "bucket_is_lease_key", { group: at + 1 });
  }
  const seen = new Map<string, number>();
  groups.forEach((g, i) => {
    const first = seen.get(g.id);
    if (first !== undefined) throw refusal("key", "duplicate_key", { group: i + 1, first });
    seen.set(g.id, i + 1);
  });
}

function checkConcurrency(concurrency: unknown): void {
  if (!(concurrency instanceof Concurrency)) {
    throw new TypeError(`expected a Concurrency, got ${concurrency === null ? "null" : typeof concurrency}`);
  }
}

export function checkLease(lease: unknown): void {
  if (!(lease instanceof Lease)) throw new TypeError("expected a Lease (what acquire returns)");
}

export function checkWork(work: unknown): void {
  if (typeof work !== "function") throw new TypeError("hold and keep take the work as a function of the lease");
}

function checkBucket(bucket: unknown, group?: number): void {
  if (!(bucket instanceof Bucket)) {
    const where = group === undefined ? "" : ` (group ${group})`;
    throw new TypeError(`expected a Bucket${where}, got ${bucket === null ? "null" : typeof bucket}`);
  }
}

function checkRule(rule: unknown): void {
  if (!(rule instanceof Bucket) && !(rule instanceof Quota)) {
    throw new TypeError(`expected a Bucket or a Quota, got ${rule === null ? "null" : typeof rule}`);
  }
}

/** A reservation's wait: an integer of ms, 0 to 1e14, on a bucket's consume or peek. */
export function checkMaxWait(maxWaitMs: unknown, op: OneOp, rule: Rule): number {
  if (op === "adjust") throw new InvalidArgument("maxWaitMs", "maxWaitMs is for consume and peek, not adjust");
  if (rule instanceof Quota) {
    throw new InvalidArgument("maxWaitMs", "maxWaitMs is for a Bucket: a Quota never reserves");
  }
  return checkWait(maxWaitMs);
}

function checkWait(maxWaitMs: unknown): number {
  if (typeof maxWaitMs !== "number" || !Number.isInteger(maxWaitMs)) {
    throw refusal("maxWaitMs", "not_an_integer", { arg: "maxWaitMs" });
  }
  if (maxWaitMs < 0 || maxWaitMs > MAX_WAIT_MS) {
    throw refusal("maxWaitMs", "int_out_of_range", { arg: "maxWaitMs", least: 0, most: MAX_WAIT_MS });
  }
  return maxWaitMs;
}

export function checkTimeout(timeoutMs: unknown, nullable: boolean): number | null {
  if (timeoutMs === null && nullable) return null;
  if (typeof timeoutMs === "number" && timeoutMs > 0 && timeoutMs < 2 ** 31) return timeoutMs;
  throw new RangeError(
    `timeoutMs must be a number of ms > 0${nullable ? ", or null for the client's own timeouts" : ""}, got ${String(timeoutMs)}`,
  );
}

export function checkOnError(onError: unknown): OnError {
  const found = ON_ERROR.find((p) => p === onError);
  if (found === undefined)
    throw new RangeError(`onError must be one of ${ON_ERROR.join(", ")}, got ${String(onError)}`);
  return found;
}
