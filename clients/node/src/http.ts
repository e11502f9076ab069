// What the framework helpers share: rules (a bucket per identity),
// concurrency rules (a slot per identity, held until the response is
// done), the identity functions, and the HTTP answer for a decision or a
// lease (docs/failure-model.md, HTTP answers):
//
//   admitted                 the route's status, RateLimit and RateLimit-Policy
//   denied by Redis          429, the fields, Retry-After, a problem+json body
//   shed (local overload)    503, Retry-After
//   degraded, "closed"       503, Retry-After: 1
//   degraded, "open"         the route's status, no fields
//   degraded, "local"        the route's, or 429 with Retry-After from the local bucket
//
// A rule with `maxDelayMs` delays a request over its bucket instead: a
// reservation (TB.CONSUME ... WAIT) admitted within that wait holds the
// request for its delay before the handler runs; only one beyond it is a 429.

import { createHash } from "node:crypto";
import { BlockList, isIP } from "node:net";
import { type Amount, Bucket, checkCost, number } from "./bucket.js";
import { MultiDecision } from "./decision.js";
import { AlwaysDenied, MissingIdentity } from "./errors.js";
import { rateLimitHeaders } from "./headers.js";
import { Concurrency, checkInt, Lease } from "./lease.js";
import type { GroupIn, Limiter, ManyOptions } from "./limiter.js";
import { checkBlock, penalized, penalty } from "./penalty.js";
import { checkQuotaCost, Quota } from "./quota.js";
import { checkMaxWait } from "./requests.js";

/** The request, as Node's http server gives it (Express and Fastify requests are this too). */
export interface NodeRequest {
  headers: Record<string, string | string[] | undefined>;
  socket?: { remoteAddress?: string | undefined } | undefined;
  /** The client's address as the framework reads it (Express's trust proxy, Fastify's trustProxy). */
  ip?: string | undefined;
}

/**
 * The request's identity for one rule, or undefined when it has none (the
 * rule's `fallback` is asked next; then the request is refused with a 400,
 * unless the rule is `optional`).
 */
export type KeyFunction<R = NodeRequest> = (request: R) => string | undefined | Promise<string | undefined>;

/**
 * A limit of zero (envoyproxy/ratelimit's `requests_per_unit: 0`): a rule
 * whose bucket is a Deny refuses every request it applies to with a 429,
 * without calling Redis. No refill ever admits one, so Retry-After is
 * `retryAfter` seconds (an hour by default): long enough to keep a client
 * out of a retry loop, short enough to notice the rule lifted.
 */
export class Deny {
  readonly name: string;
  readonly retryAfter: number;
  constructor(options: { name: string; retryAfter?: number }) {
    if (options === null || typeof options !== "object" || typeof options.name !== "string" || options.name === "") {
      throw new TypeError("Deny takes { name, retryAfter? }");
    }
    const retryAfter = options.retryAfter ?? 3600;
    if (!Number.isSafeInteger(retryAfter) || retryAfter < 1) {
      throw new RangeError(`a Deny's retryAfter is a whole number of seconds >= 1, got ${String(options.retryAfter)}`);
    }
    this.name = options.name;
    this.retryAfter = retryAfter;
    Object.freeze(this);
  }
}

/** A trusted caller lets a rule through: a function of the request, or a set of identities (what `key` gives). */
export type Skip<R> = ((request: R) => boolean | Promise<boolean>) | ReadonlySet<string>;

