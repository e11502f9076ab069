// Keeping a lease while its work runs: what `hold`, `keep` and the
// framework helpers use. The lease is renewed in the background about
// every leaseMs / 3 (timers, so the work never waits for a renewal); a
// renewal that finds the lease gone sets `lease.lost` and stops; `end()`
// stops the renewals and releases the lease. A renewal or a release that
// fails (Redis unreachable) is logged: the first is tried again a third of
// a lease later, the second leaves the lease to expire.

import type { Logger } from "./engine.js";
import type { Lease } from "./lease.js";

/** What a keeper needs of the limiter. */
export interface LeaseCalls {
  renew(lease: Lease): Promise<boolean>;
  release(lease: Lease): Promise<boolean>;
}

/** A lease being renewed until `end()`. */
export interface LeaseKeeper {
  readonly lease: Lease;
  /**
   * Stops renewing and releases the lease: once (later calls return the
   * same promise), after any renewal in flight, so none lands after the
   * release. Never rejects: a release that fails is logged, and the lease
   * left to expire.
   */
  end(): Promise<void>;
}

/** Ms between renewals: a third of the lease, so two renewals can fail before it expires. */
export function renewEvery(lease: Lease): number {
  return lease.concurrency.leaseMs / 3;
}

function describe(lease: Lease): string {
  return `lease ${JSON.stringify(String(lease.id))} on ${JSON.stringify(String(lease.key))}`;
}

function reason(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

export class Keeper implements LeaseKeeper {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private renewing: Promise<void> | undefined;
  private ending: Promise<void> | undefined;

  constructor(
    private readonly calls: LeaseCalls,
    readonly lease: Lease,
    private readonly logger: Logger,
  ) {
    this.schedule();
  }

  private schedule(): void {
    if (this.ending !== undefined || this.lease.lost) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.renewing = this.renew().finally(() => {
        this.renewing = undefined;
        this.schedule();
      });
    }, renewEvery(this.lease));
    // Renewals never keep a process alive by themselves.
    this.timer.unref?.();
  }

  private async renew(): Promise<void> {
    const lease = this.lease;
    try {
      if (!(await this.calls.renew(lease))) {
        this.logger.warn(
          `rate limiter: ${describe(lease)} is lost: a renewal found it expired or released; its slot is no longer held`,
        );
      }
    } catch (error) {
      this.logger.warn(
        `rate limiter: ${describe(lease)}: a renewal failed (${reason(error)}); ` +
          `trying again in ${Math.round(renewEvery(lease))} ms`,
      );
    }
  }

  end(): Promise<void> {
    if (this.ending === undefined) this.ending = this.finish();
    return this.ending;
  }

  private async finish(): Promise<void> {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    await this.renewing;
    const lease = this.lease;
    try {
      await this.calls.release(lease);
    } catch (error) {
      this.logger.warn(
        `rate limiter: ${describe(lease)} could not be released (${reason(error)}); ` +
          `it is left to expire, within ${lease.concurrency.leaseMs} ms`,
      );
    }
  }
}
