// A Store for express-rate-limit, backed by the limiter's token buckets:
// an existing setup switches by changing its `store:`. Exported by
// redis-tokenbucket/express.

import { AsyncLocalStorage } from "node:async_hooks";
import type { NextFunction, Request, Response } from "express";
import { brand } from "./brand.js";
import { Bucket } from "./bucket.js";
import type { Decision } from "./decision.js";
import { LimiterError } from "./errors.js";
import type { Limiter } from "./limiter.js";

/** express-rate-limit's answer to increment and get. */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

export interface StoreOptions {
  /**
   * The bucket every key gets. By default it is made from the middleware's
   * `limit` and `windowMs` (a burst of `limit`, refilled at `limit` per
   * window); `limit` may then be a function of the request.
   */
  bucket?: Bucket;
  /**
   * The Redis key prefix, taken as it is: stores given one prefix share
   * their keys, whatever their limits. By default each limit has its own,
   * `rl:erl:<limit>-in-<windowMs>ms:` (or `rl:erl:<max>-at-<rate>ps:` for a
   * bucket given), so two limiters of different limits never share a key.
   */
  prefix?: string;
}

/** The limit express-rate-limit gives the Store: a number, or a function of the request. */
type LimitOption = number | ((request: Request, response: Response) => number | Promise<number>);

/**
 * What `increment` throws when the limiter can't get Redis's answer and
 * must not admit: Redis failing under onError "closed" (or the breaker
 * open), or this process too busy to get the answer in time (shed).
 * express-rate-limit passes it to `next(error)`; Express's error handler
 * answers its `status`, 503, with its `headers` (Retry-After), as the
 * package's own helpers answer such a call.
 */
export class StoreUnavailable extends LimiterError {
  static {
    brand(StoreUnavailable);
  }
  readonly status = 503;
  readonly statusCode = 503;
  /** Its message is safe to show (http-errors' convention). */
  readonly expose = true;
  readonly headers: Record<string, string>;
  readonly decision: Decision;

  constructor(decision: Decision) {
    super(
      decision.shed
        ? "the rate limiter is unavailable: this process was too busy to get Redis's answer in time"
        : "the rate limiter is unavailable: Redis failed and the limiter fails closed",
    );
    this.decision = decision;
    this.headers = { "Retry-After": String(unavailableRetryMs(decision) / 1000) };
  }
}

/** What a call refused without Redis's word says to wait, in ms: its own, at least a second. */
function unavailableRetryMs(decision: Decision): number {
  return Math.max(1000, Math.ceil(decision.retryAfterMs / 1000) * 1000);
}

/** A denial without Redis's word: shed, or the policy failing closed (no numbers). */
function unavailable(decision: Decision): boolean {
  return decision.shed || (decision.degraded && !decision.allowed && decision.retryAfterMs === 0);
}

/** An admission without Redis's word: the policy failing open (no numbers). */
function unlimited(decision: Decision): boolean {
  return decision.degraded && decision.allowed && decision.retryAfterMs === 0 && decision.resetAfterMs === 0;
}

/** A request's bucket and its keys' prefix. */
interface Limits {
  bucket: Bucket;
  prefix: string;
}

/** The request express-rate-limit is counting, for a function `limit`; its limits once known. */
interface Current {
  request: Request;
  response: Response;
  limits?: Limits;
}

const current = new AsyncLocalStorage<Current>();

// Bounds of what the Store remembers per key (each cleared whole when full:
// a lost entry costs one token refunded, or a reset that misses one limit).
const REMEMBERED = 10_000;

/**
 * A Store for express-rate-limit: `rateLimit({ windowMs, limit, store: new
 * TokenBucketStore(limiter) })`. Each key is a token bucket of `limit`
 * tokens refilled at `limit` per `windowMs`, so clients get a smooth rate
 * instead of a window that resets all at once.
 *
 * `increment` charges one token: `totalHits` is the tokens used (`limit`
 * minus what is left) when admitted, and `limit + 1` when denied, so that
 * express-rate-limit answers 429; `resetTime` is when the request would
 * pass (denied) or the bucket is full (admitted), so its Retry-After and
 * RateLimit reset are the bucket's. `decrement` refunds a token
 * (skipSuccessfulRequests, skipFailedRequests), `resetKey` fills the
 * bucket, `get` peeks.
 *
 * When Redis fails, the limiter's onError applies. "open" admits, with
 * `totalHits` at `limit` (nothing counted, so no quota promised: the
 * fields say none left, reset in 1 s). "closed", and a shed call under
 * any policy, throw `StoreUnavailable`: Express answers 503 with
 * Retry-After (or, with passOnStoreError, which must not turn a closed
 * limiter open, the Store denies: 429, retry in 1 s).
 *
 * A function `limit` (a limit per request) makes a bucket per limit: the
 * Store calls it with the request, which express-rate-limit does not pass
 * to stores, so the middleware must be wrapped: `app.use(store.wrap(rateLimit({ ..., store })))`;
 * unwrapped, the app stops at startup with a TypeError naming store.wrap.
 */