export interface Rule<R = NodeRequest> {
  /**
   * The bucket. Its name names the policy in the headers and in
   * `violated-policies`, and is part of the Redis key, so on one limiter a
   * name has one max and rate (another is refused when written).
   */
  bucket: Bucket | Quota | Deny;
  /** The identity: requests are charged at the Redis key `prefix:name:identity`. */
  key: KeyFunction<R>;
  /** Asked when `key` gives no identity (`clientIp`, say). */
  fallback?: KeyFunction<R>;
  /**
   * Skip the rule for a request with no identity (visible in the
   * MultiDecision's `skipped`); by default such a request is refused with
   * a 400, so that leaving out a header never escapes a limit.
   */
  optional?: boolean;
  /**
   * Dry-run: the rule is charged as any other, in a consumeMany of its own
   * beside the enforced rules' (so neither stops the other's charge), and
   * never refuses: its denial is reported "shadow_mode" to the limiter's
   * onDecision and logged, never answered with a 429, and puts no fields on
   * the response. A request without its identity skips it.
   */
  shadow?: boolean;
  /** Tokens per request (default 1), or a function of the request. */
  cost?: Amount | ((request: R) => Amount);
  /** The first part of the Redis key (default "rl"). */
  prefix?: string;
  /**
   * Delay instead of refuse: a request over the bucket waits its turn if
   * that comes within this many ms (an integer, 0 to 1e14), and goes to
   * the handler then; beyond it, 429. One wait for the whole decision:
   * every bucket rule of a middleware gives the same, or none (quotas
   * never delay).
   */
  maxDelayMs?: number;
  /**
   * A penalty (rate-limiter-flexible's `blockDuration`): a request the
   * bucket denies charges it into debt (TB.ADJUST) so the caller is
   * refused for this many ms from the denial. The module's floor of `-max`
   * bounds it: at most `1000 * (max + cost) / rate`, checked when the rule
   * is written (for a cost function, when a request is charged).
   */
  blockMs?: number;
  /** Trusted callers skip the rule: nothing is sent, and it is named in `skipped`. */
  skip?: Skip<R>;
}

export interface LimitOptions extends Pick<ManyOptions, "atomic" | "onError" | "timeoutMs"> {
  /** Also send X-RateLimit-Limit and X-RateLimit-Remaining. */
  legacyHeaders?: boolean;
}

/** How a denial by a limit is answered, as express-rate-limit's options say it. */
export interface RefusalOptions<R> {
  /**
   * The status of a denial by a limit (default 429). Shed and
   * failing-closed answers stay 503: no limit was reached.
   */
  statusCode?: number;
  /**
   * The body of a denial by a limit, instead of the RFC 9457 problem: a
   * string, an object (sent as JSON), or a function of the request and
   * the refusal returning either (or a Promise of it).
   */
  message?: string | object | ((request: R, refusal: Refusal) => unknown);
}

/** Checks `statusCode` and `message` when they are written. */
export function checkRefusalOptions<R>(options: RefusalOptions<R>): void {
  const status = options.statusCode;
  if (status !== undefined && !(Number.isInteger(status) && status >= 400 && status <= 599)) {
    throw new RangeError(`statusCode must be an HTTP error status (an integer 400 to 599), got ${String(status)}`);
  }
  const message = options.message;
  if (message !== undefined && message !== null && !["string", "object", "function"].includes(typeof message)) {
    throw new TypeError(`message must be a string, an object or a function, got ${typeof message}`);
  }
}

/** The Redis key prefix of a rule or concurrency rule: `prefix:name`. */
function policyKey(prefix: string | undefined, name: string | undefined): string {
  return `${prefix ?? "rl"}:${name}`;
}

// The limits each `prefix:name` has on a limiter, kept on the limiter
// under a registered symbol (so the ESM and CommonJS builds share it).
const POLICIES = Symbol.for("redis-tokenbucket.policies");

type Limit = Bucket | Quota | Concurrency;

function describe(limit: Limit): string {
  if (limit instanceof Concurrency) return `a Concurrency of limit ${limit.limit}`;
  if (limit instanceof Quota) return `a Quota of ${limit.limit} per ${limit.periodName}`;
  return `max ${limit.max}, rate ${limit.rate}`;
}

function sameLimits(a: Limit, b: Limit): boolean {
  if (a instanceof Concurrency || b instanceof Concurrency) {
    return a instanceof Concurrency && b instanceof Concurrency && a.limit === b.limit;
  }
  if (a instanceof Quota || b instanceof Quota) return a instanceof Quota && a.sameLimits(b);
  return a.sameLimits(b);
}

