// The Limiter: argument checks, backend detection (engine.ts), Cluster
// routing and the Cluster fallback, the denial cache, the failure policy
// with the breaker and the local buckets (docs/failure-model.md), and the
// concurrency leases (acquire, renew, release, inFlight, hold).

import { type Arg, type Connection, connect, type RedisLike } from "./adapters.js";
import { Breaker, type BreakerState, PROBE, SKIP } from "./breaker.js";
import { type Amount, Bucket, checkCost, checkDelta, InvalidArgument, type Key, refusal } from "./bucket.js";
import { DenialCache } from "./cache.js";
import { classify } from "./classify.js";
import { MAX_GROUPS } from "./contract.js";
import { Decision, MultiDecision } from "./decision.js";
import { type BackendName, Engine, type IO, type Logger } from "./engine.js";
import { CircuitOpenError, CrossSlotError, Shed } from "./errors.js";
import type { DecisionEvent } from "./events.js";
import { Keeper, type LeaseKeeper } from "./hold.js";
import { keyId } from "./keys.js";
import { Busy, Concurrency, checkId, Lease, newId } from "./lease.js";
import { LocalBuckets, LocalReplyError, requireWasmoon } from "./local.js";
import type { BucketOp, Group, LeaseHead, LeaseOp } from "./scripts.js";
import { bounded } from "./transport.js";

export type OnError = "raise" | "open" | "closed" | "local";
export const ON_ERROR: readonly OnError[] = ["raise", "open", "closed", "local"];

/** The limiter's budget for Redis to answer a command, from when it is written (ms). */
export const DEFAULT_TIMEOUT_MS = 100;
// While the backend is unknown (the first calls, or after a reply said it
// is gone), a call may load the Lua library, which Redis compiles: many
// first requests at once can keep it busy past a request-path budget.
// Such calls get at least this budget (ms).
export const DETECT_TIMEOUT_MS = 1000;
/** What a shed decision tells the client to wait (HTTP Retry-After: 1). */
export const SHED_RETRY_MS = 1000;
// The probe `detect()` peeks at; under `rl:` like the usual buckets, so an
// ACL key pattern such as `~rl:*` covers it.
export const PROBE_KEY = "rl:probe";
const PROBE_BUCKET = new Bucket({ max: 1, rate: 1 });

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
}

export interface CallOptions {
  /** This call's budget in ms (default: the limiter's). */
  timeoutMs?: number;
  /** This call's policy (default: the limiter's). */
  onError?: OnError;
}

export interface ManyOptions extends CallOptions {
  /**
   * On a Cluster with keys in several slots: undefined (default) charges
   * bucket by bucket and refunds on a denial; true throws CrossSlotError
   * (strict); false always goes bucket by bucket.
   */
  atomic?: boolean;
}

/** `[key, bucket]` or `[key, bucket, cost]`. */
export type GroupIn = readonly [Key, Bucket] | readonly [Key, Bucket, Amount];

export interface AcquireOptions extends CallOptions {
  /** The slots this lease takes, `1 <= weight <= limit` (default 1). */
  weight?: number;
  /**
   * `[key, bucket, cost]` groups charged in the same decision, all or
   * nothing (TB.ACQUIRE's BUCKET clauses). On a Cluster their keys must
   * share the lease key's hash slot.
   */
  buckets?: Iterable<GroupIn>;
  /** The lease's id, 1 to 256 bytes (default: a new UUID). Acquiring a live id again renews it. */
  id?: Key;
}

/** Options of renew, release and inFlight: they decide nothing, so no policy applies. */
export interface UpkeepOptions {
  /** This call's budget in ms (default: the limiter's). */
  timeoutMs?: number;
}

type OneOp = "consume" | "peek" | "adjust";

/** A lease operation as sent: its key, the lease, and what goes before the buckets. */
interface LeaseCall {
  readonly op: LeaseOp;
  readonly id: string; // keyId of the lease key
  readonly head: LeaseHead;
  readonly concurrency: Concurrency | undefined; // undefined for inflight
  readonly leaseId: Key;
  readonly weight: number;
}

