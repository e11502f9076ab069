// The Limiter: the public calls, each made a Job (requests.ts: the checks,
// the commands, the denial cache), run under the failure policy
// (policy.ts: the breaker, shedding, the answers without Redis) on the
// backend the engine finds (engine.ts), and reported to the onDecision
// hook. The Python package's twin is _limiter.py's LimiterBase.

import { type Arg, type Connection, connect, type RedisLike } from "./adapters.js";
import { Breaker, type BreakerState } from "./breaker.js";
import { type Amount, type Key, number } from "./bucket.js";
import { DenialCache } from "./cache.js";
import { Decision, MultiDecision } from "./decision.js";
import { type BackendName, Engine, type IO, type Logger } from "./engine.js";
import { LimiterError } from "./errors.js";
import { DEFAULT_NEAR_LIMIT_RATIO, type DecisionEvent, type Outcome } from "./events.js";
import { Keeper, type LeaseKeeper } from "./hold.js";
import { keyId } from "./keys.js";
import { Busy, type Concurrency, Lease } from "./lease.js";
import { requireWasmoon } from "./local.js";
import { checkBlock, penalized, penalty } from "./penalty.js";
import { FailurePolicy } from "./policy.js";
import type { Rule } from "./quota.js";
import { checkWaitReplicas, checkWaitTimeout, ReplicaWait } from "./replicas.js";
import {
  type AcquireOptions,
  acquireJob,
  type CallOptions,
  type ConsumeOptions,
  type Context,
  checkLease,
  checkMaxWait,
  checkOnError,
  checkTimeout,
  checkWork,
  detectJob,
  type GroupIn,
  inflightJob,
  type Job,
  type LeaseCall,
  leaseCall,
  type ManyOptions,
  manyJob,
  type OnError,
  oneJob,
  pair,
  renewedOrLost,
  resetJob,
  type UpkeepOptions,
  upkeepJob,
  type WaitOptions,
} from "./requests.js";
import { bounded } from "./transport.js";

export {
  type AcquireOptions,
  type CallOptions,
  type ConsumeOptions,
  type GroupIn,
  type ManyOptions,
  ON_ERROR,
  type OnError,
  type UpkeepOptions,
  type WaitOptions,
} from "./requests.js";

/** The limiter's budget for Redis to answer a command, from when it is written (ms). */
export const DEFAULT_TIMEOUT_MS = 100;
// While the backend is unknown (the first calls, or after a reply said it
// is gone), a call may load the Lua library, which Redis compiles: many
// first requests at once can keep it busy past a request-path budget.
// Such calls get at least this budget (ms).
export const DETECT_TIMEOUT_MS = 1000;
export { SHED_RETRY_MS } from "./policy.js";
// The probe `detect()` peeks at; under `rl:` like the usual buckets, so an
// ACL key pattern such as `~rl:*` covers it.
export const PROBE_KEY = "rl:probe";

export interface LimiterOptions {
  /** Force "module", "functions" or "eval"; by default the first call finds it. */
  backend?: BackendName;
  /**
   * Ms Redis has to answer a command, counted from when it is written
   * (default 100); null for none (the client's own timeouts apply).
   */
  timeoutMs?: number | null;
  /** When Redis fails: "raise" (default), "open", "closed" or "local". */
  onError?: OnError;
  /** Entries of the denial cache (or a DenialCache); off by default. */
  denialCache?: number | DenialCache | false;
  /** The circuit breaker: true (the default one), false for none, or a Breaker. */
  breaker?: Breaker | boolean;
  /** How many processes share each limit, for onError "local" (default 1). */
  processes?: number;
  /** Called once per decision, for metrics; a hook that throws is logged and the decision stands. */
  onDecision?: (event: DecisionEvent) => void;
  /** Where warnings and degraded answers are logged (default: console). */
  logger?: Logger;
  /**
   * Replicas that must acknowledge each consume, consumeMany and acquire
   * (`WAIT n ms` pipelined behind it, one round trip); 0 (default) for
   * none. An admitted decision that fewer acknowledged is a Redis failure:
   * onError answers, the breaker counts it. Not with a Cluster.
   */
  waitReplicas?: number;
  /** How long (ms) the WAIT waits for them (default 50), added to the call's budget. */
  waitTimeoutMs?: number;
  /** How `wait` sleeps a reservation's delay (default: a setTimeout promise); tests pass a fake clock's. */
  sleep?: (ms: number) => Promise<void>;
  /**
   * Dry-run: a bucket's denial of consume or consumeMany is answered
   * admitted with `shadow: true` (`retryAfterMs` 0), reported
   * "shadow_mode" and logged (info). The denial wrote nothing, as an
   * enforced one, so the shadow counts are what enforcement would deny. A
   * shed or "closed" denial stands. A call's `shadow` overrides it.
   */
  shadow?: boolean;
  /** The share of a budget used from which an admission is "near_limit" in the events (default 0.8). */
  nearLimitRatio?: number;
}