/**
 * Records the policies of a middleware or hook on its limiter, refusing
 * one whose `prefix:name` the limiter already has with other limits: both
 * would charge the same Redis keys. All are checked before any is kept.
 */
function claim(limiter: Limiter, policies: readonly [string, Limit][]): void {
  const held = limiter as unknown as { [POLICIES]?: Map<string, Limit> };
  const known = new Map(held[POLICIES] ?? []);
  for (const [key, limit] of policies) {
    const there = known.get(key);
    if (there !== undefined && !sameLimits(there, limit)) {
      const name = key.slice(key.indexOf(":") + 1);
      throw new RangeError(
        `policy ${JSON.stringify(name)} (key ${key}:<identity>) is ${describe(there)} on this limiter: ` +
          `not ${describe(limit)}; give one of them another name or prefix`,
      );
    }
    known.set(key, limit);
  }
  Object.defineProperty(held, POLICIES, { value: known, configurable: true });
}

/**
 * Checks rules when they are written: names present, constant costs valid,
 * and no name the limiter already has with other limits.
 */
export function checkRules<R>(limiter: Limiter, rules: readonly Rule<R>[]): void {
  if (rules.length === 0) throw new RangeError("at least one rule is needed");
  for (const rule of rules) {
    if (rule.bucket.name === undefined) {
      throw new RangeError("a rule's bucket needs a name: new Bucket({ max, rate, name: 'user' })");
    }
    if (rule.skip !== undefined && typeof rule.skip !== "function" && !(rule.skip instanceof Set)) {
      throw new TypeError(`rule ${rule.bucket.name}: skip is a function of the request or a Set of identities`);
    }
    if (rule.bucket instanceof Deny) {
      if (rule.blockMs !== undefined || rule.shadow === true || rule.maxDelayMs !== undefined) {
        throw new TypeError(`rule ${rule.bucket.name}: a Deny takes no blockMs or maxDelayMs and is never shadow`);
      }
      continue;
    }
    if (rule.cost !== undefined && typeof rule.cost !== "function") {
      if (rule.bucket instanceof Quota) checkQuotaCost(rule.cost, rule.bucket);
      else checkCost(rule.cost, rule.bucket);
    }
    if (rule.blockMs !== undefined) {
      const cost = typeof rule.cost === "function" ? 0 : number(rule.cost ?? 1, "cost");
      checkBlock(rule.blockMs, rule.bucket, cost);
    }
    if (rule.maxDelayMs !== undefined) checkMaxWait(rule.maxDelayMs, "consume", rule.bucket);
    if (rule.shadow !== undefined && typeof rule.shadow !== "boolean") {
      throw new TypeError(`rule ${rule.bucket.name}: shadow must be true or false`);
    }
  }
  maxDelayOf(rules);
  claim(
    limiter,
    limited(rules).map((rule) => [policyKey(rule.prefix, rule.bucket.name), rule.bucket]),
  );
}

/** The rules that have a bucket: not a Deny's. */
function limited<R>(rules: readonly Rule<R>[]): (Rule<R> & { bucket: Bucket | Quota })[] {
  return rules.filter((r): r is Rule<R> & { bucket: Bucket | Quota } => !(r.bucket instanceof Deny));
}

/**
 * Fills `identity`'s bucket of each rule again (a refund of twice its max
 * fills it from any debt, and a full bucket's key is deleted): what
 * express-rate-limit's `resetKey` does. Redis errors are thrown.
 */
export async function resetIdentity<R>(limiter: Limiter, rules: readonly Rule<R>[], identity: string): Promise<void> {
  await Promise.all(
    limited(rules).map((rule) =>
      limiter.adjust(`${policyKey(rule.prefix, rule.bucket.name)}:${identity}`, rule.bucket, 2 * rule.bucket.max, {
        onError: "raise",
      }),
    ),
  );
}

