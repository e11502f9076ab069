/**
 * The penalty (rate-limiter-flexible's `blockDuration`): a denied caller
 * is refused for `blockMs`, built on TB.ADJUST's debt. On a denial the
 * bucket is charged what lengthens the denial's wait to the block:
 * `rate * (blockMs - retryAfterMs) / 1000` tokens, so a call of the same
 * cost passes `blockMs` after the denial.
 *
 * The module floors a balance at `-max`, and a call of cost `c` passes
 * once the balance is back at `c`: from the floor that takes
 * `(max + c) / rate` seconds, the longest block the bucket can hold; a
 * longer one is refused when it is written. Python's twin is _penalty.py.
 */

import { Bucket, InvalidArgument, number } from "./bucket.js";
import { Decision } from "./decision.js";

/** `blockMs` (undefined: no penalty) checked against what the bucket's floor holds for a call of `cost`. */
export function checkBlock(blockMs: unknown, bucket: unknown, cost: number): number | undefined {
  if (blockMs === undefined) return undefined;
  const ms = number(blockMs, "blockMs");
  if (!(ms > 0)) throw new InvalidArgument("blockMs", `blockMs must be > 0, got ${String(blockMs)}`);
  if (!(bucket instanceof Bucket)) {
    throw new InvalidArgument("blockMs", "blockMs needs a Bucket: a Quota's period ends when it ends");
  }
  const bound = (1000 * (bucket.max + cost)) / bucket.rate;
  if (ms > bound) {
    throw new InvalidArgument(
      "blockMs",
      `blockMs ${ms} is longer than this bucket can hold: TB.ADJUST's debt stops at -max, ` +
        `so a call of cost ${cost} waits at most 1000 * (max + cost) / rate = ${bound} ms`,
    );
  }
  return ms;
}

/**
 * The tokens to charge for this decision: 0 unless Redis denied it now
 * (not admitted, shadow, cached, shed or made up by the failure policy)
 * and the bucket is not in debt already (a block running: its denials
 * must not lengthen it).
 */
export function penalty(d: Decision, blockMs: number): number {
  if (d.allowed || d.shadow || d.cached || d.shed || d.degraded) return 0;
  if (d.remaining < 0 || !(d.bucket instanceof Bucket)) return 0;
  const wait = blockMs - d.retryAfterMs;
  return wait > 0 ? (d.bucket.rate * wait) / 1000 : 0;
}

/**
 * The denial as the penalty left it: TB.ADJUST's balance and reset time,
 * and the block's wait. A penalty whose TB.ADJUST failed (the failure
 * policy answered) leaves the denial as it was.
 */
export function penalized(d: Decision, adjusted: Decision, blockMs: number): Decision {
  if (adjusted.degraded || adjusted.shed) return d;
  const retry = Math.max(d.retryAfterMs, Math.ceil(blockMs));
  return new Decision(false, adjusted.remaining, retry, adjusted.resetAfterMs, d.key, d.bucket, d.cost, {
    degraded: d.degraded,
    cached: d.cached,
    shed: d.shed,
    shadow: d.shadow,
  });
}
