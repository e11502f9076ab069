// Concurrency leases: what a limit of streams in flight is (Concurrency),
// what an acquire answers (Lease), and what `hold` throws when there is no
// slot (Busy). Checked with the module's rules and messages (contract.ts,
// generated from contract/contract.json), as Bucket is.

import { randomUUID } from "node:crypto";
import { brand } from "./brand.js";
import { checkName, type Key, refusal } from "./bucket.js";
import { MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_MS } from "./contract.js";
import { type Decision, wholeSeconds } from "./decision.js";
import { LimiterError } from "./errors.js";

/**
 * Where an acquired lease's slot is: in Redis, in this process's fallback
 * (onError "local"), or nowhere (denied, or admitted by onError "open"
 * while Redis failed).
 */
export type Held = "redis" | "local" | "none";

/**
 * An integer argument (a number with no fraction) within bounds, with the
 * module's messages: `limit must be an integer`, `limit must be >= 1 and <= 1000000`.
 */
export function checkInt(value: unknown, name: string, least: number, most?: number): number {
  if (typeof value !== "number" || !Number.isInteger(value)) throw refusal(name, "not_an_integer", { arg: name });
  if (most === undefined) {
    if (value < least) throw refusal(name, "too_small", { arg: name, least });
  } else if (value < least || value > most) {
    throw refusal(name, "int_out_of_range", { arg: name, least, most });
  }
  return value;
}

export interface ConcurrencyOptions {
  /** The total weight the key's live leases may hold, `1 <= limit <= 1000000`. */
  limit: number;
  /** How long a lease lives without a renewal, in ms, `1 <= leaseMs <= 86400000` (one day). */
  leaseMs: number;
  /** The policy's name in the RateLimit headers (`"streams";q=8;qu="concurrent-requests"`). */
  name?: string;
}

/**
 * At most `limit` slots in flight per key, each lease living `leaseMs`
 * without a renewal: `new Concurrency({ limit: 8, leaseMs: 30_000, name: "streams" })`.
 * Checked when built, with the module's rules and messages; immutable.
 */
export class Concurrency {
  static {
    brand(Concurrency);
  }
  readonly limit: number;
  readonly leaseMs: number;
  readonly name: string | undefined;

  constructor(options: ConcurrencyOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError("Concurrency takes { limit, leaseMs, name? }");
    }
    this.limit = checkInt(options.limit, "limit", 1, MAX_LEASE_LIMIT);
    this.leaseMs = checkInt(options.leaseMs, "lease_ms", 1, MAX_LEASE_MS);
    this.name = options.name === undefined ? undefined : checkName(options.name);
    Object.freeze(this);
  }

  /** The same limit under another policy name. */
  named(name: string): Concurrency {
    return new Concurrency({ limit: this.limit, leaseMs: this.leaseMs, name });
  }

  /** A lease's weight: an integer, `1 <= weight <= limit`. */
  checkWeight(weight: unknown): number {
    const value = checkInt(weight, "weight", 1);
    if (value > this.limit) throw refusal("weight", "weight_above_limit");
    return value;
  }
}

/** A lease id no other holder will pick. */
export function newId(): string {
  return randomUUID();
}

/** A caller's lease id: a string or Buffer of 1 to 256 bytes as sent. */
export function checkId(id: unknown): Key {
  let bytes: number;
  if (typeof id === "string") bytes = Buffer.byteLength(id, "utf8");
  else if (Buffer.isBuffer(id)) bytes = id.length;
  else throw new TypeError(`a lease id is a string or a Buffer, got ${id === null ? "null" : typeof id}`);
  if (bytes < 1 || bytes > MAX_LEASE_ID_BYTES) throw refusal("id", "bad_id");
  return id;
}

export interface LeaseFields {
  acquired: boolean;
  inUse: number;
  retryAfterMs: number;
  expiresInMs: number;
  id: Key;
  key: Key;
  concurrency: Concurrency;
  weight: number;
  decisions: readonly Decision[];
  degraded?: boolean;
  shed?: boolean;
  held: Held;
}