const SLEEP = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** The default `waitTimeoutMs`. */
export const DEFAULT_WAIT_TIMEOUT_MS = 50;

// Warnings and errors to the console; which backend is in use is not news.
const DEFAULT_LOGGER: Logger = { error: (m) => console.error(m), warn: (m) => console.warn(m) };

/**
 * Token buckets in Redis: `new Limiter(redis, { onError: "open", timeoutMs: 50 })`
 * with an ioredis Redis or Cluster, or a connected node-redis client or cluster.
 */
export class Limiter {
  readonly client: RedisLike;
  readonly timeoutMs: number | null;
  readonly onError: OnError;
  readonly denialCache: DenialCache | undefined;
  readonly breaker: Breaker | undefined;
  readonly processes: number;
  readonly waitReplicas: number;
  readonly waitTimeoutMs: number;
  onDecision: ((event: DecisionEvent) => void) | undefined;
  readonly shadow: boolean;
  readonly nearLimitRatio: number;
  /** Where warnings and degraded answers go (the `logger` option). */
  readonly logger: Logger;
  private readonly conn: Connection;
  private readonly engine: Engine;
  private readonly ctx: Context;
  private readonly policy: FailurePolicy;
  /** How `wait` (and an HTTP rule's `maxDelayMs`) sleeps a reservation's delay. */
  readonly sleep: (ms: number) => Promise<void>;
  // The leases this limiter holds, as [key, id] identities: a set, so a
  // retried acquire of a held id counts once.
  private readonly held = new Set<string>();
  private closed = false;

  constructor(client: RedisLike, options: LimiterOptions = {}) {
    this.client = client;
    this.conn = connect(client);
    this.logger = options.logger ?? DEFAULT_LOGGER;
    this.engine = new Engine(options.backend, this.logger);
    this.timeoutMs = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : checkTimeout(options.timeoutMs, true);
    this.onError = checkOnError(options.onError ?? "raise");
    const cache = options.denialCache;
    if (cache instanceof DenialCache) this.denialCache = cache;
    else if (cache === undefined || cache === false || cache === 0) this.denialCache = undefined;
    else this.denialCache = new DenialCache(cache);
    const breaker = options.breaker ?? true;
    if (breaker instanceof Breaker) this.breaker = breaker;
    else if (breaker === true) this.breaker = new Breaker();
    else if (breaker === false) this.breaker = undefined;
    else throw new TypeError("breaker must be a Breaker, true (the default one) or false");
    const processes = options.processes ?? 1;
    if (!(Number.isInteger(processes) && processes >= 1)) throw new RangeError("processes must be an integer >= 1");
    this.processes = processes;
    this.waitReplicas = options.waitReplicas === undefined ? 0 : checkWaitReplicas(options.waitReplicas);
    this.waitTimeoutMs =
      options.waitTimeoutMs === undefined ? DEFAULT_WAIT_TIMEOUT_MS : checkWaitTimeout(options.waitTimeoutMs);
    if (this.waitReplicas > 0 && this.conn.cluster) {
      // WAIT counts the replicas of the node it is sent to, and only for
      // this connection's writes: a Cluster's decisions land on many nodes.
      throw new TypeError(
        "waitReplicas needs one primary (a plain or Sentinel client): WAIT answers for one node, not a Cluster",
      );
    }
    this.onDecision = options.onDecision;
    if (options.shadow !== undefined && typeof options.shadow !== "boolean") {
      throw new TypeError(`shadow must be true or false, got ${String(options.shadow)}`);
    }
    this.shadow = options.shadow ?? false;
    const ratio = options.nearLimitRatio ?? DEFAULT_NEAR_LIMIT_RATIO;
    if (!(typeof ratio === "number" && ratio > 0 && ratio <= 1)) {
      throw new RangeError(`nearLimitRatio must be a number in (0, 1], got ${String(ratio)}`);
    }
    this.nearLimitRatio = ratio;
    if (options.sleep !== undefined && typeof options.sleep !== "function") {
      throw new TypeError("sleep must be a function of ms returning a promise");
    }
    this.sleep = options.sleep ?? SLEEP;
    this.ctx = {
      engine: this.engine,
      cache: this.denialCache,
      conn: this.conn,
      timeoutMs: this.timeoutMs,
      onError: this.onError,
    };
    this.policy = new FailurePolicy(this.ctx, this.breaker, processes, this.logger);
    if (this.onError === "local") {
      requireWasmoon();
      // Started now, so that the Lua VM is ready (or its failure logged) before Redis fails.
      this.policy.localBuckets().catch((e: Error) => this.logger.error(e.message));
    }
  }