const NEEDS_WRAP =
  "TokenBucketStore: a function `limit` needs the request, which express-rate-limit does not give " +
  "a store: wrap the middleware, app.use(store.wrap(rateLimit({ ..., store })))";

export class TokenBucketStore {
  readonly localKeys = false;
  private readonly given: Bucket | undefined;
  private readonly givenPrefix: string | undefined;
  private fixed: Limits | undefined;
  private limitOf: ((request: Request, response: Response) => number | Promise<number>) | undefined;
  private windowMs = 0;
  private passOnStoreError = false;
  private tracksDenials = false;
  // Requests whose increment charged nothing in Redis (denied, or admitted
  // without Redis), not yet decremented, per Redis key: express-rate-limit
  // decrements those too (skipFailedRequests, skipSuccessfulRequests), and
  // such a decrement must refund nothing.
  private readonly uncharged = new Map<string, number>();
  // For a function limit: each limit's bucket, and the last limit each key
  // was counted under (what get and resetKey use outside a request).
  private readonly buckets = new Map<number, Limits>();
  private readonly lastLimit = new Map<string, number>();
  private wrapped = false;

  constructor(
    readonly limiter: Limiter,
    options: StoreOptions = {},
  ) {
    if (options.bucket !== undefined && !(options.bucket instanceof Bucket)) {
      throw new TypeError("TokenBucketStore: bucket must be a Bucket");
    }
    this.given = options.bucket;
    this.givenPrefix = options.prefix;
    if (this.given !== undefined) {
      const [max, rate] = this.given.args;
      this.fixed = { bucket: this.given, prefix: this.givenPrefix ?? `rl:erl:${max}-at-${rate}ps:` };
    }
  }

  /**
   * The Redis key prefix of the request being counted (express-rate-limit
   * reads it to tell stores' keys apart).
   */
  get prefix(): string {
    return this.fixed?.prefix ?? current.getStore()?.limits?.prefix ?? this.givenPrefix ?? "rl:erl:";
  }

  /** Called by express-rate-limit with the middleware's options. */
  init(options: {
    limit?: unknown;
    max?: unknown;
    windowMs?: unknown;
    skipFailedRequests?: unknown;
    skipSuccessfulRequests?: unknown;
    passOnStoreError?: unknown;
  }): void {
    this.tracksDenials = Boolean(options.skipFailedRequests || options.skipSuccessfulRequests);
    this.passOnStoreError = Boolean(options.passOnStoreError);
    if (this.given !== undefined) return;
    const limit = (options.limit ?? options.max) as LimitOption | undefined;
    const windowMs = options.windowMs;
    if (typeof windowMs !== "number" || !(windowMs > 0) || (typeof limit !== "number" && typeof limit !== "function")) {
      throw new TypeError(
        "TokenBucketStore needs windowMs and a limit (a number, or a function of the request), or a bucket: " +
          "new TokenBucketStore(limiter, { bucket })",
      );
    }
    this.windowMs = windowMs;
    if (typeof limit === "function") {
      this.limitOf = limit;
      // rateLimit() calls init before its middleware can be wrapped, so the
      // check waits for the app's setup to finish: an unwrapped middleware
      // could only fail every request, so it stops the app at startup.
      setImmediate(() => {
        if (!this.wrapped) throw new TypeError(NEEDS_WRAP);
      });
    } else this.fixed = this.limitsOf(limit);
  }

  /**
   * `app.use(store.wrap(rateLimit({ limit: (req) => ..., store })))`: the
   * middleware, giving this Store the request it counts, which a function
   * `limit` needs. Its `resetKey` and `getKey` stay.
   */
  wrap<M extends (request: Request, response: Response, next: NextFunction) => unknown>(middleware: M): M {
    this.wrapped = true;
    const wrapped = (request: Request, response: Response, next: NextFunction) =>
      current.run({ request, response }, () => middleware(request, response, next));
    return Object.assign(wrapped, middleware) as unknown as M;
  }

