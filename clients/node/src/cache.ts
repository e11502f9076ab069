// The local denial cache.
//
// A denial says "this request can't pass for the next R ms" (retryAfterMs
// is the earliest millisecond at which it would). Until then the same
// request, or a costlier one, on the same buckets is denied again, so this
// process can answer it from memory: a client hammering a hot key in a
// retry loop costs Redis one call per retry window instead of one per
// attempt. The rule is the Python package's (_cache.py) and the OpenResty
// module's (cache.lua); clients/spec/cache.json holds its timelines.

import { brand } from "./brand.js";
import type { Decision } from "./decision.js";
import type { Rule } from "./quota.js";

interface Entry {
  at: number; // clock() when the request was sent
  until: number; // clock() at which it may pass
  ids: readonly string[];
  buckets: readonly Rule[];
  costs: readonly number[];
  decisions: readonly Decision[];
}

export interface CachedDenial {
  retryAfterMs: number;
  decisions: Decision[];
}

/**
 * What a request does, as far as the cache cares: `each` is a consumeMany
 * charged bucket by bucket (refunded on a denial), `reset` deletes the key,
 * `acquire` charges its buckets with a lease (its denial is never kept: a
 * release can free a slot at any time).
 */
export type CacheOp = "consume" | "peek" | "adjust" | "mconsume" | "each" | "reset" | "acquire";

/**
 * A request on its way to Redis: its keys, when it was sent, and whether a
 * write to one of its keys finished while it was in flight (its answer may
 * then predate that write, and is not remembered). Closed by `answered` or
 * `failed`, once.
 */
export class Ticket {
  stale = false;
  closed = false;
  constructor(
    readonly op: CacheOp,
    readonly ids: readonly string[],
    readonly sentAt: number,
  ) {}
}

const NEVER_KEPT = new Set<CacheOp>(["adjust", "reset", "acquire"]);

/**
 * Requests known to be denied until some time, at most `maxEntries` of them
 * (least recently used go first).
 *
 * It never denies what Redis would admit, only later than Redis could: the
 * deadline is counted from when the request was sent, not answered. Any
 * write this limiter makes to a key (a charge, a refund, a reset) drops the
 * entries that involve it, and a denial whose request was in flight while
 * such a write finished is not remembered (Redis may have answered it
 * before the write: replies need not come in order, as a Cluster's
 * replica reads don't). A request that got no answer forgets its keys
 * (whatever could have written may have). A refund from another process is
 * not seen, so such a request is denied at most until its original retry
 * time. Keys are key identities (keys.ts keyId). `clock` must be monotonic
 * (ms); tests pass a fake one.
 */
export class DenialCache {
  static {
    brand(DenialCache);
  }
  readonly maxEntries: number;
  readonly clock: () => number;
  hits = 0;
  misses = 0;
  private readonly entries = new Map<string, Entry>();
  private readonly byKey = new Map<string, Set<string>>();
  private readonly pending = new Map<string, Set<Ticket>>();

