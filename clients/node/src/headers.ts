// HTTP rate-limit fields of a decision.
//
// draft-ietf-httpapi-ratelimit-headers-11, as structured-field lists with
// one item per bucket, in the same order in both fields:
//
//   RateLimit-Policy: "user";q=10;w=59, "ip";q=600;w=20
//   RateLimit: "user";r=9;t=6, "ip";r=599;t=1
//
// `q` is the burst (max, rounded down, and at least 1: a bucket whose max
// is below 1 still admits what costs less), `w` the seconds to refill all of it
// (ceil(max / rate)), `r` the whole tokens left (0 while in debt), `t` the
// seconds, rounded up, until that bucket stops limiting: its retry time
// when it denies, else the time until it is full. A bucket without a name
// is "default". A denial adds Retry-After in whole seconds, rounded up, so
// a retry then passes. The legacy X-RateLimit-Limit/-Remaining describe
// the most restrictive bucket only.
//
// A Lease's Concurrency is a policy of the draft's quota unit
// "concurrent-requests", with no window:
//
//   RateLimit-Policy: "streams";q=8;qu="concurrent-requests", "user";q=10;w=59
//   RateLimit: "streams";r=6, "user";r=9;t=6
//
// `q` is the limit, `r` the slots left after the call, and `t` (only when
// no slot is free) the seconds until one is, rounded up. The legacy fields
// describe the slots when they deny, else the most restrictive bucket.
//
// A Quota is a policy whose `q` is its limit and `w` the length of its
// current period in seconds; its default name is the period's ("day",
// "month", "3600s"):
//
//   RateLimit-Policy: "month";q=1000;w=2678400
//   RateLimit: "month";r=990;t=86400
//
// An admitted reservation (maxWaitMs) is admitted: no Retry-After.

import { type Decision, MultiDecision, wholeSeconds } from "./decision.js";
import { Lease } from "./lease.js";
import { Quota, type Rule } from "./quota.js";

/** A rule's burst in whole tokens, as the fields state it: rounded down, but never 0. */
function quota(bucket: Rule): number {
  return Math.max(1, Math.floor(bucket.max));
}

/** A decision's policy item: its name, `q` and `w`. */
function policyOf(d: Decision): [string, string] {
  const rule = d.bucket;
  if (rule instanceof Quota) {
    const name = sfString(rule.name ?? rule.periodName);
    return [name, `${name};q=${quota(rule)};w=${rule.windowSeconds(d.resetAfterMs)}`];
  }
  const name = sfString(rule.name ?? "default");
  return [name, `${name};q=${quota(rule)};w=${Math.ceil(rule.max / rule.rate)}`];
}

