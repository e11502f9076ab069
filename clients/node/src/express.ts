// Express: a middleware charging each request against its rules, one
// holding a concurrency slot per request until its response is done, and
// a Store for express-rate-limit backed by the limiter's token buckets.
// Express itself is not imported: its types are (@types/express), so that
// the requests given to rules and options are Express's.

import type { NextFunction, Request, Response } from "express";
import { Bucket } from "./bucket.js";
import type { MultiDecision } from "./decision.js";
import { mergeRateLimitHeaders, rateLimitHeaders } from "./headers.js";
import {
  acquireFor,
  answer,
  type ConcurrencyLimitOptions,
  check,
  checkConcurrencyOptions,
  checkRules,
  holdUntilSent,
  type LimitOptions,
  type NodeRequest,
  type Refusal,
  type RefusalOptions,
  type Rule,
  refusal,
  resetIdentity,
} from "./http.js";
import type { Lease } from "./lease.js";
import type { Limiter } from "./limiter.js";

export {
  apiKey,
  type ConcurrencyLimitOptions,
  type ConcurrencyRule,
  clientIp,
  holdUntilSent,
  type KeyFunction,
  type NodeRequest,
  QUOTA_EXCEEDED,
  type Refusal,
  type RefusalOptions,
  type ResponseEvents,
  type Rule,
} from "./http.js";

/** An Express request with the decision `rateLimitMiddleware` put on it. */
export type RateLimitedRequest = Request & { rateLimit?: MultiDecision };

/**
 * Sends a refusal yourself, as express-rate-limit's `handler` does: the
 * refusal's headers (RateLimit fields, Retry-After) are already set.
 */
export type RefusalHandler<R> = (request: R, response: Response, next: NextFunction, refusal: Refusal) => unknown;

export interface MiddlewareOptions<R extends NodeRequest = Request> extends LimitOptions, RefusalOptions<R> {
  /** The buckets each request is charged against, in one all-or-nothing call. */
  rules: readonly Rule<R>[];
  /** True to let a request through unlimited (health checks, say). */
  skip?: (request: R) => boolean;
  /** Sends the refusals (429s and 503s) instead of the middleware. */
  handler?: RefusalHandler<R>;
}

/** The middleware, with express-rate-limit's `resetKey`. */
export interface RateLimitMiddleware<R extends NodeRequest = Request> {
  (request: R, response: Response, next: NextFunction): void;
  /** Fills `identity`'s bucket of every rule again (its keys are deleted). */
  resetKey(identity: string): Promise<void>;
}

export interface ConcurrencyMiddlewareOptions<R extends NodeRequest = Request> extends ConcurrencyLimitOptions<R> {
  /** Sends the refusals (429s and 503s) instead of the middleware. */
  handler?: RefusalHandler<R>;
}

/** Sets a limiter's fields, joining those an earlier limiter set on the response. */
function setFields(response: Response, fields: Record<string, string>): void {
  for (const [k, v] of Object.entries(mergeRateLimitHeaders(response.getHeaders(), fields))) response.setHeader(k, v);
}

/** Sends a refusal: the handler's, or the status and body the options say. */
async function refuse<R>(
  refused: Refusal,
  options: RefusalOptions<R> & { handler?: RefusalHandler<R> },
  request: R,
  response: Response,
  next: NextFunction,
): Promise<void> {
  setFields(response, refused.headers);
  if (options.handler !== undefined) {
    await options.handler(request, response, next, refused);
    return;
  }
  const { status, body, type } = await answer(refused, options, request);
  response.status(status);
  if (type !== undefined) response.type(type);
  response.send(body);
}

/**
 * `app.use(rateLimitMiddleware(limiter, { rules: [...] }))`: each request
 * is charged against its rules in one all-or-nothing call. Admitted
 * requests carry RateLimit-Policy and RateLimit (joined to any an earlier
 * limiter set); a denial is a 429 problem with them and Retry-After (or
 * `statusCode`, `message`, or your `handler`); a shed call or a
 * failing-closed limiter is a 503 with Retry-After. The decision is
 * `req.rateLimit` (where express-rate-limit puts its own) and
 * `res.locals.rateLimit`. Errors the limiter throws (usage errors,
 * onError "raise") go to `next(error)`. Also exported as `rateLimit`,
 * its first name, which express-rate-limit's export shares.
 */
