// Hono, Bun, Next.js route handlers, and any handler that speaks the fetch
// API's Request and Response.

import type { Decision, MultiDecision } from "./decision.js";
import { MultiDecision as Multi } from "./decision.js";
import { type HeaderOptions, mergeRateLimitHeaders, rateLimitHeaders } from "./headers.js";
import { PROBLEM_JSON, refusal } from "./http.js";
import { Lease } from "./lease.js";

export { QUOTA_EXCEEDED } from "./http.js";

/**
 * The Response refusing a request, or null when the decision (or lease)
 * admits it: 429 with RateLimit, RateLimit-Policy, Retry-After and a
 * problem+json body for a denial; 503 with Retry-After for a shed call or
 * a failing-closed limiter. A lease's slot is the caller's to release
 * (`lim.hold`, or `lim.keeper(lease)` until the Response's body is done).
 *
 *   const d = await limiter.consume(key, bucket);
 *   const refused = rateLimitResponse(d);
 *   if (refused) return refused;
 *
 * To delay a request over the bucket instead of refusing it, take its turn
 * with `await limiter.wait(key, bucket, cost, { maxWaitMs })` (which sleeps
 * the delay): an admitted reservation is admitted here, without Retry-After.
 */
export function rateLimitResponse(
  decision: Decision | MultiDecision | Lease,
  options: HeaderOptions = {},
): Response | null {
  const multi =
    decision instanceof Multi || decision instanceof Lease
      ? decision
      : new Multi(decision.allowed, decision.allowed ? 0 : decision.retryAfterMs, [decision], decision);
  const refused = refusal(multi, { legacyHeaders: options.legacy ?? false });
  if (refused === undefined) return null;
  return new Response(JSON.stringify(refused.body), {
    status: refused.status,
    headers: { ...refused.headers, "Content-Type": PROBLEM_JSON },
  });
}

/**
 * A new Response: `response` (its status, headers and body, which it
 * takes over) with the decision's RateLimit fields added, for an admitted
 * request. A new one because a Response from fetch() can't be changed
 * (its headers are immutable); the fields join any that another limiter
 * put on `response` (RateLimit and RateLimit-Policy are lists).
 */
export function withRateLimitHeaders(
  response: Response,
  decision: Decision | MultiDecision | Lease,
  options: HeaderOptions = {},
): Response {
  const headers = new Headers(response.headers);
  const fields = mergeRateLimitHeaders(Object.fromEntries(headers), rateLimitHeaders(decision, options));
  for (const [k, v] of Object.entries(fields)) headers.set(k, v);
  return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
}
