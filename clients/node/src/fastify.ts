// Fastify: a plugin adding an onRequest hook that charges each request
// against its rules (for every route of the instance it is registered on),
// the hook alone, for single routes, and a hook holding a concurrency slot
// per request until its response is done. Fastify itself is not imported:
// its types are, so that the plugin and hooks are Fastify's own kinds and
// the requests given to rules and options are Fastify's.

import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
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
  type Rule,
  type Skip,
} from "./http.js";

declare module "fastify" {
  interface FastifyRequest {
    /** The decision of redis-tokenbucket's rateLimitPlugin or rateLimitHook (null or undefined where none applied). */
    rateLimit?: MultiDecision | null;
    /** The lease redis-tokenbucket's concurrencyHook took for this request. */
    lease?: Lease | null;
  }
}

/** Sends a refusal yourself (and returns the reply): its headers (RateLimit fields, Retry-After) are already set. */
export type RefusalHandler<R> = (request: R, reply: FastifyReply, refusal: Refusal) => unknown;

export interface HookOptions<R extends NodeRequest = FastifyRequest> extends LimitOptions, RefusalOptions<R> {
  /**
   * The buckets each request is charged against, in one all-or-nothing
   * call. (Their key functions don't decide the request's type: apiKey()
   * and clientIp() take any request, and the type stays the framework's.)
   */
  rules: readonly Rule<NoInfer<R>>[];
  /** True to let a request through unlimited (health checks, say). */
  skip?: (request: R) => boolean;
  /** Sends the refusals (429s and 503s) instead of the hook. */
  handler?: RefusalHandler<R>;
}

export interface PluginOptions extends HookOptions<FastifyRequest> {
  limiter: Limiter;
}

export interface ConcurrencyHookOptions<R extends NodeRequest = FastifyRequest> extends ConcurrencyLimitOptions<R> {
  /** Sends the refusals (429s and 503s) instead of the hook. */
  handler?: RefusalHandler<R>;
}

/** An onRequest hook, with express-rate-limit's `resetKey`. */
export interface RateLimitHook<R extends NodeRequest = FastifyRequest> {
  (request: R, reply: FastifyReply): Promise<unknown>;
  /** Fills `identity`'s bucket of every rule again (its keys are deleted). */
  resetKey(identity: string): Promise<void>;
}

/** Sets a limiter's fields, joining those an earlier hook set on the reply. */
function setFields(reply: FastifyReply, fields: Record<string, string>): void {
  for (const [k, v] of Object.entries(mergeRateLimitHeaders(reply.getHeaders(), fields))) reply.header(k, v);
}

/** Sends a refusal: the handler's, or the status and body the options say; returns the reply. */
async function refuse<R>(
  refused: Refusal,
  options: RefusalOptions<R> & { handler?: RefusalHandler<R> },
  request: R,
  reply: FastifyReply,
): Promise<FastifyReply> {
  setFields(reply, refused.headers);
  if (options.handler !== undefined) {
    await options.handler(request, reply, refused);
    return reply;
  }
  const { status, body, type } = await answer(refused, options, request);
  reply.code(status);
  if (type !== undefined) reply.type(type);
  return reply.send(body);
}

/** A request with no identity for a rule: a 400 problem; any other error is thrown on. */
function missing(error: unknown, reply: FastifyReply): FastifyReply {
  if (error instanceof AlwaysDenied) {
    return reply.code(429).headers(error.headers).type("application/problem+json").send(JSON.stringify(error.body));
  }
  if (!(error instanceof MissingIdentity)) throw error;
  return reply.code(400).type("application/problem+json").send(JSON.stringify(error.body));
}

