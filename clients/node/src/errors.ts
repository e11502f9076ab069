// The limiter's own errors (invalid arguments are `InvalidArgument`, a
// RangeError, in bucket.ts). Branded (brand.ts): `instanceof` holds
// across the ESM and CommonJS builds.

import { brand } from "./brand.js";

/** Base class of the limiter's own errors. */
export class LimiterError extends Error {
  static {
    brand(LimiterError);
  }
  constructor(text: string, options?: { cause?: unknown }) {
    super(text, options);
    this.name = new.target.name;
  }
}

/**
 * No backend could serve the call: the server has no TB.* commands, refuses
 * the Functions library, and refuses EVAL too (or the forced backend is
 * refused). `causes` holds each backend's error. A usage error: no
 * `onError` policy applies.
 */
export class NoBackendError extends LimiterError {
  static {
    brand(NoBackendError);
  }
  readonly causes: ReadonlyArray<readonly [string, unknown]>;
  constructor(causes: ReadonlyArray<readonly [string, unknown]>) {
    const detail = causes.map(([name, e]) => `${name}: ${e instanceof Error ? e.message : String(e)}`).join("; ");
    super(`no rate-limit backend answered (${detail})`);
    this.causes = causes;
  }
}

/**
 * A request with no identity for a rule (its key function, and its
 * `fallback`, returned undefined) that is not `optional`: it is refused
 * with a 400 (`body`, a problem) before anything is sent to Redis, so that
 * leaving out a header never escapes a limit.
 */
export class MissingIdentity extends LimiterError {
  static {
    brand(MissingIdentity);
  }
  readonly policy: string;
  readonly status = 400;
  constructor(policy: string) {
    super(`rule ${policy}: missing (its key function)`);
    this.policy = policy;
  }
  get body(): Record<string, unknown> {
    return { type: "about:blank", title: "Bad Request", status: 400, detail: `The ${this.policy} key is missing.` };
  }
}

/**
 * A request a rule with a `Deny` refuses, before anything is sent to
 * Redis: a 429 with the rule's RateLimit fields (`q=0`, `r=0`),
 * Retry-After (`retryAfter` seconds) and a problem+json `body`.
 */
export class AlwaysDenied extends LimiterError {
  static {
    brand(AlwaysDenied);
  }
  readonly policy: string;
  readonly retryAfter: number;
  readonly status = 429;
  constructor(policy: string, retryAfter: number) {
    super(`rule ${policy}: denies every request`);
    this.policy = policy;
    this.retryAfter = retryAfter;
  }
  get headers(): Record<string, string> {
    const { policy, retryAfter } = this;
    return {
      "RateLimit-Policy": `"${policy}";q=0`,
      RateLimit: `"${policy}";r=0;t=${retryAfter}`,
      "Retry-After": String(retryAfter),
    };
  }
  get body(): Record<string, unknown> {
    return {
      type: "https://iana.org/assignments/http-problem-types#quota-exceeded",
      title: "Request cannot be satisfied as assigned quota has been exceeded",
      status: 429,
      detail: `Rate limited by ${this.policy}: retry in ${this.retryAfter} s.`,
      "violated-policies": [this.policy],
    };
  }
}

/**
 * `consumeMany(..., { atomic: true })` on a Redis Cluster with keys in more
 * than one hash slot: one atomic call can't reach them all.
 */
export class CrossSlotError extends LimiterError {
  static {
    brand(CrossSlotError);
  }
}

/**
 * Thrown instead of calling Redis while the circuit breaker is open (Redis
 * failed several times lately) and the policy is "raise".
 */
export class CircuitOpenError extends LimiterError {
  static {
    brand(CircuitOpenError);
  }
}

/**
 * Redis got the command and sent no reply within the budget (a Redis
 * failure: the policy applies).
 */
export class RedisTimeoutError extends LimiterError {
  static {
    brand(RedisTimeoutError);
  }
}

/**
 * An admitted decision that fewer replicas than the limiter's
 * `waitReplicas` acknowledged within `waitTimeoutMs` (the WAIT behind it):
 * a failover now could lose the token it charged, so Redis is failing for
 * this call and its `onError` policy answers (docs/operations.md, "What a
 * failover costs"). `acked` is how many did (-1 when WAIT got no answer).
 */
export class ReplicaWaitError extends LimiterError {
  static {
    brand(ReplicaWaitError);
  }
  readonly acked: number;
  constructor(text: string, acked: number, options?: { cause?: unknown }) {
    super(text, options);
    this.acked = acked;
  }
}

/**
 * The call could not get its decision in time for a local reason (the
 * event loop too far behind): the process is overloaded, Redis did not
 * fail. Never admitted; a limiter turns it into a shed decision.
 */
export class Shed extends LimiterError {
  static {
    brand(Shed);
  }
}