/** The wait of a middleware's bucket rules: one for the whole decision, or none. */
function maxDelayOf<R>(rules: readonly Rule<R>[]): number | undefined {
  const buckets = rules.filter((r) => r.bucket instanceof Bucket);
  const waits = new Set(buckets.map((r) => r.maxDelayMs));
  if (waits.size > 1) {
    throw new RangeError("maxDelayMs is one wait for the whole decision: give every bucket rule the same, or none");
  }
  return buckets[0]?.maxDelayMs;
}

/** A request's identity for a rule: its key's, else its fallback's; MissingIdentity unless optional. */
async function identityOf<R>(
  rule: { key: KeyFunction<R>; fallback?: KeyFunction<R>; optional?: boolean; shadow?: boolean },
  request: R,
  name: string,
): Promise<string | undefined> {
  let identity = await rule.key(request);
  if (identity === undefined && rule.fallback !== undefined) identity = await rule.fallback(request);
  // A shadow rule never refuses: one without an identity is skipped.
  if (identity === undefined && rule.optional !== true && rule.shadow !== true) throw new MissingIdentity(name);
  return identity;
}

/** Whether a trusted caller's request skips the rule: `skip` answers true, or holds its identity. */
async function skips<R>(rule: Rule<R>, request: R): Promise<boolean> {
  if (rule.skip === undefined) return false;
  if (typeof rule.skip === "function") return (await rule.skip(request)) === true;
  let identity = await rule.key(request);
  if (identity === undefined && rule.fallback !== undefined) identity = await rule.fallback(request);
  return identity !== undefined && rule.skip.has(identity);
}

/**
 * A request's `[key, rule, cost]` groups under its rules, the rule of each,
 * and those skipped: optional ones without an identity, and trusted
 * callers' (`skip`). A Deny rule that applies throws AlwaysDenied before
 * anything is sent.
 */
async function groupsOf<R>(rules: readonly Rule<R>[], request: R): Promise<[GroupIn[], string[], Rule<R>[]]> {
  const groups: [string, Bucket | Quota, Amount][] = [];
  const skipped: string[] = [];
  const ruled: Rule<R>[] = [];
  for (const rule of rules) {
    const name = rule.bucket.name as string;
    const identity = (await skips(rule, request)) ? undefined : await identityOf(rule, request, name);
    if (identity === undefined) {
      skipped.push(name);
      continue;
    }
    if (rule.bucket instanceof Deny) throw new AlwaysDenied(name, rule.bucket.retryAfter);
    const cost = typeof rule.cost === "function" ? rule.cost(request) : (rule.cost ?? 1);
    if (rule.blockMs !== undefined && typeof rule.cost === "function") {
      checkBlock(rule.blockMs, rule.bucket, number(cost, "cost"));
    }
    groups.push([`${policyKey(rule.prefix, name)}:${identity}`, rule.bucket, cost]);
    ruled.push(rule);
  }
  return [groups, skipped, ruled];
}

/**
 * The penalties of a denial (`blockMs`): each bucket that denied it, whose
 * rule has a block, charged into debt (TB.ADJUST, failing open: the denial
 * stands whatever becomes of it). An admitted, shadow, cached or degraded
 * decision is charged nothing.
 */
async function penalize<R>(
  limiter: Limiter,
  groups: readonly GroupIn[],
  ruled: readonly Rule<R>[],
  m: MultiDecision,
  timeoutMs?: number,
): Promise<MultiDecision> {
  if (m.allowed || m.cached || m.degraded || m.shed) return m;
  let changed = false;
  const decisions = await Promise.all(
    m.decisions.map(async (d, i) => {
      const blockMs = ruled[i]?.blockMs;
      const group = groups[i];
      if (blockMs === undefined || group === undefined) return d;
      const charge = penalty(d, blockMs);
      if (charge <= 0) return d;
      const adjusted = await limiter.adjust(group[0], group[1], -charge, { timeoutMs, onError: "open" });
      changed = true;
      return penalized(d, adjusted, blockMs);
    }),
  );
  if (!changed) return m;
  const retry = Math.max(...decisions.map((d) => d.retryAfterMs));
  return new MultiDecision(m.allowed, retry, decisions, { ...m });
}

