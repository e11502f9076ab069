// HTTP rate-limit fields of a decision.
//
// draft-ietf-httpapi-ratelimit-headers-11, as structured-field lists with
// one item per bucket, in the same order in both fields:
//
//   RateLimit-Policy: "user";q=10;w=59, "ip";q=600;w=20
//   RateLimit: "user";r=9;t=6, "ip";r=599;t=1
//
// `q` is the burst (max, rounded down), `w` the seconds to refill all of it
// (ceil(max / rate)), `r` the whole tokens left (0 while in debt), `t` the
// seconds, rounded up, until that bucket stops limiting: its retry time
// when it denies, else the time until it is full. A bucket without a name
// is "default". A denial adds Retry-After in whole seconds, rounded up, so
// a retry then passes. The legacy X-RateLimit-Limit/-Remaining describe
// the most restrictive bucket only.

import { type Decision, MultiDecision, wholeSeconds } from "./decision.js";

function sfString(text: string): string {
  // Names are printable ASCII (Bucket checks), so escaping is all that's left.
  return `"${text.replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
}

export interface HeaderOptions {
  /** Also X-RateLimit-Limit and X-RateLimit-Remaining, for the most restrictive bucket. */
  legacy?: boolean;
}

/**
 * The fields for a response to the request `decision` answered. Empty for
 * a degraded or shed decision: Redis said nothing to report.
 */
export function rateLimitHeaders(
  decision: Decision | MultiDecision,
  options: HeaderOptions = {},
): Record<string, string> {
  if (decision.degraded || decision.shed) return {};
  const decisions = decision instanceof MultiDecision ? decision.decisions : [decision];
  const tightest = decision instanceof MultiDecision ? decision.tightest : decision;
  const policy: string[] = [];
  const current: string[] = [];
  for (const d of decisions) {
    const name = sfString(d.bucket.name ?? "default");
    policy.push(`${name};q=${Math.floor(d.bucket.max)};w=${Math.ceil(d.bucket.max / d.bucket.rate)}`);
    current.push(`${name};r=${Math.max(d.remaining, 0)};t=${wholeSeconds(d.waitMs)}`);
  }
  const headers: Record<string, string> = { "RateLimit-Policy": policy.join(", "), RateLimit: current.join(", ") };
  if (options.legacy) {
    headers["X-RateLimit-Limit"] = String(Math.floor(tightest.bucket.max));
    headers["X-RateLimit-Remaining"] = String(Math.max(tightest.remaining, 0));
  }
  if (!decision.allowed) headers["Retry-After"] = String(decision.retryAfter);
  return headers;
}
