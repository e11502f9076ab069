// What a call answers.

import { brand } from "./brand.js";
import type { Key } from "./bucket.js";
import type { Rule } from "./quota.js";

/** Milliseconds as whole seconds, rounded up: waiting that long always suffices. */
export function wholeSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
}

export interface Flags {
  degraded?: boolean;
  cached?: boolean;
  shed?: boolean;
  /** A bucket's denial let through by shadow mode: admitted, `retryAfterMs` 0. */
  shadow?: boolean;
}

/**
 * One bucket's answer: TB.CONSUME's `[allowed, remaining, retry_after_ms,
 * reset_after_ms]` with the call that produced it.
 *
 * `degraded` marks an answer made up by the failure policy because Redis
 * failed (`allowed` is the policy's, numbers 0; or the in-process bucket's
 * for "local"). `shed` marks a refusal because this process was too busy
 * to get Redis's answer in time (never admitted; `retryAfterMs` is a short
 * back-off). `cached` marks a denial answered from the denial cache without
 * a round trip. `shadow` marks a denial let through by shadow mode (a
 * call's `shadow`, or a shadow limiter): admitted, `retryAfterMs` 0, the
 * other numbers the bucket's. For `adjust`, `cost` holds the delta, and `allowed` and
 * `retryAfterMs` are about the next request of cost 1 (or `max`, if
 * smaller): whether it would pass now, else when it will.
 *
 * `retryAfterMs` is 0 whenever `allowed`, except for an admitted
 * reservation (`maxWaitMs`): then it is the wait before the caller may go
 * ahead, also given as `delayMs` (0 for every other answer).
 */
export class Decision {
  static {
    brand(Decision);
  }
  readonly allowed: boolean;
  /** Whole tokens left, negative while in debt. */
  readonly remaining: number;
  /** When denied, the earliest ms at which the same request passes; when allowed, the reservation's delay (else 0). */
  readonly retryAfterMs: number;
  /** Until the bucket is full again. */
  readonly resetAfterMs: number;
  readonly key: Key;
  readonly bucket: Rule;
  readonly cost: number;
  readonly degraded: boolean;
  readonly cached: boolean;
  readonly shed: boolean;
  readonly shadow: boolean;

  constructor(
    allowed: boolean,
    remaining: number,
    retryAfterMs: number,
    resetAfterMs: number,
    key: Key,
    bucket: Rule,
    cost: number,
    flags: Flags = {},
  ) {
    this.allowed = allowed;
    this.remaining = remaining;
    this.retryAfterMs = retryAfterMs;
    this.resetAfterMs = resetAfterMs;
    this.key = key;
    this.bucket = bucket;
    this.cost = cost;
    this.degraded = flags.degraded ?? false;
    this.cached = flags.cached ?? false;
    this.shed = flags.shed ?? false;
    this.shadow = flags.shadow ?? false;
  }

  /** The name of the rule that decided: this bucket's (or quota's). */
  get rule(): string | undefined {
    return this.bucket.name;
  }

  /** A reply `[allowed, remaining, retry_after_ms, reset_after_ms]`. */
  static fromReply(reply: unknown, key: Key, bucket: Rule, cost: number): Decision {
    if (!Array.isArray(reply) || reply.length !== 4) {
      throw new TypeError(`unexpected reply from Redis: ${JSON.stringify(reply)}`);
    }
    const [allowed, remaining, retry, reset] = reply.map(Number) as [number, number, number, number];
    return new Decision(allowed === 1, remaining, retry, reset, key, bucket, cost);
  }

  /** TB.ADJUST's reply, whose `allowed` is always 1 and whose retry time is
   * for a request of cost 1 (or `max`): admitted is what that request would be. */
  static fromAdjust(reply: unknown, key: Key, bucket: Rule, delta: number): Decision {
    const d = Decision.fromReply(reply, key, bucket, delta);
    return d.with({ allowed: d.retryAfterMs === 0 });
  }

  /** An admitted reservation's wait (ms) before going ahead; 0 for a denial or a plain admission. */
  get delayMs(): number {
    return this.allowed ? this.retryAfterMs : 0;
  }