  /** The backend in use ("module", "functions" or "eval"); undefined until a call finds it. */
  get backend(): BackendName | undefined {
    return this.engine.backend;
  }

  /** "closed", "open" or "half_open" ("closed" without a breaker). */
  get breakerState(): BreakerState {
    return this.breaker?.state ?? "closed";
  }

  /**
   * How many leases this limiter holds now: acquired through it and not
   * given back since. One counts from the acquire that takes it (a retried
   * acquire of a held id counts once) until `release` is called for it,
   * whatever the answer, or a renewal finds it lost.
   */
  get leasesHeld(): number {
    return this.held.size;
  }

  /**
   * Charges `cost` tokens if the bucket holds them (TB.CONSUME), or `cost`
   * of a Quota's period budget (TB.QUOTA). With `maxWaitMs` (buckets
   * only), a reservation: admitted if its turn comes within that wait,
   * `delayMs` saying how long to wait before going ahead. With `blockMs`
   * (buckets only), a penalty: a denial charges the bucket into debt
   * (TB.ADJUST) so the caller is refused for `blockMs` (penalty.ts); at
   * most `1000 * (max + cost) / rate`.
   */
  async consume(key: Key, bucket: Rule, cost: Amount = 1, options?: ConsumeOptions): Promise<Decision> {
    const blockMs = checkBlock(options?.blockMs, bucket, number(cost, "cost"));
    const d = await this.run(oneJob(this.ctx, "consume", key, bucket, cost, options), options?.shadow);
    const charge = blockMs === undefined ? 0 : penalty(d, blockMs);
    if (charge <= 0 || blockMs === undefined) return d;
    // Failing open: Redis's denial stands whatever becomes of its penalty.
    const adjusted = await this.adjust(key, bucket, -charge, { timeoutMs: options?.timeoutMs, onError: "open" });
    return penalized(d, adjusted, blockMs);
  }

  /** What `consume` would answer, without charging (TB.PEEK, TB.QPEEK). */
  async peek(key: Key, bucket: Rule, cost: Amount = 1, options?: ConsumeOptions): Promise<Decision> {
    return this.run(oneJob(this.ctx, "peek", key, bucket, cost, options));
  }

  /**
   * Refunds (delta > 0) or charges without asking (delta < 0, down to a
   * debt of -max) (TB.ADJUST; TB.QADJUST for a Quota, down to -limit).
   */
  async adjust(key: Key, bucket: Rule, delta: Amount, options?: CallOptions): Promise<Decision> {
    return this.run(oneJob(this.ctx, "adjust", key, bucket, delta, options));
  }

  /**
   * Takes the bucket's turn for `cost` and waits for it: one reservation
   * (`consume` with `maxWaitMs`), then, if admitted, a sleep of its
   * `delayMs` before returning the Decision. A denial (the turn is further
   * than `maxWaitMs`) returns at once, never retried; so does an answer of
   * the failure policy (degraded or shed), without sleeping.
   */
  async wait(key: Key, bucket: Rule, cost: Amount = 1, options?: WaitOptions): Promise<Decision> {
    if (options === undefined || options === null || options.maxWaitMs === undefined) {
      throw new TypeError("wait needs { maxWaitMs }: the longest it may wait for its turn");
    }
    checkMaxWait(options.maxWaitMs, "consume", bucket);
    const d = await this.consume(key, bucket, cost, options);
    if (d.delayMs > 0 && !d.degraded && !d.shed) await this.sleep(d.delayMs);
    return d;
  }