export function rateLimitMiddleware<R extends NodeRequest = Request>(
  limiter: Limiter,
  options: MiddlewareOptions<R>,
): RateLimitMiddleware<R> {
  checkRules(limiter, options.rules);
  const middleware = (request: R, response: Response, next: NextFunction): void => {
    if (options.skip?.(request)) {
      next();
      return;
    }
    check(limiter, options.rules, request, options)
      .then(async (decision: MultiDecision | undefined) => {
        if (decision === undefined) return next();
        (request as R & { rateLimit?: MultiDecision }).rateLimit = decision;
        response.locals.rateLimit = decision;
        const refused = refusal(decision, options);
        if (refused === undefined) {
          setFields(response, rateLimitHeaders(decision, { legacy: options.legacyHeaders ?? false }));
          return next();
        }
        await refuse(refused, options, request, response, next);
      })
      .catch(next);
  };
  return Object.assign(middleware, {
    resetKey: (identity: string) => resetIdentity(limiter, options.rules, identity),
  });
}

/**
 * The first name of `rateLimitMiddleware`, kept for the code that uses it.
 * @deprecated It is also express-rate-limit's export: import `rateLimitMiddleware`.
 */
export const rateLimit = rateLimitMiddleware;

/**
 * `app.use(concurrencyLimit(limiter, { concurrency: { concurrency, key } }))`:
 * each request holds one slot (or `weight`) of its identity's Concurrency
 * from when it arrives until its response has been sent or its client has
 * gone away (the response's 'finish' or 'close'), renewed meanwhile; a
 * streamed response holds it until the stream ends. Bucket `rules` are
 * charged in the same TB.ACQUIRE. An admitted request carries the
 * RateLimit fields (`"streams";q=8;qu="concurrent-requests"`, `r` the slots
 * left); no slot is a 429 problem with them and Retry-After (or
 * `statusCode`, `message`, `handler`); a shed call or a failing-closed
 * limiter is a 503 with Retry-After. The lease is in `res.locals.lease`.
 * Errors the limiter throws go to `next(error)`.
 */
export function concurrencyLimit<R extends NodeRequest = Request>(
  limiter: Limiter,
  options: ConcurrencyMiddlewareOptions<R>,
): (request: R, response: Response, next: NextFunction) => void {
  checkConcurrencyOptions(limiter, options);
  return (request: R, response: Response, next: NextFunction): void => {
    if (options.skip?.(request)) {
      next();
      return;
    }
    acquireFor(limiter, options, request)
      .then(async (lease: Lease | undefined) => {
        if (lease === undefined) return next();
        response.locals.lease = lease;
        const refused = refusal(lease, options);
        if (refused === undefined) {
          holdUntilSent(limiter, lease, response);
          setFields(response, rateLimitHeaders(lease, { legacy: options.legacyHeaders ?? false }));
          return next();
        }
        await refuse(refused, options, request, response, next);
      })
      .catch(next);
  };
}

/** express-rate-limit's answer to increment and get. */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

export interface StoreOptions {
  /**
   * The bucket every key gets. By default it is made from the middleware's
   * `limit` and `windowMs` (a burst of `limit`, refilled at `limit` per
   * window), which must then be numbers.
   */
  bucket?: Bucket;
  /** Key prefix in Redis (default "rl:erl:"). */
  prefix?: string;
}