/**
 * Charges the shadow rules in a consumeMany of their own (the decision is
 * all or nothing: a shadow denial in the enforced call would stop the
 * enforced rules' charge), under onError "open" and never throwing: a
 * shadow rule never refuses a request, whatever Redis does. Its decision
 * goes to the onDecision hook and the log only.
 */
async function chargeShadow<R>(limiter: Limiter, rules: readonly Rule<R>[], request: R, timeoutMs?: number) {
  try {
    const [groups] = await groupsOf(rules, request);
    if (groups.length > 0) await limiter.consumeMany(groups, { timeoutMs, onError: "open", shadow: true });
  } catch (error) {
    limiter.logger.error(`rate limiter: a shadow rule's call failed; the request goes on: ${String(error)}`);
  }
}

/**
 * Charges a request against its rules in one consumeMany (no decisions,
 * and the rules in `skipped`, when every rule is optional and has no
 * identity; MissingIdentity when one that is not has none). With the
 * rules' `maxDelayMs`, a reservation's delay is slept here, before the
 * handler runs.
 */
export async function check<R>(
  limiter: Limiter,
  rules: readonly Rule<R>[],
  request: R,
  options: LimitOptions = {},
): Promise<MultiDecision> {
  const enforced = rules.filter((r) => r.shadow !== true);
  const shadowRules = rules.filter((r) => r.shadow === true);
  const [groups, skipped, ruled] = await groupsOf(enforced, request);
  const { atomic, onError, timeoutMs } = options;
  const shadow = shadowRules.length > 0 ? chargeShadow(limiter, shadowRules, request, timeoutMs) : undefined;
  if (groups.length === 0) {
    await shadow;
    return new MultiDecision(true, 0, [], { skipped });
  }
  const maxWaitMs = maxDelayOf(enforced);
  const wait = maxWaitMs === undefined || !groups.some(([, b]) => b instanceof Bucket) ? undefined : maxWaitMs;
  const [charged] = await Promise.all([
    limiter.consumeMany(groups, {
      atomic,
      onError,
      timeoutMs,
      ...(wait === undefined ? {} : { maxWaitMs: wait }),
    }),
    shadow,
  ]);
  const m = ruled.some((r) => r.blockMs !== undefined)
    ? await penalize(limiter, groups, ruled, charged, timeoutMs)
    : charged;
  if (m.delayMs > 0 && !m.degraded) await limiter.sleep(m.delayMs);
  return skipped.length === 0 ? m : new MultiDecision(m.allowed, m.retryAfterMs, m.decisions, { ...m, skipped });
}

// ---- concurrency: a slot per identity, held until the response is done -------------

export interface ConcurrencyRule<R = NodeRequest> {
  /**
   * The limit; its name names the policy in the headers and in
   * `violated-policies`. Or a function of the request (the caller's tier).
   */
  concurrency: Concurrency | ((request: R) => Concurrency);
  /** The identity: each request holds a slot of the Redis key `prefix:name:identity`. */
  key: KeyFunction<R>;
  /** Slots per request (default 1), or a function of the request. */
  weight?: number | ((request: R) => number);
  /** The first part of the Redis key (default "rl"). */
  prefix?: string;
  /** Asked when `key` gives no identity. */
  fallback?: KeyFunction<R>;
  /** Let a request with no identity through without a slot; by default it is a 400. */
  optional?: boolean;
}

export interface ConcurrencyLimitOptions<R>
  extends Pick<LimitOptions, "onError" | "timeoutMs" | "legacyHeaders">,
    RefusalOptions<R> {
  /** The slot each request holds until its response is done. */
  concurrency: ConcurrencyRule<NoInfer<R>>;
  /**
   * Buckets charged in the same TB.ACQUIRE as the slot, all or nothing. On
   * a Cluster their keys must share the lease key's hash slot (a hash tag
   * in the identity); else limit them with the rate-limit helper instead.
   */
  rules?: readonly Rule<NoInfer<R>>[];
  /** True to let a request through unlimited (health checks, say). */
  skip?: (request: R) => boolean;
}