  /** Charges every `[key, bucket, cost]` or none (TB.MCONSUME). */
  async consumeMany(groups: Iterable<GroupIn>, options: ManyOptions = {}): Promise<MultiDecision> {
    return this.run(manyJob(this.ctx, groups, options), options.shadow);
  }

  /**
   * Deletes the bucket at `key` (DEL: whatever the key holds), so it is
   * full again, and drops any denial the cache holds for it. True if there
   * was a key to delete. Redis errors throw, whatever the policy.
   */
  async reset(key: Key, options: UpkeepOptions = {}): Promise<boolean> {
    return this.run(resetJob(this.ctx, key, options));
  }

  /**
   * Finds the backend now with a read-only TB.PEEK of `probeKey` (readiness
   * checks); throws if Redis can't serve any. Not a decision: no policy, no event.
   */
  async detect(probeKey: Key = PROBE_KEY, options: { timeoutMs?: number } = {}): Promise<BackendName> {
    return this.run(detectJob(this.ctx, probeKey, options)) as Promise<BackendName>;
  }

  /**
   * Stops the limiter: later calls throw LimiterError("the limiter is
   * closed"). The client is not closed (it is yours); leases still held
   * expire by themselves unless released before.
   */
  async close(): Promise<void> {
    this.closed = true;
  }

  // ---- concurrency leases ----------------------------------------------------------

  /**
   * Takes `weight` (default 1) of the key's `concurrency.limit` slots for
   * `concurrency.leaseMs`, charging every `[key, bucket, cost]` of
   * `buckets` in the same decision, all or nothing (TB.ACQUIRE). The Lease
   * says whether it was acquired, and when to retry if not. The failure
   * policy applies as for `consume` (docs/failure-model.md); an acquire
   * that got no answer from Redis is followed by a best-effort release of
   * its id, as it may have taken the slot all the same.
   */
  async acquire(key: Key, concurrency: Concurrency, options: AcquireOptions = {}): Promise<Lease> {
    return this.run(acquireJob(this.ctx, key, concurrency, options));
  }

  /**
   * Extends the lease to `leaseMs` from now (TB.RENEW): true; false, and
   * `lease.lost` set, when it expired or was released: it is never taken
   * again (acquire again instead). Sent even while the breaker is open,
   * never counted for it; Redis errors throw, whatever the policy.
   */
  async renew(lease: Lease, options: UpkeepOptions = {}): Promise<boolean> {
    checkLease(lease);
    const call = leaseCall("renew", lease);
    const renewed =
      lease.held !== "redis" || !lease.acquired
        ? await this.offRedis(call, lease)
        : await this.run(upkeepJob(this.ctx, "renew", lease, options));
    if (lease.lost) this.held.delete(heldId(call));
    return renewed;
  }

  /**
   * Gives the slot back (TB.RELEASE): true if the lease was live; releasing
   * again is harmless (false). Sent even while the breaker is open, never
   * counted for it; Redis errors throw, whatever the policy. The limiter
   * holds the lease no more, whatever the answer: a release Redis can't
   * take leaves it to expire.
   */
  async release(lease: Lease, options: UpkeepOptions = {}): Promise<boolean> {
    checkLease(lease);
    const call = leaseCall("release", lease);
    if (lease.acquired) this.held.delete(heldId(call));
    if (lease.held !== "redis" || !lease.acquired) return this.offRedis(call, lease);
    return this.run(upkeepJob(this.ctx, "release", lease, options));
  }

  /** The weight of the key's live leases (TB.INFLIGHT, read-only); Redis errors throw. */
  async inFlight(key: Key, options: UpkeepOptions = {}): Promise<number> {
    return this.run(inflightJob(this.ctx, key, options));
  }

