// The circuit breaker: once Redis has failed often enough lately, calls get
// their failure policy at once, without a try and without a timeout's cost,
// until a probe finds Redis back (docs/failure-model.md).

import { brand } from "./brand.js";

export type BreakerState = "closed" | "open" | "half_open";

/** What `enter` tells a call to do. */
export const CALL = 0; // ask Redis
export const PROBE = 1; // ask Redis, as the one probe of a half-open breaker
export const SKIP = 2; // don't: the breaker is open, answer by the policy

export interface BreakerOptions {
  /** Redis failures within `windowMs` that open the breaker (default 5). */
  failures?: number;
  /** The window, in ms (default 10,000). */
  windowMs?: number;
  /** How long it stays open before one call probes Redis, in ms (default 2,000). */
  cooldownMs?: number;
  /** A monotonic clock in ms (tests pass a fake one). */
  clock?: () => number;
}

/**
 * Opens after `failures` Redis failures within `windowMs`; after
 * `cooldownMs` open, one call probes Redis (half-open) while the others
 * still get the policy; the probe's success closes it, its failure opens it
 * for another cooldown. Only Redis failures count: usage errors and shed
 * calls (local overload) never do.
 *
 * The defaults (5 failures in 10 s, 2 s cooldown) fit a request path: a
 * dead or frozen Redis costs a handful of calls their timeout, then nothing.
 */
export class Breaker {
  static {
    brand(Breaker);
  }
  readonly failures: number;
  readonly windowMs: number;
  readonly cooldownMs: number;
  private readonly clock: () => number;
  private current: BreakerState = "closed";
  private recent: number[] = [];
  private openedAt = 0;
  private probeAt: number | undefined; // when the running probe started

  constructor(options: BreakerOptions = {}) {
    const { failures = 5, windowMs = 10_000, cooldownMs = 2_000, clock = () => performance.now() } = options;
    if (!(Number.isInteger(failures) && failures >= 1)) throw new RangeError("failures must be an integer >= 1");
    if (!(windowMs > 0 && Number.isFinite(windowMs))) throw new RangeError("windowMs must be > 0");
    if (!(cooldownMs > 0 && Number.isFinite(cooldownMs))) throw new RangeError("cooldownMs must be > 0");
    this.failures = failures;
    this.windowMs = windowMs;
    this.cooldownMs = cooldownMs;
    this.clock = clock;
  }

  get state(): BreakerState {
    return this.current;
  }

  /** CALL, PROBE or SKIP for the call about to be made. */
  enter(): number {
    if (this.current === "closed") return CALL;
    const now = this.clock();
    if (this.current === "open") {
      if (now - this.openedAt < this.cooldownMs) return SKIP;
      this.current = "half_open";
    }
    // Half-open: one probe at a time; a probe that never reported is
    // replaced after a cooldown.
    if (this.probeAt !== undefined && now - this.probeAt < this.cooldownMs) return SKIP;
    this.probeAt = now;
    return PROBE;
  }

  /** Redis answered (a decision, or a usage error: it is there). */
  success(probe: boolean): void {
    if (probe || this.current !== "closed") {
      this.current = "closed";
      this.recent = [];
      this.probeAt = undefined;
    }
  }

  /** Redis failed this call. */
  failure(probe: boolean): void {
    const now = this.clock();
    if (probe || this.current !== "closed") {
      this.open(now);
      return;
    }
    this.recent.push(now);
    while (this.recent.length > 0 && now - (this.recent[0] as number) > this.windowMs) this.recent.shift();
    if (this.recent.length >= this.failures) this.open(now);
  }

  /** The call ended without news of Redis (shed): let another probe. */
  release(probe: boolean): void {
    if (probe) this.probeAt = undefined;
  }

  private open(now: number): void {
    this.current = "open";
    this.openedAt = now;
    this.probeAt = undefined;
    this.recent = [];
  }
}
