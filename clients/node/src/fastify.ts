// Fastify: a plugin adding an onRequest hook that charges each request
// against its rules (for every route of the instance it is registered on),
// and the hook alone, for single routes. Fastify is not imported.

import { rateLimitHeaders } from "./headers.js";
import { check, checkRules, type LimitOptions, type NodeRequest, PROBLEM_JSON, type Rule, refusal } from "./http.js";
import type { Limiter } from "./limiter.js";

export { apiKey, clientIp, type KeyFunction, type NodeRequest, QUOTA_EXCEEDED, type Rule } from "./http.js";

interface FastifyReply {
  code(status: number): FastifyReply;
  header(name: string, value: string): FastifyReply;
  type(type: string): FastifyReply;
  send(body: string): FastifyReply;
}

interface FastifyInstance {
  addHook(name: "onRequest", hook: (request: never, reply: FastifyReply) => Promise<unknown>): unknown;
  decorateRequest?(name: string, value: unknown): unknown;
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
      for (const [k, v] of Object.entries(rateLimitHeaders(decision, { legacy: options.legacyHeaders ?? false }))) {
        reply.header(k, v);
      }
      return undefined;
    }
    for (const [k, v] of Object.entries(refused.headers)) reply.header(k, v);
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