  /** The bucket of a limit per `windowMs`, and its keys' prefix. */
  private limitsOf(limit: number): Limits {
    const bucket = new Bucket({ max: limit, rate: limit / (this.windowMs / 1000) });
    return { bucket, prefix: this.givenPrefix ?? `rl:erl:${bucket.args[0]}-in-${this.windowMs}ms:` };
  }

  /** The limits of the request being counted. */
  private async limits(): Promise<Limits> {
    if (this.fixed !== undefined) return this.fixed;
    if (this.limitOf === undefined) {
      throw new TypeError("TokenBucketStore: init() was not called, and no bucket was given");
    }
    const request = current.getStore();
    if (request === undefined) {
      throw new TypeError(NEEDS_WRAP);
    }
    if (request.limits === undefined) {
      const limit = await this.limitOf(request.request, request.response);
      let limits = this.buckets.get(limit);
      if (limits === undefined) {
        limits = this.limitsOf(limit);
        if (this.buckets.size >= 1000) this.buckets.clear();
        this.buckets.set(limit, limits);
      }
      request.limits = limits;
    }
    return request.limits;
  }

  /** The limits a key was last counted under, outside a request (function limits). */
  private limitsFor(key: string): Limits | undefined {
    if (this.fixed !== undefined) return this.fixed;
    const inRequest = current.getStore()?.limits;
    if (inRequest !== undefined) return inRequest;
    const limit = this.lastLimit.get(key);
    return limit === undefined ? undefined : this.buckets.get(limit);
  }

  private unchargedOne(redisKey: string): void {
    if (!this.tracksDenials) return;
    if (this.uncharged.size >= REMEMBERED) this.uncharged.clear();
    this.uncharged.set(redisKey, (this.uncharged.get(redisKey) ?? 0) + 1);
  }

  async increment(key: string): Promise<ClientRateLimitInfo> {
    const { bucket, prefix } = await this.limits();
    if (this.limitOf !== undefined) {
      if (this.lastLimit.size >= REMEMBERED) this.lastLimit.clear();
      this.lastLimit.set(key, bucket.max);
    }
    const d = await this.limiter.consume(prefix + key, bucket, 1);
    const limit = Math.floor(bucket.max);
    const now = Date.now();
    if (unavailable(d)) {
      if (!this.passOnStoreError) throw new StoreUnavailable(d); // express-rate-limit decrements none of these
      this.unchargedOne(prefix + key);
      return { totalHits: limit + 1, resetTime: new Date(now + unavailableRetryMs(d)) };
    }
    if (!d.allowed) {
      this.unchargedOne(prefix + key);
      return { totalHits: limit + 1, resetTime: new Date(now + d.retryAfterMs) };
    }
    if (unlimited(d)) {
      // Nothing counted: no quota is promised (none left, look again in a second).
      this.unchargedOne(prefix + key);
      return { totalHits: limit, resetTime: new Date(now + 1000) };
    }
    return { totalHits: limit - Math.max(d.remaining, 0), resetTime: new Date(now + d.resetAfterMs) };
  }

  async decrement(key: string): Promise<void> {
    const { bucket, prefix } = await this.limits();
    const redisKey = prefix + key;
    const skipped = this.uncharged.get(redisKey) ?? 0;
    if (skipped > 0) {
      if (skipped === 1) this.uncharged.delete(redisKey);
      else this.uncharged.set(redisKey, skipped - 1);
      return; // its increment charged nothing
    }
    await this.limiter.adjust(redisKey, bucket, 1);
  }

  /** Fills the key's bucket (every limit's, for a function limit): a refund of twice its max, which deletes it. */
  async resetKey(key: string): Promise<void> {
    const all = this.fixed !== undefined ? [this.fixed] : [...this.buckets.values()];
    await Promise.all(all.map(({ bucket, prefix }) => this.limiter.adjust(prefix + key, bucket, 2 * bucket.max)));
  }

  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const limits = this.limitsFor(key);
    if (limits === undefined) return undefined;
    const { bucket, prefix } = limits;
    const d = await this.limiter.peek(prefix + key, bucket, 0);
    if (d.degraded || d.shed) return undefined;
    if (d.resetAfterMs === 0) return { totalHits: 0, resetTime: undefined };
    return {
      totalHits: Math.floor(bucket.max) - Math.max(d.remaining, 0),
      resetTime: new Date(Date.now() + d.resetAfterMs),
    };
  }
}