function checkNamed(concurrency: Concurrency): void {
  if (concurrency.name === undefined) {
    throw new RangeError(
      "a concurrency rule's Concurrency needs a name: new Concurrency({ limit, leaseMs, name: 'streams' })",
    );
  }
}

/** Checks a concurrency rule and its bucket rules when they are written. */
export function checkConcurrencyOptions<R>(limiter: Limiter, options: ConcurrencyLimitOptions<R>): void {
  const rule = options.concurrency;
  if (rule === null || typeof rule !== "object") throw new TypeError("concurrency: expected { concurrency, key }");
  checkRefusalOptions(options);
  if (typeof rule.concurrency !== "function") {
    checkNamed(rule.concurrency);
    if (rule.weight !== undefined && typeof rule.weight !== "function") rule.concurrency.checkWeight(rule.weight);
    claim(limiter, [[policyKey(rule.prefix, rule.concurrency.name), rule.concurrency]]);
  } else if (rule.weight !== undefined && typeof rule.weight !== "function") {
    checkInt(rule.weight, "weight", 1);
  }
  if (options.rules?.some((r) => r.maxDelayMs !== undefined)) {
    throw new RangeError("maxDelayMs is for a rate-limit rule: a slot's buckets are charged with it, never reserved");
  }
  if (options.rules !== undefined && options.rules.length > 0) checkRules(limiter, options.rules);
}

/**
 * Takes the request's slot, with its bucket rules charged in the same
 * call; undefined when the concurrency rule's key is undefined (no limit).
 */
export async function acquireFor<R>(
  limiter: Limiter,
  options: ConcurrencyLimitOptions<R>,
  request: R,
): Promise<Lease | undefined> {
  const rule = options.concurrency;
  const concurrency = typeof rule.concurrency === "function" ? rule.concurrency(request) : rule.concurrency;
  const identity = await identityOf(rule, request, concurrency.name ?? "concurrency");
  if (identity === undefined) return undefined;
  checkNamed(concurrency);
  const weight = typeof rule.weight === "function" ? rule.weight(request) : (rule.weight ?? 1);
  const rules = options.rules ?? [];
  const shadowRules = rules.filter((r) => r.shadow === true);
  if (shadowRules.length > 0) await chargeShadow(limiter, shadowRules, request, options.timeoutMs);
  const [buckets] = await groupsOf(
    rules.filter((r) => r.shadow !== true),
    request,
  );
  const key = `${policyKey(rule.prefix, concurrency.name)}:${identity}`;
  return limiter.acquire(key, concurrency, {
    weight,
    buckets,
    onError: options.onError,
    timeoutMs: options.timeoutMs,
  });
}

/** Node's http.ServerResponse as far as holding a slot needs it (Express's res, Fastify's reply.raw). */
export interface ResponseEvents {
  once(event: "finish" | "close", listener: () => void): unknown;
  readonly writableFinished?: boolean;
  readonly destroyed?: boolean;
}

/**
 * Renews `lease` until the response has been sent ('finish') or its
 * connection closed ('close': a client gone mid-stream), then releases it
 * and calls `then` (to settle a token budget, say; what it throws or
 * rejects with is logged). A lease that was not acquired is left alone.
 */
export function holdUntilSent(limiter: Limiter, lease: Lease, response: ResponseEvents, then?: () => unknown): void {
  if (!lease.acquired) return;
  const keeper = limiter.keeper(lease);
  let done = false;
  const end = () => {
    if (done) return;
    done = true;
    // end() never rejects; what `then` throws is logged.
    void keeper
      .end()
      .then(() => then?.())
      .catch((error: unknown) => limiter.logger.error(`rate limiter: holdUntilSent's then() failed: ${String(error)}`));
  };
  response.once("finish", end);
  response.once("close", end);
  if (response.writableFinished || response.destroyed) end(); // over before we listened
}