  /** `retryAfterMs` in whole seconds, rounded up (HTTP Retry-After). */
  get retryAfter(): number {
    return wholeSeconds(this.retryAfterMs);
  }

  /** Until this bucket matters again: the retry time when it denies, else until full. */
  get waitMs(): number {
    return this.allowed ? this.resetAfterMs : this.retryAfterMs;
  }

  /** A copy with some fields changed. */
  with(changes: Partial<Pick<Decision, "allowed" | "retryAfterMs" | "resetAfterMs">> & Flags): Decision {
    return new Decision(
      changes.allowed ?? this.allowed,
      this.remaining,
      changes.retryAfterMs ?? this.retryAfterMs,
      changes.resetAfterMs ?? this.resetAfterMs,
      this.key,
      this.bucket,
      this.cost,
      {
        degraded: changes.degraded ?? this.degraded,
        cached: changes.cached ?? this.cached,
        shed: changes.shed ?? this.shed,
        shadow: changes.shadow ?? this.shadow,
      },
    );
  }
}

export interface MultiFlags extends Flags {
  atomic?: boolean;
  /** The optional HTTP rules skipped for a request with no identity. */
  skipped?: readonly string[];
}

/**
 * The answer of `consumeMany`: all rules charged, or none. `decisions`
 * has one Decision per bucket (or quota), in call order; each says whether that
 * bucket alone could pay. `retryAfterMs` is the largest of theirs. `atomic`
 * is false when the buckets were charged one by one (keys in several
 * Cluster slots).
 */
export class MultiDecision {
  static {
    brand(MultiDecision);
  }
  readonly allowed: boolean;
  readonly retryAfterMs: number;
  readonly decisions: readonly Decision[];
  readonly atomic: boolean;
  readonly degraded: boolean;
  readonly cached: boolean;
  readonly shed: boolean;
  /** A denial let through by shadow mode; each of `decisions` still says whether its bucket could pay. */
  readonly shadow: boolean;
  /** The optional HTTP rules skipped for a request with no identity. */
  readonly skipped: readonly string[];

  constructor(allowed: boolean, retryAfterMs: number, decisions: readonly Decision[], flags: MultiFlags = {}) {
    this.allowed = allowed;
    this.skipped = flags.skipped ?? [];
    this.retryAfterMs = retryAfterMs;
    this.decisions = decisions;
    this.atomic = flags.atomic ?? true;
    this.degraded = flags.degraded ?? false;
    this.cached = flags.cached ?? false;
    this.shed = flags.shed ?? false;
    this.shadow = flags.shadow ?? false;
  }

  /** The name of the rule that decided: the tightest bucket's (undefined without decisions). */
  get rule(): string | undefined {
    return this.decisions.length > 0 ? this.tightest.bucket.name : undefined;
  }

  get retryAfter(): number {
    return wholeSeconds(this.retryAfterMs);
  }

  /** With `maxWaitMs`, admitted: the wait before going ahead (the longest reservation's); else 0. */
  get delayMs(): number {
    return this.allowed ? this.retryAfterMs : 0;
  }

  /** The buckets that could not pay. */
  get deniedBy(): Decision[] {
    return this.decisions.filter((d) => !d.allowed);
  }

  /**
   * The most restrictive bucket: a denying one with the longest wait, else
   * the one with the smallest share of its capacity left.
   */
  get tightest(): Decision {
    let best = this.decisions[0] as Decision;
    const rank = (d: Decision): [number, number, number] => [
      d.allowed ? 0 : 1,
      d.retryAfterMs,
      -d.remaining / d.bucket.max,
    ];
    let bestRank = rank(best);
    for (const d of this.decisions.slice(1)) {
      const r = rank(d);
      if (
        r[0] > bestRank[0] ||
        (r[0] === bestRank[0] && (r[1] > bestRank[1] || (r[1] === bestRank[1] && r[2] > bestRank[2])))
      ) {
        best = d;
        bestRank = r;
      }
    }
    return best;
  }
}
