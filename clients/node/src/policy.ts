// The failure policy (docs/failure-model.md): how a Job runs against
// Redis, through the breaker, and what it answers when Redis can't. An
// error is classified (classify.ts): a usage error is thrown, local
// overload sheds (refused, never admitted, never counted), a Redis failure
// counts for the breaker and gets the call's policy: "raise" (thrown),
// "open" (admitted, degraded), "closed" (denied, degraded), "local" (the
// process's own buckets, local.ts). Releases and renewals of leases are
// sent whatever the breaker says and never count for it; an acquire that
// got no answer is followed by a best-effort release of its id. An
// admission too few replicas acknowledged (the limiter's waitReplicas,
// replicas.ts) is a Redis failure too; a denial they missed stands. The
// Python package's twin is _policy.py; clients/spec holds the scenarios
// all the clients run.

import { type Breaker, CALL, PROBE, SKIP } from "./breaker.js";
import { classify } from "./classify.js";
import { Decision, MultiDecision } from "./decision.js";
import type { IO, Logger } from "./engine.js";
import { CircuitOpenError, Shed } from "./errors.js";
import { Concurrency, Lease } from "./lease.js";
import { LocalBuckets, LocalReplyError } from "./local.js";
import {
  type Context,
  type Job,
  type LeaseCall,
  leaseFromReply,
  type OnError,
  type OneOp,
  releaseUnanswered,
} from "./requests.js";
import { type Group, manyOp, ruleOp } from "./scripts.js";

/** What a shed decision tells the client to wait (HTTP Retry-After: 1). */
export const SHED_RETRY_MS = 1000;

const OUTCOME: Record<OnError, string> = {
  open: "admitted",
  closed: "denied",
  local: "local buckets",
  raise: "raised",
};

export class FailurePolicy {
  private local: Promise<LocalBuckets> | undefined;
  private readonly lastReport = new Map<OnError, number>();
  private readonly unreported = new Map<OnError, number>();

  constructor(
    private readonly ctx: Context,
    readonly breaker: Breaker | undefined,
    readonly processes: number,
    private readonly logger: Logger,
  ) {}

  /** Runs a Job's plan through the breaker; what a failure means, answered. */
  async run<T>(job: Job<T>, io: IO): Promise<T> {
    if (job.op === "renew" || job.op === "release") return this.upkeep(job, io);
    const breaker = this.breaker;
    const mode = breaker ? breaker.enter() : CALL;
    if (mode === SKIP) return this.openCircuit(job);
    let result: T;
    try {
      result = await job.plan(io);
    } catch (error) {
      return this.failed(error, job, mode === PROBE, io);
    }
    const short = io.wait?.shortfall();
    if (short !== undefined) {
      // Too few replicas have it: an admission could be lost in a
      // failover (a token minted), so Redis is failing for this call; a
      // denial stands (losing it mints nothing), with no news of Redis.
      if (admitted(result)) return this.failed(short, job, mode === PROBE, io);
      breaker?.release(mode === PROBE);
      return result;
    }
    if (breaker && mode === PROBE) breaker.success(true);
    return result;
  }

  /**
   * A lease's renewal or release: sent even while the breaker is open (a
   * stream that ends must free its slot at once, Redis may well be there),
   * within its budget, and never counted for the breaker either way. Its
   * errors are thrown: no policy answers for it.
   */
  private async upkeep<T>(job: Job<T>, io: IO): Promise<T> {
    try {
      return await job.plan(io);
    } catch (error) {
      if (classify(error) === "shed") throw shedError(job, error);
      throw error;
    }
  }

  /**
   * What an error of a call means: a usage error is thrown, local overload
   * sheds, a Redis failure counts for the breaker and gets the job's policy.
   */
  private async failed<T>(error: unknown, job: Job<T>, probe: boolean, io: IO): Promise<T> {
    const kind = classify(error);
    const breaker = this.breaker;
    if (kind === "usage") {
      breaker?.success(probe); // Redis answered, if only to refuse
      throw error;
    }
    // A Redis failure, or a shed of a command already handed to the
    // client (it may go out yet): the acquire may have taken its slot.
    if (job.lease?.op === "acquire" && (kind === "failure" || error instanceof Shed)) {
      await this.releaseUnanswered(job.lease, io);
    }
    if (kind === "shed") {
      breaker?.release(probe);
      job.source = "";
      return answersOf(job).shed(job, error);
    }
    breaker?.failure(probe);
    return this.policy(job, error);
  }

  /** Best effort: a release Redis can't take leaves the lease to expire by itself. */
  private async releaseUnanswered(call: LeaseCall, io: IO): Promise<void> {
    try {
      await releaseUnanswered(this.ctx, call, io);
    } catch {
      // It expires within its lease_ms, as a crashed holder's would.
    }
  }

  /** The job's answer while Redis is failing (`error`), logged. */
  private async policy<T>(job: Job<T>, error: unknown): Promise<T> {
    if (job.onError === "raise") throw error;
    this.report(error, job);
    if (job.onError === "local") {
      job.source = "local";
      return answersOf(job).local(await this.localBuckets(), job);
    }
    job.source = "";
    return answersOf(job).policy(job, job.onError === "open");
  }