export const QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded";
export const PROBLEM_JSON = "application/problem+json";

/** A refusal: status, headers and a problem+json body (RFC 9457), for the decision or lease that refused. */
export interface Refusal {
  /** 429 for a denial by a limit; 503 for a shed call or a limiter failing closed. */
  status: 429 | 503;
  headers: Record<string, string>;
  body: Record<string, unknown>;
  decision: MultiDecision | Lease;
}

/**
 * What to send for a refusal, under a middleware's `statusCode` and
 * `message` (which apply to denials by a limit): the status, the body, and
 * its content type (undefined: the framework's, for a custom message).
 */
export async function answer<R>(
  refused: Refusal,
  options: RefusalOptions<R>,
  request: R,
): Promise<{ status: number; body: unknown; type: string | undefined }> {
  if (refused.status !== 429) return { status: refused.status, body: JSON.stringify(refused.body), type: PROBLEM_JSON };
  const status = options.statusCode ?? 429;
  const message = options.message;
  if (message === undefined) return { status, body: JSON.stringify({ ...refused.body, status }), type: PROBLEM_JSON };
  return { status, body: typeof message === "function" ? await message(request, refused) : message, type: undefined };
}

/**
 * The refusal to send for a decision or a lease, or undefined to let the
 * request through.
 */
export function refusal(
  decision: MultiDecision | Lease,
  options: { legacyHeaders?: boolean } = {},
): Refusal | undefined {
  if (decision instanceof Lease ? decision.acquired : decision.allowed) return undefined;
  // A denial with numbers is a bucket's (Redis's, or the in-process one of
  // onError "local"): 429. Without: shed, or failing closed: 503.
  if (decision.shed || (decision.degraded && decision.retryAfterMs === 0)) {
    const retry = decision.retryAfterMs > 0 ? decision.retryAfter : 1;
    return {
      status: 503,
      headers: { "Retry-After": String(retry) },
      body: {
        type: "about:blank",
        title: "Service Unavailable",
        status: 503,
        detail: decision.shed ? "The server is overloaded." : "The rate limiter is unavailable.",
      },
      decision,
    };
  }
  const violated = decision.deniedBy.map((d) => d.bucket.name ?? "default");
  // A lease denied for want of a slot (or with no bucket to blame) names its Concurrency first.
  if (decision instanceof Lease && (decision.busy || violated.length === 0)) {
    violated.unshift(decision.concurrency.name ?? "default");
  }
  const headers = rateLimitHeaders(decision, { legacy: options.legacyHeaders ?? false });
  // A degraded denial (onError "local") has no RateLimit fields, but its wait.
  headers["Retry-After"] ??= String(decision.retryAfter);
  return {
    status: 429,
    headers,
    body: {
      type: QUOTA_EXCEEDED,
      title: "Request cannot be satisfied as assigned quota has been exceeded",
      status: 429,
      detail: `Rate limited by ${violated.join(", ")}: retry in ${decision.retryAfter} s.`,
      "violated-policies": violated,
    },
    decision,
  };
}

// ---- identities -------------------------------------------------------------------

function header(request: NodeRequest, name: string): string | undefined {
  const value = request.headers[name.toLowerCase()];
  return Array.isArray(value) ? value.join(",") : value;
}

/**
 * The SHA-256 of the API key header: a high-entropy key can't be recovered
 * from it, so raw keys never reach Redis. Undefined without the header.
 */
export function apiKey(name = "X-API-Key"): KeyFunction {
  return (request) => {
    const raw = header(request, name);
    return raw ? createHash("sha256").update(raw).digest("hex") : undefined;
  };
}

interface Address {
  text: string;
  family: 4 | 6;
}

