// The replica wait (the `waitReplicas` option): `WAIT n ms` pipelined
// behind each command that can mint a token (consume, consumeMany,
// acquire), on the same connection, in the same round trip. Redis
// replicates asynchronously: a decision its replicas never saw is lost in
// a failover, and the token it charged is minted again. An admitted
// decision that too few replicas acknowledged is Redis failing (the
// call's onError answers, the breaker counts it); a denial stands as it
// is: losing it mints nothing. docs/operations.md, "What a failover costs".

import type { Arg } from "./adapters.js";
import { classify } from "./classify.js";
import { ReplicaWaitError } from "./errors.js";

/** `waitReplicas`: an integer >= 0 (0: no WAIT). */
export function checkWaitReplicas(value: unknown): number {
  if (typeof value === "number" && Number.isInteger(value) && value >= 0 && value < 2 ** 31) return value;
  throw new RangeError(`waitReplicas must be an integer >= 0 (0: off), got ${String(value)}`);
}

/** `waitTimeoutMs`: whole ms > 0 (WAIT's 0 would block for ever). */
export function checkWaitTimeout(value: unknown): number {
  if (typeof value === "number" && Number.isInteger(value) && value > 0 && value < 2 ** 31) return value;
  throw new RangeError(`waitTimeoutMs must be an integer number of ms > 0, got ${String(value)}`);
}

/**
 * One call's WAITs: what the last one answered. WAIT counts the replicas
 * that acknowledged every write this connection made before it, so the
 * last one covers the call's earlier commands too (consumeMany bucket by
 * bucket sends several).
 */
export class ReplicaWait {
  private acked: number | undefined;
  private error: unknown;

  constructor(
    readonly replicas: number,
    readonly timeoutMs: number,
  ) {}

  get args(): Arg[] {
    return ["WAIT", String(this.replicas), String(this.timeoutMs)];
  }

  /**
   * The decision's reply, once its WAIT has answered too: the WAIT's
   * outcome is kept for `shortfall`. The WAIT's own error is never thrown
   * here: it matters only if the decision admitted.
   */
  async settle(reply: Promise<unknown>, wait: Promise<unknown>): Promise<unknown> {
    wait.catch(() => {}); // read below, or moot if the decision's reply failed
    const value = await reply;
    try {
      const n = await wait;
      this.acked = typeof n === "number" || typeof n === "string" ? Number(n) : -1;
      this.error = undefined;
    } catch (error) {
      this.acked = -1;
      this.error = error;
    }
    return value;
  }

  /**
   * Why an admitted decision can't stand: undefined if enough replicas
   * acknowledged it (or no WAIT was sent). A WAIT refused as a usage error
   * (an ACL without WAIT, a replica's address given as the primary) is
   * that error, thrown whatever the policy.
   */
  shortfall(): unknown {
    if (this.acked === undefined || this.acked >= this.replicas) return undefined;
    if (this.error !== undefined) {
      if (classify(this.error) === "usage") return this.error;
      return new ReplicaWaitError(
        `the WAIT for ${this.replicas} replica(s) behind the decision failed: ${text(this.error)}`,
        -1,
        { cause: this.error },
      );
    }
    return new ReplicaWaitError(
      `${this.acked} of the ${this.replicas} replica(s) asked for acknowledged the decision within ${this.timeoutMs} ms`,
      this.acked,
    );
  }
}

function text(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