  /** The breaker is open: the policy at once, no network. */
  private openCircuit<T>(job: Job<T>): Promise<T> {
    const failures = this.breaker?.failures ?? 0;
    return this.policy(job, new CircuitOpenError(`the circuit breaker is open: Redis failed ${failures} times lately`));
  }

  /** The in-process buckets of onError "local", made on first use. */
  localBuckets(): Promise<LocalBuckets> {
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
    const tail = more ? ` (${more} more degraded answers since the last report)` : "";
    this.logger.error(
      `rate limiter unavailable (fail-${policy}: ${OUTCOME[policy]}) for ${describe(job)}: ${reason(error)}${tail}`,
    );
  }
}

/** Whether a call's answer admits: a decision, or a lease acquired. */
function admitted(result: unknown): boolean {
  if (result instanceof Lease) return result.acquired;
  return (result as Decision | MultiDecision).allowed === true;
}

function reason(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

/** What a log line says the call was about: its op and keys. */
function describe(job: Job<unknown>): string {
  const ids = job.lease === undefined ? [] : [job.lease.id];
  return `${job.op} ${[...ids, ...job.groups.map((g) => g.id)].map((id) => JSON.stringify(id)).join(", ")}`;
}

function shedError(job: Job<unknown>, cause: unknown): Shed {
  const what = job.lease === undefined ? job.op : `${job.op} ${JSON.stringify(job.lease.id)}`;
  return new Shed(`too busy to get Redis's answer in time for ${what}`, { cause });
}

// ---- answers without Redis -----------------------------------------------------------

interface Answers<T> {
  policy(job: Job<T>, allowed: boolean): T;
  local(local: LocalBuckets, job: Job<T>): T;
  shed(job: Job<T>, cause: unknown): T;
}

function answersOf<T>(job: Job<T>): Answers<T> {
  switch (job.op) {
    case "consume":
    case "peek":
    case "adjust":
      return ANSWER_ONE as unknown as Answers<T>;
    case "consume_many":
      return ANSWER_MANY as unknown as Answers<T>;
    case "acquire":
      return ANSWER_LEASE as unknown as Answers<T>;
    default:
      return ANSWER_NONE as Answers<T>;
  }
}

function degradedOne(g: Group, allowed: boolean): Decision {
  return new Decision(allowed, 0, 0, 0, g.key, g.bucket, g.amount, { degraded: true });
}

function shedOne(g: Group): Decision {
  return new Decision(false, 0, SHED_RETRY_MS, 0, g.key, g.bucket, g.amount, { shed: true });
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
      reply = local.run(ruleOp(job.op as OneOp, g.bucket), [g]);
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
  shed: (job) => shedOne(job.groups[0] as Group),
};

const ANSWER_MANY: Answers<MultiDecision> = {
  policy: degradedMany,
  local: (local, job) => {
    let reply: unknown[];
    try {
      reply = local.run(manyOp(job.groups, job.wait), job.groups, job.wait) as unknown[];
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
  shed: (job) => new MultiDecision(false, SHED_RETRY_MS, job.groups.map(shedOne), { atomic: !job.each, shed: true }),
};

function madeUpLease(job: Job<Lease>, acquired: boolean, retryAfterMs: number, flag: "degraded" | "shed"): Lease {
  const call = job.lease as LeaseCall;
  return new Lease({
    acquired,
    inUse: 0,
    retryAfterMs,
    expiresInMs: 0,
    id: call.leaseId,
    key: call.head.key,
    concurrency: call.concurrency as Concurrency,
    weight: call.weight,
    decisions: job.groups.map((g) => (flag === "shed" ? shedOne(g) : degradedOne(g, acquired))),
    degraded: flag === "degraded",
    shed: flag === "shed",
    held: "none",
  });
}

const ANSWER_LEASE: Answers<Lease> = {
  policy: (job, allowed) => madeUpLease(job, allowed, 0, "degraded"),
  // A semaphore of this process's share of the limit (and of each bucket),
  // run by the package's Lua library.
  local: (local, job) => {
    const call = job.lease as LeaseCall;
    let reply: unknown;
    try {
      reply = local.runLease("acquire", call.id, call.head.head, job.groups);
    } catch (error) {
      // A weight above this process's share of the limit: it can't fit here.
      if (error instanceof LocalReplyError) return madeUpLease(job, false, 0, "degraded");
      throw error;
    }
    // What it was decided against: this process's share (its busy and remaining are about that).
    const c = call.concurrency as Concurrency;
    const share = new Concurrency({ limit: local.shareOfLimit(c), leaseMs: c.leaseMs, name: c.name });
    return leaseFromReply(reply, call, job.groups, true, share);
  },
  shed: (job) => madeUpLease(job, false, SHED_RETRY_MS, "shed"),
};

/** detect, inFlight and reset decide nothing: no policy answers for them (they raise), and a shed one throws. */
const ANSWER_NONE: Answers<unknown> = {
  policy: () => {
    throw new Error("unreachable: no policy answers for a call that decides nothing");
  },
  local: () => {
    throw new Error("unreachable: no policy answers for a call that decides nothing");
  },
  shed: (job, cause) => {
    throw shedError(job, cause);
  },
};