  /**
   * `await lim.hold(key, concurrency, async (lease) => ...)`: acquires a
   * lease (with `options` as `acquire` takes them), throwing Busy (with the
   * denied Lease) if there is none; renews it in the background about every
   * `leaseMs / 3` while `work` runs (`lease.lost` is set if a renewal finds
   * it gone); and releases it however `work` ends, returning what it
   * returns or throwing what it throws. A release that fails is logged and
   * the lease left to expire.
   */
  async hold<T>(
    key: Key,
    concurrency: Concurrency,
    work: (lease: Lease) => T | Promise<T>,
    options: AcquireOptions = {},
  ): Promise<T> {
    checkWork(work);
    const job = acquireJob(this.ctx, key, concurrency, options);
    return this.keep(await this.run(job), work);
  }

  /** What `hold` does for a lease `acquire` returned: Busy if it was not acquired. */
  async keep<T>(lease: Lease, work: (lease: Lease) => T | Promise<T>): Promise<T> {
    checkWork(work);
    const keeper = this.keeper(lease);
    try {
      return await work(lease);
    } finally {
      await keeper.end();
    }
  }

  /**
   * Renews an acquired lease in the background from now until `end()`,
   * which releases it: for lifetimes that are events rather than a
   * function (a response, a socket). Busy if the lease was not acquired.
   */
  keeper(lease: Lease): LeaseKeeper {
    checkLease(lease);
    if (!lease.acquired) throw new Busy(lease);
    return new Keeper(this, lease, this.logger);
  }

  /**
   * Renewing or releasing a lease that holds no slot in Redis: a denied
   * one (nothing to do), one admitted by onError "open" (no slot anywhere:
   * renewing keeps it until it is released, then finds it lost; releasing
   * ends it), or one of the in-process fallback (onError "local"), which
   * answers for it. No Redis, no breaker.
   */
  private async offRedis(call: LeaseCall, lease: Lease): Promise<boolean> {
    if (!lease.acquired) return false;
    if (lease.held === "local") {
      const local = await this.policy.localBuckets();
      const [done, value] = pair(local.runLease(call.op, call.id, call.head.head, []));
      if (call.op === "renew") return renewedOrLost(lease, done === 1, value);
      lease.released = true;
      return done === 1;
    }
    if (call.op === "renew") return renewedOrLost(lease, !lease.released, lease.expiresInMs);
    const released = !lease.released;
    lease.released = true;
    return released;
  }

  // ---- running a job -----------------------------------------------------------------

  private async run<T>(job: Job<T>, shadow?: boolean): Promise<T> {
    if (this.closed) throw new LimiterError("the limiter is closed");
    const started = performance.now();
    const result = job.done !== undefined ? job.done : await this.policy.run(job, this.io(job));
    return this.settled(job, result, started, shadow);
  }

  /**
   * How a job's commands reach Redis: each one under the budget, from when
   * it is written; a command that can admit with the replica wait behind
   * it, both under the budget plus waitTimeoutMs.
   */
  private io(job: Job<unknown>): IO {
    let budget = job.timeoutMs;
    if (budget !== null && budget < DETECT_TIMEOUT_MS && this.engine.backend === undefined) budget = DETECT_TIMEOUT_MS;
    const conn = this.conn;
    const mints = job.op === "consume" || job.op === "consume_many" || job.op === "acquire";
    const wait = this.waitReplicas > 0 && mints ? new ReplicaWait(this.waitReplicas, this.waitTimeoutMs) : undefined;
    const within = <T>(reply: Promise<T>, ms: number | null, written: boolean): Promise<T> =>
      ms === null ? reply : bounded(reply, ms, written);
    return {
      wait,
      send: (args: readonly Arg[], key, ro, minting) => {
        const written = conn.writesNow(); // read before sending: whether this command goes out now
        if (wait === undefined || minting !== true) return within(conn.send(args, key, ro), budget, written);
        const [reply, acked] = conn.sendPair(args, wait.args);
        return within(wait.settle(reply, acked), budget === null ? null : budget + wait.timeoutMs, written);
      },
      everyPrimary: (args) => {
        const written = conn.writesNow();
        return within(conn.everyPrimary(args), budget, written);
      },
    };
  }

