// Decision events: what the `onDecision` hook of a limiter receives, once
// per decision, for metrics (docs/failure-model.md, Decision events).

import type { BreakerState } from "./breaker.js";

/** One decision, as metrics see it: the fields of the Python package's DecisionEvent. */
export interface DecisionEvent {
  /**
   * "consume", "peek", "adjust", "consume_many" or "acquire" (the Python
   * package's names, so dashboards match). Renewals, releases and
   * in-flight reads decide nothing and make no event.
   */
  readonly op: "consume" | "peek" | "adjust" | "consume_many" | "acquire";
  /**
   * The names of the buckets, joined by "," ("" if unnamed); an acquire's
   * Concurrency name first. `allowed` is an acquire's `acquired`.
   */
  readonly policy: string;
  readonly allowed: boolean;
  readonly degraded: boolean;
  readonly shed: boolean;
  readonly cached: boolean;
  /**
   * "module", "functions", "eval", "local" (the in-process buckets of
   * onError "local"), or "" when no backend answered (a shed call, a policy
   * answer, a cached denial before any call).
   */
  readonly backend: string;
  /** Milliseconds the call took, waiting included. */
  readonly latencyMs: number;
  /** The breaker's state after the call ("closed" without a breaker). */
  readonly breaker: BreakerState;
  /**
   * envoyproxy/ratelimit's names for its stats: "over_limit" (denied),
   * "shadow_mode" (a denial shadow mode let through), "near_limit"
   * (admitted, and what is used of a bucket, a quota or a lease's slots has
   * reached the limiter's `nearLimitRatio` of it), else "within_limit" (a
   * degraded admission has no numbers to judge).
   */
  readonly outcome: Outcome;
  /**
   * The name of the rule that decided ("" if unnamed): the denying bucket
   * with the longest wait, else the one with the least share left; an
   * acquire's Concurrency unless a bucket denied it with a slot free.
   */
  readonly rule: string;
}

export type Outcome = "within_limit" | "near_limit" | "over_limit" | "shadow_mode";

/** envoyproxy/ratelimit's NEAR_LIMIT_RATIO default. */
export const DEFAULT_NEAR_LIMIT_RATIO = 0.8;