  constructor(maxEntries = 10_000, clock: () => number = () => performance.now()) {
    if (!(Number.isInteger(maxEntries) && maxEntries >= 1)) throw new RangeError("maxEntries must be an integer >= 1");
    this.maxEntries = maxEntries;
    this.clock = clock;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The cached denial for this request, aged to now; undefined to ask Redis. */
  lookup(ids: readonly string[], buckets: readonly Rule[], costs: readonly number[]): CachedDenial | undefined {
    const name = entryName(ids);
    const entry = this.entries.get(name);
    if (entry === undefined) {
      this.misses++;
      return undefined;
    }
    const now = this.clock();
    if (now >= entry.until) {
      this.drop(name);
      this.misses++;
      return undefined;
    }
    // Another bucket size or a cheaper request may pass: ask Redis.
    const same = buckets.every((b, i) => b.sameLimits(entry.buckets[i] as Rule));
    if (!same || costs.some((c, i) => c < (entry.costs[i] as number))) {
      this.misses++;
      return undefined;
    }
    this.entries.delete(name); // to the end: most recently used
    this.entries.set(name, entry);
    this.hits++;
    const elapsed = now - entry.at;
    return {
      retryAfterMs: Math.max(1, Math.ceil(entry.until - now)),
      decisions: entry.decisions.map((d) => aged(d, elapsed)),
    };
  }

  // ---- a request's way: sent, then answered or failed ---------------------------

  /** Call just before the request goes to Redis: the clock is read now. */
  sent(op: CacheOp, ids: readonly string[]): Ticket {
    const ticket = new Ticket(op, ids, this.clock());
    for (const id of ids) {
      const waiting = this.pending.get(id);
      if (waiting === undefined) this.pending.set(id, new Set([ticket]));
      else waiting.add(ticket);
    }
    return ticket;
  }

  /**
   * Redis's answer: forgets the keys it wrote, and remembers it if it is a
   * denial that no write overtook.
   */
  answered(ticket: Ticket, allowed: boolean, retryAfterMs: number, decisions: readonly Decision[]): void {
    if (!this.close(ticket)) return;
    for (const id of written(ticket, allowed, decisions)) this.forget(id);
    if (allowed || ticket.stale || retryAfterMs <= 0 || NEVER_KEPT.has(ticket.op)) return;
    this.remember(ticket, retryAfterMs, decisions);
  }

  /**
   * No answer (a timeout, a connection lost, a reply of the wrong shape):
   * whatever could have written may have, so its keys are forgotten (a
   * peek writes nothing).
   */
  failed(ticket: Ticket): void {
    if (!this.close(ticket)) return;
    if (ticket.op !== "peek") for (const id of ticket.ids) this.forget(id);
  }

  /** Drops every entry that involves the key `id` (keys.ts keyId); requests in flight on it are not remembered. */
  forget(id: string): void {
    const owners = this.byKey.get(id);
    if (owners !== undefined) for (const name of [...owners]) this.drop(name);
    const waiting = this.pending.get(id);
    if (waiting !== undefined) for (const ticket of waiting) ticket.stale = true;
  }

  // ---- inside ----------------------------------------------------------------------

  private close(ticket: Ticket): boolean {
    if (ticket.closed) return false;
    ticket.closed = true;
    for (const id of ticket.ids) {
      const waiting = this.pending.get(id);
      if (waiting === undefined) continue;
      waiting.delete(ticket);
      if (waiting.size === 0) this.pending.delete(id);
    }
    return true;
  }

  private remember(ticket: Ticket, retryAfterMs: number, decisions: readonly Decision[]): void {
    const name = entryName(ticket.ids);
    this.drop(name);
    this.entries.set(name, {
      at: ticket.sentAt,
      until: ticket.sentAt + retryAfterMs,
      ids: ticket.ids,
      buckets: decisions.map((d) => d.bucket),
      costs: decisions.map((d) => d.cost),
      decisions,
    });
    for (const id of ticket.ids) {
      const owners = this.byKey.get(id);
      if (owners === undefined) this.byKey.set(id, new Set([name]));
      else owners.add(name);
    }
    while (this.entries.size > this.maxEntries) this.drop(this.entries.keys().next().value as string);
  }

  private drop(name: string): void {
    const entry = this.entries.get(name);
    if (entry === undefined) return;
    this.entries.delete(name);
    for (const id of entry.ids) {
      const owners = this.byKey.get(id);
      if (owners === undefined) continue;
      owners.delete(name);
      if (owners.size === 0) this.byKey.delete(id);
    }
  }
}

/** The keys an answered request wrote. */
function written(ticket: Ticket, allowed: boolean, decisions: readonly Decision[]): readonly string[] {
  const { op, ids } = ticket;
  if (op === "adjust" || op === "reset") return ids;
  if (op === "peek") return [];
  // consume, mconsume, each, acquire: every bucket paid its cost.
  if (allowed) return ids.filter((_, i) => (decisions[i]?.cost ?? 0) > 0);
  if (op !== "each") return [];
  // Denied bucket by bucket: those before the denying one were charged, then refunded.
  const out: string[] = [];
  for (const [i, id] of ids.entries()) {
    const d = decisions[i];
    if (d === undefined || !d.allowed) break;
    if (d.cost > 0) out.push(id);
  }
  return out;
}

function entryName(ids: readonly string[]): string {
  return JSON.stringify(ids);
}

function aged(d: Decision, elapsedMs: number): Decision {
  const retry = d.retryAfterMs ? Math.max(0, Math.ceil(d.retryAfterMs - elapsedMs)) : 0;
  const reset = Math.max(retry, Math.ceil(d.resetAfterMs - elapsedMs));
  return d.with({ allowed: d.allowed || retry === 0, retryAfterMs: retry, resetAfterMs: reset, cached: true });
}