function parseIp(text: string): Address | undefined {
  let t = text.trim();
  const v = isIP(t);
  if (v === 0) return undefined;
  if (v === 6) {
    // IPv4-mapped addresses count as IPv4.
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(t);
    if (mapped) return { text: mapped[1] as string, family: 4 };
    t = t.toLowerCase();
  }
  return { text: t, family: v as 4 | 6 };
}

/** The 8 groups of an IPv6 address. */
function groups6(text: string): number[] {
  let t = text;
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(t);
  if (v4) {
    const [a, b, c, d] = (v4[1] as string).split(".").map(Number) as [number, number, number, number];
    t = `${t.slice(0, -(v4[1] as string).length)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = t.split("::") as [string, string | undefined];
  const h = head ? head.split(":") : [];
  const tl = tail === undefined ? [] : tail ? tail.split(":") : [];
  const fill = tail === undefined ? [] : Array(8 - h.length - tl.length).fill("0");
  return [...h, ...fill, ...tl].map((g) => Number.parseInt(g, 16));
}

/** The /64 an IPv6 address is in, compressed as Python's ipaddress writes it. */
function net64(text: string): string {
  const g = groups6(text).slice(0, 4).concat([0, 0, 0, 0]);
  // The longest run of zero groups (at least two, the first on a tie) becomes "::".
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (g[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && g[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = g.map((n) => n.toString(16));
  if (best < 0) return `${hex.join(":")}/64`;
  return `${hex.slice(0, best).join(":")}::${hex.slice(best + bestLen).join(":")}/64`;
}

/**
 * The client's address, IPv6 clients per /64 (IPv4-mapped addresses count
 * as IPv4).
 *
 * `clientIp()`: the address the framework read, `request.ip`, which
 * honours Express's `trust proxy` setting and Fastify's `trustProxy`
 * option (without them, the socket peer); the socket peer where there is
 * no `request.ip`.
 *
 * `clientIp(trustedProxies)`: the socket peer, unless the peer is one of
 * these proxies (addresses or networks), in which case X-Forwarded-For is
 * walked from the right (each proxy appends the address it received from)
 * to the first untrusted hop; the framework's setting is not used.
 *
 * Anyone can send X-Forwarded-For, so believing it from any peer would let a
 * client pick its own bucket, a fresh one per request. Hops left of the
 * first untrusted one were written by the client and are ignored; a
 * malformed hop ends the walk at the proxy that passed it on.
 */
export function clientIp(trustedProxies?: readonly string[]): KeyFunction {
  if (trustedProxies === undefined) {
    return (request) => {
      const framework = typeof request.ip === "string" ? parseIp(request.ip) : undefined;
      if (framework !== undefined) return framework.family === 6 ? net64(framework.text) : framework.text;
      return peerOf(request, () => false);
    };
  }
  const trusted = new BlockList();
  for (const entry of trustedProxies) {
    const [addr, prefix] = entry.split("/") as [string, string | undefined];
    const parsed = parseIp(addr);
    if (parsed === undefined) throw new RangeError(`not an address or network: ${entry}`);
    const type = parsed.family === 4 ? "ipv4" : "ipv6";
    if (prefix === undefined) trusted.addAddress(parsed.text, type);
    else trusted.addSubnet(parsed.text, Number(prefix), type);
  }
  const isTrusted = (a: Address) => trusted.check(a.text, a.family === 4 ? "ipv4" : "ipv6");
  return (request) => peerOf(request, isTrusted);
}

/** The socket peer, or the first untrusted hop of X-Forwarded-For behind trusted proxies. */
function peerOf(request: NodeRequest, isTrusted: (address: Address) => boolean): string {
  const peer = request.socket?.remoteAddress ?? "";
  let addr = parseIp(peer);
  if (addr === undefined) return peer || "unknown";
  const hops = (header(request, "x-forwarded-for") ?? "").split(",");
  for (const hop of hops.reverse()) {
    if (!isTrusted(addr)) break;
    const previous = parseIp(hop);
    if (previous === undefined) break;
    addr = previous;
  }
  return addr.family === 6 ? net64(addr.text) : addr.text;
}