function sfString(text: string): string {
  // Names are printable ASCII (Bucket checks), so escaping is all that's left.
  return `"${text.replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
}

export interface HeaderOptions {
  /** Also X-RateLimit-Limit and X-RateLimit-Remaining, for the most restrictive bucket. */
  legacy?: boolean;
}

/**
 * The fields for a response to the request `decision` answered: a
 * Decision, a MultiDecision, or a Lease (its Concurrency first, then its
 * buckets). Empty for a degraded or shed decision: Redis said nothing to
 * report.
 */
export function rateLimitHeaders(
  decision: Decision | MultiDecision | Lease,
  options: HeaderOptions = {},
): Record<string, string> {
  if (decision.degraded || decision.shed) return {};
  const policy: string[] = [];
  const current: string[] = [];
  let decisions: readonly Decision[];
  let allowed: boolean;
  let legacy: [number, number];
  if (decision instanceof Lease) {
    const c = decision.concurrency;
    const name = sfString(c.name ?? "default");
    policy.push(`${name};q=${c.limit};qu="concurrent-requests"`);
    // `t` only when the slots are what it waits for: a slot has no reset time.
    current.push(`${name};r=${decision.remaining}${decision.busy ? `;t=${decision.retryAfter}` : ""}`);
    decisions = decision.decisions;
    allowed = decision.acquired;
    legacy =
      decision.busy || decisions.length === 0
        ? [c.limit, decision.remaining]
        : legacyOf(new MultiDecision(allowed, decision.retryAfterMs, decisions).tightest);
  } else if (decision instanceof MultiDecision) {
    decisions = decision.decisions;
    allowed = decision.allowed;
    legacy = legacyOf(decision.tightest);
  } else {
    decisions = [decision];
    allowed = decision.allowed;
    legacy = legacyOf(decision);
  }
  for (const d of decisions) {
    const [name, item] = policyOf(d);
    policy.push(item);
    current.push(`${name};r=${Math.max(d.remaining, 0)};t=${wholeSeconds(d.waitMs)}`);
  }
  const headers: Record<string, string> = { "RateLimit-Policy": policy.join(", "), RateLimit: current.join(", ") };
  if (options.legacy) {
    headers["X-RateLimit-Limit"] = String(legacy[0]);
    headers["X-RateLimit-Remaining"] = String(legacy[1]);
  }
  if (!allowed) headers["Retry-After"] = String(decision.retryAfter);
  return headers;
}

/** X-RateLimit-Limit and -Remaining of the most restrictive bucket. */
function legacyOf(tightest: Decision): [number, number] {
  return [quota(tightest.bucket), Math.max(tightest.remaining, 0)];
}

/** A header's value as a string (Node's are also numbers or arrays of lines). */
function text(value: unknown): string | undefined {
  if (value === undefined || value === null) return undefined;
  return Array.isArray(value) ? value.join(", ") : String(value);
}

/** The items of a structured-field list: split at the commas outside sf-strings. */
function items(list: string): string[] {
  const out: string[] = [];
  let start = 0;
  let quoted = false;
  for (let i = 0; i < list.length; i++) {
    const c = list[i];
    if (quoted && c === "\\") i++;
    else if (c === '"') quoted = !quoted;
    else if (c === "," && !quoted) {
      out.push(list.slice(start, i).trim());
      start = i + 1;
    }
  }
  out.push(list.slice(start).trim());
  return out.filter((item) => item !== "");
}

/** A list item's policy name: its leading sf-string (or token), as written. */
function itemName(item: string): string {
  return /^("(?:[^"\\]|\\.)*"|[^;\s]*)/.exec(item)?.[1] ?? item;
}

/**
 * The fields to set on a response that already carries some, when another
 * limiter's `added` fields join them (limiters stacked on one request).
 * RateLimit and RateLimit-Policy are lists: the added policies join the
 * ones there, a policy of the same name taking its place. Retry-After is
 * the longer wait; the legacy X-RateLimit-Limit and -Remaining stay those
 * of the most restrictive (fewest remaining). `current` is the response's
 * headers, names in any case (`res.getHeaders()`, `reply.getHeaders()`,
 * `Object.fromEntries(response.headers)`).
 */
export function mergeRateLimitHeaders(
  current: Readonly<Record<string, unknown>>,
  added: Readonly<Record<string, string>>,
): Record<string, string> {
  const lower = new Map(Object.entries(current).map(([k, v]) => [k.toLowerCase(), text(v)]));
  const now = (name: string) => lower.get(name.toLowerCase());
  const out: Record<string, string> = { ...added };
  for (const name of ["RateLimit", "RateLimit-Policy"]) {
    const there = now(name);
    const more = added[name];
    if (!there || more === undefined) continue;
    const merged = items(there);
    for (const item of items(more)) {
      const at = merged.findIndex((m) => itemName(m) === itemName(item));
      if (at >= 0) merged[at] = item;
      else merged.push(item);
    }
    out[name] = merged.join(", ");
  }
  const retry = now("Retry-After");
  if (retry !== undefined && added["Retry-After"] !== undefined && Number(retry) > Number(added["Retry-After"])) {
    out["Retry-After"] = retry;
  }
  const remaining = now("X-RateLimit-Remaining");
  if (remaining !== undefined && added["X-RateLimit-Remaining"] !== undefined) {
    if (Number(remaining) < Number(added["X-RateLimit-Remaining"])) {
      delete out["X-RateLimit-Limit"];
      delete out["X-RateLimit-Remaining"];
    }
  }
  return out;
}