interface Job<T> {
  op: DecisionEvent["op"] | "detect" | "renew" | "release" | "inflight";
  groups: readonly Group[];
  lease?: LeaseCall;
  each: boolean; // bucket by bucket (consumeMany across slots)
  timeoutMs: number | null;
  onError: OnError;
  plan: (io: IO) => Promise<T>;
  answers: Answers<T>;
  source?: string; // who answered when not the backend: "local" or ""
}

interface Answers<T> {
  policy(job: Job<T>, allowed: boolean): T;
  local(local: LocalBuckets, job: Job<T>): T;
  shed(job: Job<T>): T;
}

// Warnings and errors to the console; which backend is in use is not news.
const DEFAULT_LOGGER: Logger = { error: (m) => console.error(m), warn: (m) => console.warn(m) };

const OUTCOME: Record<OnError, string> = {
  open: "admitted",
  closed: "denied",
  local: "local buckets",
  raise: "raised",
};

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
  onDecision: ((event: DecisionEvent) => void) | undefined;
  private readonly conn: Connection;
  private readonly engine: Engine;
  /** Where warnings and degraded answers go (the `logger` option). */
  readonly logger: Logger;
  private local: Promise<LocalBuckets> | undefined;
  private readonly lastReport = new Map<OnError, number>();
  private readonly unreported = new Map<OnError, number>();

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
    this.onDecision = options.onDecision;
    if (this.onError === "local") {
      requireWasmoon();
      // Started now, so that the Lua VM is ready (or its failure logged) before Redis fails.
      this.localBuckets().catch((e: Error) => this.logger.error(e.message));
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

  /** Charges `cost` tokens if the bucket holds them (TB.CONSUME). */
  async consume(key: Key, bucket: Bucket, cost: Amount = 1, options?: CallOptions): Promise<Decision> {
    return this.run(this.one("consume", key, bucket, cost, options));
  }

  /** What `consume` would answer, without charging (TB.PEEK). */
  async peek(key: Key, bucket: Bucket, cost: Amount = 1, options?: CallOptions): Promise<Decision> {
    return this.run(this.one("peek", key, bucket, cost, options));
  }

  /** Refunds (delta > 0) or charges without asking (delta < 0, down to a debt of -max) (TB.ADJUST). */
  async adjust(key: Key, bucket: Bucket, delta: Amount, options?: CallOptions): Promise<Decision> {
    return this.run(this.one("adjust", key, bucket, delta, options));
  }

  /** Charges every `[key, bucket, cost]` or none (TB.MCONSUME). */
  async consumeMany(groups: Iterable<GroupIn>, options: ManyOptions = {}): Promise<MultiDecision> {
    return this.run(this.many(groups, options));
  }

  /**
   * Finds the backend now with a read-only TB.PEEK of `probeKey` (readiness
   * checks); throws if Redis can't serve any. Not a decision: no policy, no event.
   */
  async detect(probeKey: Key = PROBE_KEY, options: { timeoutMs?: number } = {}): Promise<BackendName> {
    const group: Group = { key: probeKey, id: keyId(probeKey), bucket: PROBE_BUCKET, amount: 1 };
    const job: Job<BackendName> = {
      op: "detect",
      groups: [group],
      each: false,
      timeoutMs: options.timeoutMs === undefined ? this.timeoutMs : checkTimeout(options.timeoutMs, false),
      onError: "raise",
      plan: async (io) => {
        await this.engine.call("peek", [group], io);
        return this.engine.backend as BackendName;
      },
      answers: {
        policy: () => {
          throw new Error("unreachable");
        },
        local: () => {
          throw new Error("unreachable");
        },
        shed: () => {
          throw new Shed("too busy to probe Redis in time");
        },
      },
    };
    return this.run(job);
  }

  // ---- concurrency leases ----------------------------------------------------------

  /**
   * Takes `weight` (default 1) of the key's `concurrency.limit` slots for
   * `concurrency.leaseMs`, charging every `[key, bucket, cost]` of
   * `buckets` in the same decision, all or nothing (TB.ACQUIRE). The Lease
   * says whether it was acquired, and when to retry if not. The failure
   * policy applies as for `consume` (docs/failure-model.md).
   */
  async acquire(key: Key, concurrency: Concurrency, options: AcquireOptions = {}): Promise<Lease> {
    return this.run(this.acquireJob(key, concurrency, options));
  }

  /**
   * Extends the lease to `leaseMs` from now (TB.RENEW): true; false, and
   * `lease.lost` set, when it expired or was released: it is never taken
   * again (acquire again instead). Redis errors throw, whatever the policy.
   */
  async renew(lease: Lease, options: UpkeepOptions = {}): Promise<boolean> {
    checkLease(lease);
    const call = leaseCall("renew", lease);
    if (lease.held !== "redis" || !lease.acquired) return this.offRedis(call, lease);
    return this.run(
      this.upkeepJob(call, options, async (io) => {
        const reply = await this.engine.call("renew", [], io, call.head);
        const [renewed, expiresInMs] = pair(reply);
        return renewedOrLost(lease, renewed === 1, expiresInMs);
      }),
    );
  }

  /**
   * Gives the slot back (TB.RELEASE): true if the lease was live; releasing
   * again is harmless (false). Redis errors throw, whatever the policy.
   */
  async release(lease: Lease, options: UpkeepOptions = {}): Promise<boolean> {
    checkLease(lease);
    const call = leaseCall("release", lease);
    if (lease.held !== "redis" || !lease.acquired) return this.offRedis(call, lease);
    return this.run(
      this.upkeepJob(call, options, async (io) => {
        const [released] = pair(await this.engine.call("release", [], io, call.head));
        lease.released = true;
        return released === 1;
      }),
    );
  }

  /** The weight of the key's live leases (TB.INFLIGHT, read-only); Redis errors throw. */
  async inFlight(key: Key, options: UpkeepOptions = {}): Promise<number> {
    const call: LeaseCall = {
      op: "inflight",
      id: keyId(key),
      head: { key, head: [] },
      concurrency: undefined,
      leaseId: "",
      weight: 0,
    };
    return this.run(
      this.upkeepJob(call, options, async (io) => {
        const reply = await this.engine.call("inflight", [], io, call.head);
        if (typeof reply !== "number" && typeof reply !== "string") {
          throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
        }
        return Number(reply);
      }),
    );
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
    const job = this.acquireJob(key, concurrency, options);
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
   * renewing keeps it, releasing ends it), or one of the in-process
   * fallback (onError "local"), which answers for it. No Redis, no breaker.
   */
  private async offRedis(call: LeaseCall, lease: Lease): Promise<boolean> {
    let answer: boolean;
    if (!lease.acquired) {
      answer = false;
    } else if (lease.held === "local") {
      const local = await this.localBuckets();
      const [done, value] = pair(local.runLease(call.op, call.id, call.head.head, []));
      if (call.op === "renew") {
        answer = renewedOrLost(lease, done === 1, value);
      } else {
        lease.released = true;
        answer = done === 1;
      }
    } else if (call.op === "renew") {
      answer = !lease.released;
      if (!answer) lease.lost = true;
    } else {
      answer = !lease.released;
      lease.released = true;
    }
    return answer;
  }

  // ---- requests: checked before anything is sent ------------------------------

  private one(op: OneOp, key: Key, bucket: Bucket, amount: Amount, options: CallOptions = {}): Job<Decision> {
    checkBucket(bucket);
    const value = op === "adjust" ? checkDelta(amount) : checkCost(amount, bucket);
    const group: Group = { key, id: keyId(key), bucket, amount: value };
    const job: Job<Decision> = {
      op,
      groups: [group],
      each: false,
      ...this.options(options),
      plan: (io) => this.planOne(op, group, io),
      answers: ANSWER_ONE,
    };
    return job;
  }

  private many(given: Iterable<GroupIn>, options: ManyOptions): Job<MultiDecision> {
    // The module's order: the group count, each group left to right, then
    // duplicate keys; the first error wins.
    const list = [...given];
    if (list.length === 0) throw new InvalidArgument("groups", "consumeMany needs at least one [key, bucket, cost]");
    const groups = checkGroups(list);
    checkDuplicates(groups);
    const split = this.conn.cluster && groups.length > 1 && new Set(groups.map((g) => this.conn.slot(g.id))).size > 1;
    if (split && options.atomic === true) {
      const slots = groups.map((g) => `${JSON.stringify(g.id)}: ${this.conn.slot(g.id)}`).join(", ");
      throw new CrossSlotError(
        `atomic consumeMany needs every key in one Cluster hash slot, got ${slots}; ` +
          "put the shared part in a hash tag (hashTagged) or leave atomic unset",
      );
    }
    const each = split || options.atomic === false;
    return {
      op: "consume_many",
      groups,
      each,
      ...this.options(options),
      plan: (io) => this.planMany(groups, each, io),
      answers: ANSWER_MANY,
    };
  }

  private acquireJob(key: Key, concurrency: Concurrency, options: AcquireOptions): Job<Lease> {
    // The module's order: the id, the weight, the buckets (their count,
    // each left to right), a bucket on the lease key, duplicates.
    const id = keyId(key);
    checkConcurrency(concurrency);
    const leaseId = options.id === undefined ? newId() : checkId(options.id);
    const weight = concurrency.checkWeight(options.weight ?? 1);
    const groups = checkGroups([...(options.buckets ?? [])]);
    checkDuplicates(groups, id);
    if (this.conn.cluster && groups.length > 0) {
      const slots = new Set([id, ...groups.map((g) => g.id)].map((k) => this.conn.slot(k)));
      if (slots.size > 1) {
        const where = [id, ...groups.map((g) => g.id)].map((k) => `${JSON.stringify(k)}: ${this.conn.slot(k)}`);
        throw new CrossSlotError(
          `acquire needs the lease key and its buckets in one Cluster hash slot, got ${where.join(", ")}; ` +
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
      ...this.options(options),
      plan: (io) => this.planAcquire(call, groups, io),
      answers: ANSWER_LEASE,
    };
  }

  /** A job for renew, release or inflight: no policy (a Redis failure throws), a shed call throws. */
  private upkeepJob<T>(call: LeaseCall, options: UpkeepOptions, plan: (io: IO) => Promise<T>): Job<T> {
    return {
      op: call.op,
      groups: [],
      lease: call,
      each: false,
      timeoutMs: options.timeoutMs === undefined ? this.timeoutMs : checkTimeout(options.timeoutMs, false),
      onError: "raise",
      plan,
      answers: answerNone(call),
    };
  }

  private options(options: CallOptions): { timeoutMs: number | null; onError: OnError } {
    const onError = options.onError === undefined ? this.onError : checkOnError(options.onError);
    if (onError === "local") requireWasmoon();
    return {
      timeoutMs: options.timeoutMs === undefined ? this.timeoutMs : checkTimeout(options.timeoutMs, false),
      onError,
    };
  }

  // ---- plans ---------------------------------------------------------------------

  private async planOne(op: OneOp, g: Group, io: IO): Promise<Decision> {
    const cache = this.denialCache;
    const sent = cache?.clock() ?? 0;
    const reply = await this.engine.call(op, [g], io);
    const decision =
      op === "adjust"
        ? Decision.fromAdjust(reply, g.key, g.bucket, g.amount)
        : Decision.fromReply(reply, g.key, g.bucket, g.amount);
    if (cache !== undefined) {
      // Any write of this limiter may let a cached request pass sooner.
      if (op === "adjust" || (op === "consume" && decision.allowed && g.amount > 0)) cache.forget(g.id);
      else if (!decision.allowed) cache.remember(sent, decision.retryAfterMs, [g.id], [decision]);
    }
    return decision;
  }

  private async planMany(groups: readonly Group[], each: boolean, io: IO): Promise<MultiDecision> {
    const cache = this.denialCache;
    const sent = cache?.clock() ?? 0;
    let result: MultiDecision;
    if (each) {
      result = await this.planEach(groups, io);
    } else {
      const reply = await this.engine.call("mconsume", groups, io);
      if (!Array.isArray(reply) || reply.length !== groups.length + 2) {
        throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
      }
      const decisions = groups.map((g, i) => Decision.fromReply(reply[i + 2], g.key, g.bucket, g.amount));
      result = new MultiDecision(Number(reply[0]) === 1, Number(reply[1]), decisions);
    }
    if (cache !== undefined) {
      if (result.allowed || each) for (const g of groups) cache.forget(g.id);
      if (!result.allowed) {
        cache.remember(
          sent,
          result.retryAfterMs,
          groups.map((g) => g.id),
          result.decisions,
        );
      }
    }
    return result;
  }

  /**
   * All-or-nothing without TB.MCONSUME, for keys in several Cluster slots:
   * charge bucket by bucket in order; when one denies, refund those already
   * charged and peek at the rest, so the answer is the one TB.MCONSUME
   * would give. Not atomic: until the refunds land, the refunded tokens are
   * missing and a concurrent request can be denied for it; and if Redis
   * fails between a charge and its refund, the charge stays.
   */
  private async planEach(groups: readonly Group[], io: IO): Promise<MultiDecision> {
    const charged: Decision[] = [];
    for (const [i, g] of groups.entries()) {
      const decision = Decision.fromReply(await this.engine.call("consume", [g], io), g.key, g.bucket, g.amount);
      if (decision.allowed) {
        charged.push(decision);
        continue;
      }
      const refunded: Decision[] = [];
      for (const [j, c] of charged.entries()) {
        if (c.cost > 0) {
          const back = groups[j] as Group;
          const reply = await this.engine.call("adjust", [back], io);
          // It could pay on its own, as TB.MCONSUME would report it;
          // ADJUST's retry time (for cost 1) means nothing here.
          refunded.push(Decision.fromReply(reply, c.key, c.bucket, c.cost).with({ retryAfterMs: 0 }));
        } else {
          refunded.push(c);
        }
      }
      const rest: Decision[] = [];
      for (const r of groups.slice(i + 1)) {
        rest.push(Decision.fromReply(await this.engine.call("peek", [r], io), r.key, r.bucket, r.amount));
      }
      const decisions = [...refunded, decision, ...rest];
      return new MultiDecision(false, Math.max(...decisions.map((d) => d.retryAfterMs)), decisions, { atomic: false });
    }
    return new MultiDecision(true, 0, charged, { atomic: false });
  }

  private async planAcquire(call: LeaseCall, groups: readonly Group[], io: IO): Promise<Lease> {
    const reply = await this.engine.call("acquire", groups, io, call.head);
    const lease = leaseFromReply(reply, call, groups, false);
    // Its buckets paid: their cached denials may pass sooner now. An
    // acquire's own denial is never cached (a release can free a slot at
    // any time).
    if (lease.acquired && this.denialCache !== undefined) {
      for (const g of groups) if (g.amount > 0) this.denialCache.forget(g.id);
    }
    return lease;
  }

  // ---- running a job, and the failure policy ----------------------------------------

  private cached<T>(job: Job<T>): T | undefined {
    const cache = this.denialCache;
    if (cache === undefined || job.op === "adjust" || job.op === "detect" || job.lease !== undefined) return undefined;
    const hit = cache.lookup(
      job.groups.map((g) => g.id),
      job.groups.map((g) => g.bucket),
      job.groups.map((g) => g.amount),
    );
    if (hit === undefined) return undefined;
    if (job.op === "consume_many") {
      return new MultiDecision(false, hit.retryAfterMs, hit.decisions, { atomic: !job.each, cached: true }) as T;
    }
    return hit.decisions[0] as T;
  }

  private async run<T>(job: Job<T>): Promise<T> {
    const started = performance.now();
    const hit = this.cached(job);
    if (hit !== undefined) return this.settled(job, hit, started);
    const breaker = this.breaker;
    const mode = breaker ? breaker.enter() : 0;
    if (mode === SKIP) return this.settled(job, await this.openCircuit(job), started);
    let result: T;
    try {
      result = await job.plan(this.io(job));
    } catch (error) {
      return this.settled(job, await this.failed(error, job, mode === PROBE), started);
    }
    if (breaker && mode === PROBE) breaker.success(true);
    return this.settled(job, result, started);
  }

  /** How a job's commands reach Redis: each one under the budget, from when it is written. */
  private io(job: Job<unknown>): IO {
    let budget = job.timeoutMs;
    if (budget !== null && budget < DETECT_TIMEOUT_MS && this.engine.backend === undefined) budget = DETECT_TIMEOUT_MS;
    const conn = this.conn;
    if (budget === null) {
      return { send: (args, key, ro) => conn.send(args, key, ro), everyPrimary: (args) => conn.everyPrimary(args) };
    }
    const ms = budget;
    return {
      send: (args: readonly Arg[], key, ro) => {
        const written = conn.writesNow(); // read before sending: whether this command goes out now
        return bounded(conn.send(args, key, ro), ms, written);
      },
      everyPrimary: (args) => {
        const written = conn.writesNow();
        return bounded(conn.everyPrimary(args), ms, written);
      },
    };
  }

  /**
   * What an error of a call means (transport.ts classify): a usage error is
   * thrown, local overload sheds, a Redis failure counts for the breaker
   * and gets the job's policy.
   */
  private async failed<T>(error: unknown, job: Job<T>, probe: boolean): Promise<T> {
    const kind = classify(error);
    const breaker = this.breaker;
    if (kind === "usage") {
      breaker?.success(probe); // Redis answered, if only to refuse
      throw error;
    }
    if (kind === "shed") {
      breaker?.release(probe);
      job.source = "";
      return job.answers.shed(job);
    }
    breaker?.failure(probe);
    return this.policy(job, error);
  }

  /** The job's answer while Redis is failing (`error`), logged. */
  private async policy<T>(job: Job<T>, error: unknown): Promise<T> {
    if (job.onError === "raise") throw error;
    this.report(error, job);
    if (job.onError === "local") {
      job.source = "local";
      return job.answers.local(await this.localBuckets(), job);
    }
    job.source = "";
    return job.answers.policy(job, job.onError === "open");
  }

  private openCircuit<T>(job: Job<T>): Promise<T> {
    const failures = this.breaker?.failures ?? 0;
    return this.policy(job, new CircuitOpenError(`the circuit breaker is open: Redis failed ${failures} times lately`));
  }

  private localBuckets(): Promise<LocalBuckets> {
    if (this.local === undefined) {
      this.local = LocalBuckets.create(this.processes);
      this.local.catch(() => {
        this.local = undefined; // try again next time (wasmoon installed meanwhile)
      });
    }
    return this.local;
  }

  /**
   * Logs a degraded answer: the first at once, then at most one line a
   * second per policy, counting the others, so an outage can't flood the log.
   */
  private report(error: unknown, job: Job<unknown>): void {
    const now = performance.now();
    const policy = job.onError;
    if (now - (this.lastReport.get(policy) ?? Number.NEGATIVE_INFINITY) < 1000) {
      this.unreported.set(policy, (this.unreported.get(policy) ?? 0) + 1);
      return;
    }
    const more = this.unreported.get(policy) ?? 0;
    this.unreported.delete(policy);
    this.lastReport.set(policy, now);
    const ids = job.lease === undefined ? [] : [job.lease.id];
    const what = `${job.op} ${[...ids, ...job.groups.map((g) => g.id)].map((id) => JSON.stringify(id)).join(", ")}`;
    const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    const tail = more ? ` (${more} more degraded answers since the last report)` : "";
    this.logger.error(`rate limiter unavailable (fail-${policy}: ${OUTCOME[policy]}) for ${what}: ${why}${tail}`);
  }

  /** Reports a decision to the onDecision hook (never throwing into the call). */
  private settled<T>(job: Job<T>, result: T, started: number): T {
    const hook = this.onDecision;
    const op = job.op;
    // Renewals, releases and in-flight reads decide nothing: no event (as
    // in the Python package).
    if (hook === undefined || op === "detect" || op === "renew" || op === "release" || op === "inflight") {
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
    };
    try {
      hook(event);
    } catch (error) {
      this.logger.error(`rate limiter: the onDecision hook threw; the decision stands: ${String(error)}`);
    }
    return result;
  }
}

// ---- leases ----------------------------------------------------------------------

function leaseCall(op: "renew" | "release", lease: Lease): LeaseCall {
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
function leaseFromReply(
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
function pair(reply: unknown): [number, number] {
  if (!Array.isArray(reply) || reply.length !== 2) {
    throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
  }
  return [Number(reply[0]), Number(reply[1])];
}

function renewedOrLost(lease: Lease, renewed: boolean, expiresInMs: number): boolean {
  if (renewed) lease.expiresInMs = expiresInMs;
  else lease.lost = true;
  return renewed;
}

function leaseJob(job: Job<Lease>): LeaseCall {
  return job.lease as LeaseCall;
}

function degradedLease(job: Job<Lease>, acquired: boolean): Lease {
  const call = leaseJob(job);
  return new Lease({
    acquired,
    inUse: 0,
    retryAfterMs: 0,
    expiresInMs: 0,
    id: call.leaseId,
    key: call.head.key,
    concurrency: call.concurrency as Concurrency,
    weight: call.weight,
    decisions: job.groups.map((g) => degradedOne(g, acquired)),
    degraded: true,
    held: "none",
  });
}

const ANSWER_LEASE: Answers<Lease> = {
  policy: degradedLease,
  // A semaphore of this process's share of the limit (and of each bucket),
  // run by the package's Lua library.
  local: (local, job) => {
    const call = leaseJob(job);
    let reply: unknown;
    try {
      reply = local.runLease("acquire", call.id, call.head.head, job.groups);
    } catch (error) {
      // A weight above this process's share of the limit: it can't fit here.
      if (error instanceof LocalReplyError) return degradedLease(job, false);
      throw error;
    }
    // What it was decided against: this process's share (its busy and remaining are about that).
    const c = call.concurrency as Concurrency;
    const share = new Concurrency({ limit: local.shareOfLimit(c), leaseMs: c.leaseMs, name: c.name });
    return leaseFromReply(reply, call, job.groups, true, share);
  },
  shed: (job) => {
    const call = leaseJob(job);
    return new Lease({
      acquired: false,
      inUse: 0,
      retryAfterMs: SHED_RETRY_MS,
      expiresInMs: 0,
      id: call.leaseId,
      key: call.head.key,
      concurrency: call.concurrency as Concurrency,
      weight: call.weight,
      decisions: job.groups.map(
        (g) => new Decision(false, 0, SHED_RETRY_MS, 0, g.key, g.bucket, g.amount, { shed: true }),
      ),
      shed: true,
      held: "none",
    });
  },
};

/** Renew, release and inflight decide nothing: no policy answers for them, and a shed one throws. */
function answerNone<T>(call: LeaseCall): Answers<T> {
  const fail = (): T => {
    throw new Error("unreachable: no policy answers for a lease's upkeep");
  };
  return {
    policy: fail,
    local: fail,
    shed: () => {
      throw new Shed(`too busy to get Redis's answer in time for ${call.op} ${JSON.stringify(call.id)}`);
    },
  };
}

// ---- answers without Redis -------------------------------------------------------

function degradedOne(g: Group, allowed: boolean): Decision {
  return new Decision(allowed, 0, 0, 0, g.key, g.bucket, g.amount, { degraded: true });
}

function degradedMany(job: Job<MultiDecision>, allowed: boolean): MultiDecision {
  const decisions = job.groups.map((g) => degradedOne(g, allowed));
  return new MultiDecision(allowed, 0, decisions, { atomic: !job.each, degraded: true });
}

const ANSWER_ONE: Answers<Decision> = {
  policy: (job, allowed) => degradedOne(job.groups[0] as Group, allowed),
  local: (local, job) => {
    const g = job.groups[0] as Group;
    let reply: unknown;
    try {
      reply = local.run(job.op as BucketOp, [g]);
    } catch (error) {
      // A cost above this process's share of max: it can't pass here.
      if (error instanceof LocalReplyError) return degradedOne(g, false);
      throw error;
    }
    const decision =
      job.op === "adjust"
        ? Decision.fromAdjust(reply, g.key, g.bucket, g.amount)
        : Decision.fromReply(reply, g.key, g.bucket, g.amount);
    return decision.with({ degraded: true });
  },
  shed: (job) => {
    const g = job.groups[0] as Group;
    return new Decision(false, 0, SHED_RETRY_MS, 0, g.key, g.bucket, g.amount, { shed: true });
  },
};

const ANSWER_MANY: Answers<MultiDecision> = {
  policy: degradedMany,
  local: (local, job) => {
    let reply: unknown[];
    try {
      reply = local.run("mconsume", job.groups) as unknown[];
    } catch (error) {
      if (error instanceof LocalReplyError) return degradedMany(job, false);
      throw error;
    }
    const decisions = job.groups.map((g, i) =>
      Decision.fromReply(reply[i + 2], g.key, g.bucket, g.amount).with({ degraded: true }),
    );
    return new MultiDecision(Number(reply[0]) === 1, Number(reply[1]), decisions, {
      atomic: !job.each,
      degraded: true,
    });
  },
  shed: (job) => {
    const decisions = job.groups.map(
      (g) => new Decision(false, 0, SHED_RETRY_MS, 0, g.key, g.bucket, g.amount, { shed: true }),
    );
    return new MultiDecision(false, SHED_RETRY_MS, decisions, { atomic: !job.each, shed: true });
  },
};

/**
 * Buckets given as `[key, bucket]` or `[key, bucket, cost]`, checked in the
 * module's order: their count, then each left to right.
 */
function checkGroups(list: readonly unknown[]): Group[] {
  if (list.length > MAX_GROUPS) throw refusal("groups", "too_many_groups");
  return list.map((entry, i) => {
    if (!Array.isArray(entry) || entry.length < 2 || entry.length > 3) {
      throw new TypeError(`group ${i + 1}: expected [key, bucket] or [key, bucket, cost]`);
    }
    const [key, bucket, cost] = entry as [Key, Bucket, Amount | undefined];
    checkBucket(bucket, i + 1);
    return { key, id: keyId(key, i + 1), bucket, amount: checkCost(cost ?? 1, bucket, i + 1) };
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

function checkLease(lease: unknown): void {
  if (!(lease instanceof Lease)) throw new TypeError("expected a Lease (what acquire returns)");
}

function checkWork(work: unknown): void {
  if (typeof work !== "function") throw new TypeError("hold and keep take the work as a function of the lease");
}

function checkBucket(bucket: unknown, group?: number): void {
  if (!(bucket instanceof Bucket)) {
    const where = group === undefined ? "" : ` (group ${group})`;
    throw new TypeError(`expected a Bucket${where}, got ${bucket === null ? "null" : typeof bucket}`);
  }
}

function checkTimeout(timeoutMs: unknown, nullable: boolean): number | null {
  if (timeoutMs === null && nullable) return null;
  if (typeof timeoutMs === "number" && timeoutMs > 0 && timeoutMs < 2 ** 31) return timeoutMs;
  throw new RangeError(
    `timeoutMs must be a number of ms > 0${nullable ? ", or null for the client's own timeouts" : ""}, got ${String(timeoutMs)}`,
  );
}

function checkOnError(onError: unknown): OnError {
  const found = ON_ERROR.find((p) => p === onError);
  if (found === undefined)
    throw new RangeError(`onError must be one of ${ON_ERROR.join(", ")}, got ${String(onError)}`);
  return found;
}
