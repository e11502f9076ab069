// Express: a middleware charging each request against its rules, one
// holding a concurrency slot per request until its response is done, and
// (store.ts) a Store for express-rate-limit backed by the limiter's token
// buckets.
// Express itself is not imported: its types are (@types/express), so that
// the requests given to rules and options are Express's.

import type { NextFunction, Request, Response } from "express";
import type { MultiDecision } from "./decision.js";
import { AlwaysDenied, MissingIdentity } from "./errors.js";
import { mergeRateLimitHeaders, rateLimitHeaders } from "./headers.js";
import {
  acquireFor,
  answer,
  type ConcurrencyLimitOptions,
  check,
  checkConcurrencyOptions,
  checkRefusalOptions,
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
  Deny,
  holdUntilSent,
  type KeyFunction,
  type NodeRequest,
  QUOTA_EXCEEDED,
  type Refusal,
  type RefusalOptions,
  type ResponseEvents,
  type Rule,
  type Skip,
} from "./http.js";
export { type ClientRateLimitInfo, type StoreOptions, StoreUnavailable, TokenBucketStore } from "./store.js";

/** An Express request with the decision `rateLimitMiddleware` put on it. */
export type RateLimitedRequest = Request & { rateLimit?: MultiDecision };

/**
 * Sends a refusal yourself, as express-rate-limit's `handler` does: the
 * refusal's headers (RateLimit fields, Retry-After) are already set.
 */
export type RefusalHandler<R> = (request: R, response: Response, next: NextFunction, refusal: Refusal) => unknown;

export interface MiddlewareOptions<R extends NodeRequest = Request> extends LimitOptions, RefusalOptions<R> {
  /**
   * The buckets each request is charged against, in one all-or-nothing
   * call. (Their key functions don't decide the request's type: apiKey()
   * and clientIp() take any request, and the type stays the framework's.)
   */
  rules: readonly Rule<NoInfer<R>>[];
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

/** A request with no identity for a rule: a 400 problem, or the error for `next`. */
function missingOr(response: Response, next: NextFunction): (error: unknown) => void {
  return (error: unknown) => {
    if (error instanceof AlwaysDenied) {
      response.status(429).set(error.headers).type("application/problem+json").send(JSON.stringify(error.body));
      return;
    }
    if (!(error instanceof MissingIdentity)) return next(error);
    response.status(400).type("application/problem+json").send(JSON.stringify(error.body));
  };
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
 * failing-closed limiter is a 503 with Retry-After. A rule with
 * `maxDelayMs` holds a request over its bucket for its reservation's delay
 * instead, then calls `next()`. The decision is
 * `req.rateLimit` (where express-rate-limit puts its own) and
 * `res.locals.rateLimit`. Errors the limiter throws (usage errors,
 * onError "raise") go to `next(error)`. Also exported as `rateLimit`,
 * its first name, which express-rate-limit's export shares.
 */
export function rateLimitMiddleware<R extends NodeRequest = Request>(
  limiter: Limiter,
  options: MiddlewareOptions<R>,
): RateLimitMiddleware<NoInfer<R>> {
  checkRefusalOptions(options);
  checkRules(limiter, options.rules);
  const middleware = (request: R, response: Response, next: NextFunction): void => {
    if (options.skip?.(request)) {
      next();
      return;
    }
    check(limiter, options.rules, request, options).then(
      async (decision: MultiDecision) => {
        (request as R & { rateLimit?: MultiDecision }).rateLimit = decision;
        response.locals.rateLimit = decision;
        if (decision.decisions.length === 0) return next(); // every rule optional and skipped
        const refused = refusal(decision, options);
        if (refused === undefined) {
          setFields(response, rateLimitHeaders(decision, { legacy: options.legacyHeaders ?? false }));
          return next();
        }
        // What a handler or message function throws goes to Express, not what the next layers do.
        await refuse(refused, options, request, response, next).catch(next);
      },
      missingOr(response, next),
    );
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
): (request: NoInfer<R>, response: Response, next: NextFunction) => void {
  checkConcurrencyOptions(limiter, options);
  return (request: R, response: Response, next: NextFunction): void => {
    if (options.skip?.(request)) {
      next();
      return;
    }
    acquireFor(limiter, options, request).then(
      async (lease: Lease | undefined) => {
        if (lease === undefined) return next();
        response.locals.lease = lease;
        const refused = refusal(lease, options);
        if (refused === undefined) {
          holdUntilSent(limiter, lease, response);
          setFields(response, rateLimitHeaders(lease, { legacy: options.legacyHeaders ?? false }));
          return next();
        }
        await refuse(refused, options, request, response, next).catch(next);
      },
      missingOr(response, next),
    );
  };
}