/**
 * What `acquire` answers: TB.ACQUIRE's `[acquired, in_use, retry_after_ms,
 * expires_in_ms, bucket replies...]` with the call that produced it.
 *
 * - `acquired`: the slot is taken (and every bucket charged), or nothing is;
 * - `inUse`: the key's live weight after the call;
 * - `retryAfterMs`: 0 when acquired; else the largest of the time until
 *   enough leases expire for this weight to fit and each bucket's wait (a
 *   release can free a slot sooner);
 * - `expiresInMs`: the lease's time to live (0 when denied), updated by renewals;
 * - `id`, `key`, `concurrency`, `weight`: what was asked;
 * - `decisions`: one Decision per bucket, in order;
 * - `degraded`, `shed`: as on a Decision (Redis failed and the policy
 *   answered; this process was too busy to get Redis's answer);
 * - `lost`: set when a renewal found the lease gone (it expired, or was
 *   released): the slot is no longer this holder's;
 * - `held`: where the slot is ("redis", "local" or "none").
 *
 * A lease of onError "local" has the Concurrency it was decided against:
 * this process's share of the limit (its `busy` and `remaining` are about it).
 */
export class Lease {
  static {
    brand(Lease);
  }
  readonly acquired: boolean;
  readonly inUse: number;
  readonly retryAfterMs: number;
  expiresInMs: number;
  readonly id: Key;
  readonly key: Key;
  readonly concurrency: Concurrency;
  readonly weight: number;
  readonly decisions: readonly Decision[];
  readonly degraded: boolean;
  readonly shed: boolean;
  readonly held: Held;
  lost = false;
  /** Whether this limiter released it (a lease without a slot in Redis answers for itself). */
  released = false;

  constructor(fields: LeaseFields) {
    this.acquired = fields.acquired;
    this.inUse = fields.inUse;
    this.retryAfterMs = fields.retryAfterMs;
    this.expiresInMs = fields.expiresInMs;
    this.id = fields.id;
    this.key = fields.key;
    this.concurrency = fields.concurrency;
    this.weight = fields.weight;
    this.decisions = fields.decisions;
    this.degraded = fields.degraded ?? false;
    this.shed = fields.shed ?? false;
    this.held = fields.held;
  }

  /** Never: a lease is always Redis's (or the policy's) answer, not the denial cache's. */
  get cached(): boolean {
    return false;
  }

  /**
   * Denied for want of a slot (not only by a bucket): the live weight leaves
   * no room for this one.
   */
  get busy(): boolean {
    return !this.acquired && this.inUse + this.weight > this.concurrency.limit;
  }

  /** Slots (weight) still free after the call. */
  get remaining(): number {
    return Math.max(this.concurrency.limit - this.inUse, 0);
  }

  /** The buckets that could not pay. */
  get deniedBy(): Decision[] {
    return this.decisions.filter((d) => !d.allowed);
  }

  /** `retryAfterMs` in whole seconds, rounded up (HTTP Retry-After). */
  get retryAfter(): number {
    return wholeSeconds(this.retryAfterMs);
  }
}

/**
 * Thrown by `hold` when the lease was not acquired: no slot free, a bucket
 * that could not pay, a shed call, or Redis failing under a policy that
 * denies. `lease` is the denied Lease, with the reason.
 */
export class Busy extends LimiterError {
  static {
    brand(Busy);
  }
  readonly lease: Lease;
  constructor(lease: Lease) {
    super(why(lease));
    this.lease = lease;
  }
}

function why(lease: Lease): string {
  const key = JSON.stringify(String(lease.key));
  if (lease.shed) return `no lease on ${key}: this process was too busy to get Redis's answer in time`;
  // A policy's answer has no numbers; onError "local"'s has its own.
  if (lease.degraded && lease.inUse === 0 && lease.retryAfterMs === 0) {
    return `no lease on ${key}: Redis failed and the policy denies`;
  }
  const parts: string[] = [];
  if (lease.busy) parts.push(`${lease.inUse} of ${lease.concurrency.limit} slots in use`);
  for (const d of lease.deniedBy) parts.push(`bucket ${JSON.stringify(String(d.key))} can't pay ${d.cost}`);
  const where = lease.degraded ? " in this process while Redis fails" : "";
  return `no lease on ${key}: ${parts.join(", ") || "denied"}${where}; retry in ${lease.retryAfterMs} ms`;
}
