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

import { createHash } from "node:crypto";
import { BlockList, isIP } from "node:net";
import { type Amount, type Bucket, checkCost } from "./bucket.js";
import type { MultiDecision } from "./decision.js";
import { rateLimitHeaders } from "./headers.js";
import { type Concurrency, checkInt, Lease } from "./lease.js";
import type { GroupIn, Limiter, ManyOptions } from "./limiter.js";

/** The request, as Node's http server gives it (Express and Fastify requests are this too). */
export interface NodeRequest {
  headers: Record<string, string | string[] | undefined>;
  socket?: { remoteAddress?: string | undefined } | undefined;
}

/** The request's identity for one rule, or undefined to skip the rule. */
export type KeyFunction<R = NodeRequest> = (request: R) => string | undefined | Promise<string | undefined>;

export interface Rule<R = NodeRequest> {
  /** The bucket; its name names the policy in the headers and in `violated-policies`. */
  bucket: Bucket;
  /** The identity: requests are charged at `prefix:name:identity`. */
  key: KeyFunction<R>;
  /** Tokens per request (default 1), or a function of the request. */
  cost?: Amount | ((request: R) => Amount);
  /** Key prefix (default "rl"). */
  prefix?: string;
}

export interface LimitOptions extends Pick<ManyOptions, "atomic" | "onError" | "timeoutMs"> {
  /** Also send X-RateLimit-Limit and X-RateLimit-Remaining. */
  legacyHeaders?: boolean;
}

/** Checks rules when they are written: names present, constant costs valid. */
export function checkRules<R>(rules: readonly Rule<R>[]): void {
  if (rules.length === 0) throw new RangeError("at least one rule is needed");
  for (const rule of rules) {
    if (rule.bucket.name === undefined) {
      throw new RangeError("a rule's bucket needs a name: new Bucket({ max, rate, name: 'user' })");
    }
    if (rule.cost !== undefined && typeof rule.cost !== "function") checkCost(rule.cost, rule.bucket);
  }
}

/** A request's `[key, bucket, cost]` groups under its rules (a rule whose key is undefined is skipped). */
async function groupsOf<R>(rules: readonly Rule<R>[], request: R): Promise<GroupIn[]> {
  const groups: [string, Bucket, Amount][] = [];
  for (const rule of rules) {
    const identity = await rule.key(request);
    if (identity === undefined) continue;
    const cost = typeof rule.cost === "function" ? rule.cost(request) : (rule.cost ?? 1);
    groups.push([`${rule.prefix ?? "rl"}:${rule.bucket.name}:${identity}`, rule.bucket, cost]);
  }
  return groups;
}

/** Charges a request against its rules in one consumeMany; undefined when no rule applies. */
export async function check<R>(
  limiter: Limiter,
  rules: readonly Rule<R>[],
  request: R,
  options: LimitOptions = {},
): Promise<MultiDecision | undefined> {
  const groups = await groupsOf(rules, request);
  if (groups.length === 0) return undefined;
  const { atomic, onError, timeoutMs } = options;
  return limiter.consumeMany(groups, { atomic, onError, timeoutMs });
}

// ---- concurrency: a slot per identity, held until the response is done -------------

export interface ConcurrencyRule<R = NodeRequest> {
  /**
   * The limit; its name names the policy in the headers and in
   * `violated-policies`. Or a function of the request (the caller's tier).
   */
  concurrency: Concurrency | ((request: R) => Concurrency);
  /** The identity: each request holds a slot of `prefix:name:identity`. */
  key: KeyFunction<R>;
  /** Slots per request (default 1), or a function of the request. */
  weight?: number | ((request: R) => number);
  /** Key prefix (default "rl"). */
  prefix?: string;
}

export interface ConcurrencyLimitOptions<R> extends Pick<LimitOptions, "onError" | "timeoutMs" | "legacyHeaders"> {
  /** The slot each request holds until its response is done. */
  concurrency: ConcurrencyRule<R>;
  /**
   * Buckets charged in the same TB.ACQUIRE as the slot, all or nothing. On
   * a Cluster their keys must share the lease key's hash slot (a hash tag
   * in the identity); else limit them with the rate-limit helper instead.
   */
  rules?: readonly Rule<R>[];
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
export function checkConcurrencyOptions<R>(options: ConcurrencyLimitOptions<R>): void {
  const rule = options.concurrency;
  if (rule === null || typeof rule !== "object") throw new TypeError("concurrency: expected { concurrency, key }");
  if (typeof rule.concurrency !== "function") {
    checkNamed(rule.concurrency);
    if (rule.weight !== undefined && typeof rule.weight !== "function") rule.concurrency.checkWeight(rule.weight);
  } else if (rule.weight !== undefined && typeof rule.weight !== "function") {
    checkInt(rule.weight, "weight", 1);
  }
  if (options.rules !== undefined && options.rules.length > 0) checkRules(options.rules);
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
  const identity = await rule.key(request);
  if (identity === undefined) return undefined;
  const concurrency = typeof rule.concurrency === "function" ? rule.concurrency(request) : rule.concurrency;
  checkNamed(concurrency);
  const weight = typeof rule.weight === "function" ? rule.weight(request) : (rule.weight ?? 1);
  const buckets = await groupsOf(options.rules ?? [], request);
  const key = `${rule.prefix ?? "rl"}:${concurrency.name}:${identity}`;
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

/** A refusal: status, headers and a problem+json body (RFC 9457). */
export interface Refusal {
  status: 429 | 503;
  headers: Record<string, string>;
  body: Record<string, unknown>;
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
 * The client's address: the socket peer, unless the peer is a trusted proxy,
 * in which case X-Forwarded-For is walked from the right (each proxy
 * appends the address it received from) to the first untrusted hop.
 *
 * Anyone can send X-Forwarded-For, so believing it from any peer would let a
 * client pick its own bucket, a fresh one per request. Hops left of the
 * first untrusted one were written by the client and are ignored; a
 * malformed hop ends the walk at the proxy that passed it on. IPv6 clients
 * count per /64; IPv4-mapped addresses count as IPv4.
 */
export function clientIp(trustedProxies: readonly string[] = []): KeyFunction {
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
  return (request) => {
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
  };
}