/**
 * An onRequest hook: `fastify.get("/x", { onRequest: rateLimitHook(limiter, { rules }) }, handler)`.
 * Admitted requests carry RateLimit-Policy and RateLimit, joined to any an
 * earlier hook set (the plugin's); the decision is `request.rateLimit`. A
 * denial is a 429 problem with them and Retry-After (or `statusCode`,
 * `message`, or your `handler`); a shed call or a failing-closed limiter
 * is a 503 with Retry-After. A rule with `maxDelayMs` holds a request over
 * its bucket for its reservation's delay instead, before the handler.
 */
export function rateLimitHook<R extends NodeRequest = FastifyRequest>(
  limiter: Limiter,
  options: HookOptions<R>,
): RateLimitHook<NoInfer<R>> {
  checkRefusalOptions(options);
  checkRules(limiter, options.rules);
  const hook = async (request: R, reply: FastifyReply): Promise<unknown> => {
    if (options.skip?.(request)) return undefined;
    let decision: MultiDecision;
    try {
      decision = await check(limiter, options.rules, request, options);
    } catch (error) {
      return missing(error, reply);
    }
    (request as R & { rateLimit?: MultiDecision }).rateLimit = decision;
    if (decision.decisions.length === 0) return undefined; // every rule optional and skipped
    const refused = refusal(decision, options);
    if (refused === undefined) {
      setFields(reply, rateLimitHeaders(decision, { legacy: options.legacyHeaders ?? false }));
      return undefined;
    }
    return refuse(refused, options, request, reply);
  };
  return Object.assign(hook, {
    resetKey: (identity: string) => resetIdentity(limiter, options.rules, identity),
  });
}

/**
 * An onRequest hook holding a concurrency slot per request:
 * `fastify.get("/x", { onRequest: concurrencyHook(limiter, { concurrency: { concurrency, key } }) }, handler)`,
 * or `fastify.addHook("onRequest", concurrencyHook(...))` for every route
 * of an instance. The slot is held from the request's arrival until its
 * response has been sent or its client has gone away (the raw response's
 * 'finish' or 'close'), renewed meanwhile; bucket `rules` are charged in
 * the same TB.ACQUIRE. Admitted requests carry the RateLimit fields (the
 * lease is `request.lease`); no slot is a 429 problem with them and
 * Retry-After (or `statusCode`, `message`, `handler`); a shed call or a
 * failing-closed limiter is a 503.
 */
export function concurrencyHook<R extends NodeRequest = FastifyRequest>(
  limiter: Limiter,
  options: ConcurrencyHookOptions<R>,
): (request: NoInfer<R>, reply: FastifyReply) => Promise<unknown> {
  checkConcurrencyOptions(limiter, options);
  return async (request: R, reply: FastifyReply): Promise<unknown> => {
    if (options.skip?.(request)) return undefined;
    let lease: Lease | undefined;
    try {
      lease = await acquireFor(limiter, options, request);
    } catch (error) {
      return missing(error, reply);
    }
    if (lease === undefined) return undefined;
    (request as R & { lease?: Lease }).lease = lease;
    const refused = refusal(lease, options);
    if (refused === undefined) {
      holdUntilSent(limiter, lease, reply.raw);
      setFields(reply, rateLimitHeaders(lease, { legacy: options.legacyHeaders ?? false }));
      return undefined;
    }
    return refuse(refused, options, request, reply);
  };
}

/**
 * `await fastify.register(rateLimitPlugin, { limiter, rules })`: the hook
 * on every route. Like plugins wrapped in fastify-plugin, it is not
 * encapsulated: it applies to the instance it is registered on.
 */
export const rateLimitPlugin: FastifyPluginAsync<PluginOptions> = async (fastify, options) => {
  if (!fastify.hasRequestDecorator("rateLimit")) fastify.decorateRequest("rateLimit", null);
  fastify.addHook("onRequest", rateLimitHook(options.limiter, options));
};
// What fastify-plugin sets: the hook reaches the routes of the parent instance.
Object.assign(rateLimitPlugin, {
  [Symbol.for("skip-override")]: true,
  [Symbol.for("fastify.display-name")]: "redis-tokenbucket",
});