  /**
   * Counts a lease an acquire took as held, and reports a decision to the
   * onDecision hook (never throwing into the call).
   */
  private settled<T>(job: Job<T>, answer: T, started: number, shadow?: boolean): T {
    if (job.op === "acquire" && answer instanceof Lease && answer.acquired && job.lease !== undefined) {
      this.held.add(heldId(job.lease));
    }
    // Only a charge is shadowed: peek, adjust and leases let nothing through.
    const charge = job.op === "consume" || job.op === "consume_many";
    const result = charge && (shadow ?? this.shadow) ? (this.letThrough(answer as unknown as Verdict) as T) : answer;
    const hook = this.onDecision;
    const op = job.op;
    // Renewals, releases, in-flight reads, resets and probes decide
    // nothing: no event (as in the Python package).
    if (
      hook === undefined ||
      (op !== "consume" && op !== "peek" && op !== "adjust" && op !== "consume_many" && op !== "acquire")
    ) {
      return result;
    }
    const names = job.groups.map((g) => g.bucket.name ?? "");
    if (job.lease?.concurrency !== undefined) names.unshift(job.lease.concurrency.name ?? "");
    let flags: Pick<DecisionEvent, "allowed" | "degraded" | "shed" | "cached">;
    if (result instanceof Lease) {
      flags = { allowed: result.acquired, degraded: result.degraded, shed: result.shed, cached: false };
    } else {
      const d = result as unknown as Decision | MultiDecision;
      flags = { allowed: d.allowed, degraded: d.degraded, shed: d.shed, cached: d.cached };
    }
    const event: DecisionEvent = {
      op,
      policy: names.join(",").replace(/^,+|,+$/g, ""),
      ...flags,
      backend: job.source ?? this.engine.backend ?? "",
      latencyMs: performance.now() - started,
      breaker: this.breakerState,
      ...this.judged(result as unknown as Verdict | Lease),
    };
    try {
      hook(event);
    } catch (error) {
      this.logger.error(`rate limiter: the onDecision hook threw; the decision stands: ${String(error)}`);
    }
    return result;
  }
  /**
   * A bucket's denial as shadow mode answers it: admitted, marked shadow,
   * no wait. A denial nothing counted (shed, or the failure policy's
   * "closed") stands: onError decides those, not the limit.
   */
  private letThrough(d: Verdict): Verdict {
    if (d.allowed || d.shed || (d.degraded && d.retryAfterMs === 0)) return d;
    this.logger.info?.(`rate limiter: shadow mode let through a request ${d.rule ?? "a rule"} would deny`);
    if (d instanceof Decision) return d.with({ allowed: true, retryAfterMs: 0, shadow: true });
    return new MultiDecision(true, 0, d.decisions, {
      atomic: d.atomic,
      skipped: d.skipped,
      degraded: d.degraded,
      cached: d.cached,
      shed: d.shed,
      shadow: true,
    });
  }

  /** The event's outcome and the name of the rule that decided. */
  private judged(d: Verdict | Lease): { outcome: Outcome; rule: string } {
    let decisions: readonly Decision[];
    let rule: string | undefined;
    const used: [number, number][] = [];
    let allowed: boolean;
    let shadow = false;
    if (d instanceof Lease) {
      decisions = d.decisions;
      // A bucket decided only when it denied and a slot was free.
      const byBucket = !d.acquired && !d.busy && decisions.some((x) => !x.allowed);
      rule = byBucket ? undefined : (d.concurrency.name ?? "");
      used.push([d.inUse, d.concurrency.limit]);
      allowed = d.acquired;
    } else {
      decisions = d instanceof MultiDecision ? d.decisions : [d];
      allowed = d.allowed;
      shadow = d.shadow;
    }
    if (rule === undefined && decisions.length > 0) {
      rule = new MultiDecision(allowed, 0, decisions).tightest.bucket.name;
    }
    const named = rule ?? "";
    if (shadow) return { outcome: "shadow_mode", rule: named };
    if (!allowed) return { outcome: "over_limit", rule: named };
    if (d.degraded) return { outcome: "within_limit", rule: named };
    for (const x of decisions) used.push([x.bucket.max - x.remaining, x.bucket.max]);
    const near = used.some(([u, m]) => u >= this.nearLimitRatio * m);
    return { outcome: near ? "near_limit" : "within_limit", rule: named };
  }
}

type Verdict = Decision | MultiDecision;

/** A lease's identity in `held`: its key and its id, as the bytes Redis sees. */
function heldId(call: LeaseCall): string {
  return JSON.stringify([call.id, keyId(call.leaseId)]);
}
