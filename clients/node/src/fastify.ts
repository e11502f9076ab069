// Fastify: a plugin adding an onRequest hook that charges each request
// against its rules (for every route of the instance it is registered on),
// the hook alone, for single routes, and a hook holding a concurrency slot
// per request until its response is done. Fastify is not imported.

import { mergeRateLimitHeaders, rateLimitHeaders } from "./headers.js";
import {
  acquireFor,
  type ConcurrencyLimitOptions,
  check,
  checkConcurrencyOptions,
  checkRules,
  holdUntilSent,
  type LimitOptions,
  type NodeRequest,
  PROBLEM_JSON,
  type ResponseEvents,
  type Rule,
  refusal,
} from "./http.js";
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
  type Rule,
} from "./http.js";

interface FastifyReply {
  code(status: number): FastifyReply;
  header(name: string, value: string): FastifyReply;
  getHeaders(): Record<string, unknown>;
  type(type: string): FastifyReply;
  send(body: string): FastifyReply;
  /** Node's http.ServerResponse under the reply. */
  raw?: ResponseEvents;
}

interface FastifyInstance {
  addHook(name: "onRequest", hook: (request: never, reply: FastifyReply) => Promise<unknown>): unknown;
  decorateRequest?(name: string, value: unknown): unknown;
}

/** Sets a limiter's fields, joining those an earlier hook set on the reply. */
function setFields(reply: FastifyReply, fields: Record<string, string>): void {
  for (const [k, v] of Object.entries(mergeRateLimitHeaders(reply.getHeaders(), fields))) reply.header(k, v);
}

export interface HookOptions<R extends NodeRequest> extends LimitOptions {
  rules: readonly Rule<R>[];
  /** True to let a request through unlimited (health checks, say). */
  skip?: (request: R) => boolean;
}

export interface PluginOptions<R extends NodeRequest> extends HookOptions<R> {
  limiter: Limiter;
}

/**
 * An onRequest hook: `fastify.get("/x", { onRequest: rateLimitHook(limiter, { rules }) }, handler)`.
 * Admitted requests carry RateLimit-Policy and RateLimit (the decision is
 * `request.rateLimit`); a denial is a 429 problem with them and
 * Retry-After; a shed call or a failing-closed limiter is a 503 with
 * Retry-After.
 */
export function rateLimitHook<R extends NodeRequest>(limiter: Limiter, options: HookOptions<R>) {
  checkRules(options.rules);
  return async (request: R, reply: FastifyReply): Promise<unknown> => {
    if (options.skip?.(request)) return undefined;
    const decision = await check(limiter, options.rules, request, options);
    if (decision === undefined) return undefined;
    (request as R & { rateLimit?: unknown }).rateLimit = decision;
    const refused = refusal(decision, options);
    if (refused === undefined) {
      setFields(reply, rateLimitHeaders(decision, { legacy: options.legacyHeaders ?? false }));
      return undefined;
    }
    setFields(reply, refused.headers);
    return reply.code(refused.status).type(PROBLEM_JSON).send(JSON.stringify(refused.body));
  };
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
 * Retry-After; a shed call or a failing-closed limiter is a 503.
 */
export function concurrencyHook<R extends NodeRequest>(limiter: Limiter, options: ConcurrencyLimitOptions<R>) {
  checkConcurrencyOptions(options);
  return async (request: R, reply: FastifyReply): Promise<unknown> => {
    if (options.skip?.(request)) return undefined;
    const lease = await acquireFor(limiter, options, request);
    if (lease === undefined) return undefined;
    (request as R & { lease?: unknown }).lease = lease;
    const refused = refusal(lease, options);
    if (refused === undefined) {
      if (reply.raw === undefined) throw new TypeError("concurrencyHook needs Fastify's reply.raw");
      holdUntilSent(limiter, lease, reply.raw);
      setFields(reply, rateLimitHeaders(lease, { legacy: options.legacyHeaders ?? false }));
      return undefined;
    }
    setFields(reply, refused.headers);
    return reply.code(refused.status).type(PROBLEM_JSON).send(JSON.stringify(refused.body));
  };
}

/**
 * `await fastify.register(rateLimitPlugin, { limiter, rules })`: the hook
 * on every route. Like plugins wrapped in fastify-plugin, it is not
 * encapsulated: it applies to the instance it is registered on.
 */
export async function rateLimitPlugin<R extends NodeRequest>(fastify: FastifyInstance, options: PluginOptions<R>) {
  fastify.decorateRequest?.("rateLimit", null);
  fastify.addHook("onRequest", rateLimitHook(options.limiter, options) as never);
}
// What fastify-plugin sets: the hook reaches the routes of the parent instance.
Object.assign(rateLimitPlugin, {
  [Symbol.for("skip-override")]: true,
  [Symbol.for("fastify.display-name")]: "redis-tokenbucket",
});