/**
 * A Store for express-rate-limit: `rateLimit({ windowMs, limit, store: new
 * TokenBucketStore(limiter) })`. Each key is a token bucket of `limit`
 * tokens refilled at `limit` per `windowMs`, so clients get a smooth rate
 * instead of a window that resets all at once; an existing setup switches
 * by changing its `store:`.
 *
 * `increment` charges one token: `totalHits` is the tokens used (`limit`
 * minus what is left) when admitted, and `limit + 1` when denied, so that
 * express-rate-limit answers 429; `resetTime` is when the request would
 * pass (denied) or the bucket is full (admitted), so its Retry-After and
 * RateLimit-Reset are the bucket's. `decrement` refunds a token
 * (skipSuccessfulRequests, skipFailedRequests), `resetKey` fills the
 * bucket, `get` peeks. The limiter's onError applies: a degraded "open"
 * answer counts no hits, "closed" and shed answers count `limit + 1`.
 */
export class TokenBucketStore {
  readonly localKeys = false;
  readonly prefix: string;
  private bucket: Bucket | undefined;
  // express-rate-limit decrements (skipFailedRequests, skipSuccessfulRequests)
  // requests it refused too, whose increment charged nothing here: such a
  // decrement must refund nothing. Denials not yet decremented, per key.
  private readonly uncharged = new Map<string, number>();
  private tracksDenials = false;

  constructor(
    readonly limiter: Limiter,
    options: StoreOptions = {},
  ) {
    this.bucket = options.bucket;
    this.prefix = options.prefix ?? "rl:erl:";
  }

  /** Called by express-rate-limit with the middleware's options. */
  init(options: {
    limit?: unknown;
    max?: unknown;
    windowMs?: unknown;
    skipFailedRequests?: unknown;
    skipSuccessfulRequests?: unknown;
  }): void {
    this.tracksDenials = Boolean(options.skipFailedRequests || options.skipSuccessfulRequests);
    if (this.bucket !== undefined) return;
    const limit = options.limit ?? options.max;
    const windowMs = options.windowMs;
    if (typeof limit !== "number" || typeof windowMs !== "number") {
      throw new TypeError(
        "TokenBucketStore needs numeric limit and windowMs, or a bucket: new TokenBucketStore(limiter, { bucket })",
      );
    }
    this.bucket = new Bucket({ max: limit, rate: limit / (windowMs / 1000) });
  }

  private get limits(): Bucket {
    if (this.bucket === undefined)
      throw new TypeError("TokenBucketStore: init() was not called, and no bucket was given");
    return this.bucket;
  }

  async increment(key: string): Promise<ClientRateLimitInfo> {
    const bucket = this.limits;
    const d = await this.limiter.consume(this.prefix + key, bucket, 1);
    const limit = Math.floor(bucket.max);
    if (!d.allowed) {
      if (this.tracksDenials) {
        if (this.uncharged.size >= 10_000) this.uncharged.clear(); // bounded: a lost entry refunds one token
        this.uncharged.set(key, (this.uncharged.get(key) ?? 0) + 1);
      }
      return { totalHits: limit + 1, resetTime: new Date(Date.now() + d.retryAfterMs) };
    }
    if (d.degraded && d.retryAfterMs === 0 && d.resetAfterMs === 0) return { totalHits: 0, resetTime: undefined };
    return { totalHits: limit - Math.max(d.remaining, 0), resetTime: new Date(Date.now() + d.resetAfterMs) };
  }

  async decrement(key: string): Promise<void> {
    const denied = this.uncharged.get(key) ?? 0;
    if (denied > 0) {
      if (denied === 1) this.uncharged.delete(key);
      else this.uncharged.set(key, denied - 1);
      return; // its increment charged nothing
    }
    await this.limiter.adjust(this.prefix + key, this.limits, 1);
  }

  async resetKey(key: string): Promise<void> {
    const bucket = this.limits;
    // A refund of the whole capacity fills the bucket, which deletes the key.
    await this.limiter.adjust(this.prefix + key, bucket, 2 * bucket.max);
  }

  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const bucket = this.limits;
    const d = await this.limiter.peek(this.prefix + key, bucket, 0);
    if (d.degraded || d.shed) return undefined;
    if (d.resetAfterMs === 0) return { totalHits: 0, resetTime: undefined };
    return {
      totalHits: Math.floor(bucket.max) - Math.max(d.remaining, 0),
      resetTime: new Date(Date.now() + d.resetAfterMs),
    };
  }
}
