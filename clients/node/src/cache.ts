// The local denial cache.
//
// A denial says "this request can't pass for the next R ms" (retryAfterMs
// is the earliest millisecond at which it would). Until then the same
// request, or a costlier one, on the same buckets is denied again, so this
// process can answer it from memory: a client hammering a hot key in a
// retry loop costs Redis one call per retry window instead of one per
// attempt.

import { brand } from "./brand.js";
import type { Bucket } from "./bucket.js";
import type { Decision } from "./decision.js";

interface Entry {
  at: number; // clock() when the request was sent
  until: number; // clock() at which it may pass
  ids: readonly string[];
  buckets: readonly Bucket[];
  costs: readonly number[];
  decisions: readonly Decision[];
}

export interface CachedDenial {
  retryAfterMs: number;
  decisions: Decision[];
}

/**
 * Requests known to be denied until some time, at most `maxEntries` of them
 * (least recently used go first).
 *
 * It never denies what Redis would admit, only later than Redis could: the
 * deadline is counted from when the request was sent, not answered. Any
 * write this limiter makes to a key (a charge, a refund, a debt) drops the
 * entries that involve it; a refund from another process is not seen, so
 * such a request is denied at most until its original retry time.
 * `clock` must be monotonic (ms); tests pass a fake one.
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

  constructor(maxEntries = 10_000, clock: () => number = () => performance.now()) {
    if (!(Number.isInteger(maxEntries) && maxEntries >= 1)) throw new RangeError("maxEntries must be an integer >= 1");
    this.maxEntries = maxEntries;
    this.clock = clock;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The cached denial for this request, aged to now; undefined to ask Redis. */
  lookup(ids: readonly string[], buckets: readonly Bucket[], costs: readonly number[]): CachedDenial | undefined {
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
    const same = buckets.every((b, i) => b.sameLimits(entry.buckets[i] as Bucket));
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

  /** Records a denial answered for a request sent at `sentAt` (clock()). */
  remember(sentAt: number, retryAfterMs: number, ids: readonly string[], decisions: readonly Decision[]): void {
    if (retryAfterMs <= 0) return;
    const name = entryName(ids);
    this.drop(name);
    this.entries.set(name, {
      at: sentAt,
      until: sentAt + retryAfterMs,
      ids,
      buckets: decisions.map((d) => d.bucket),
      costs: decisions.map((d) => d.cost),
      decisions,
    });
    for (const id of ids) {
      const owners = this.byKey.get(id);
      if (owners === undefined) this.byKey.set(id, new Set([name]));
      else owners.add(name);
    }
    while (this.entries.size > this.maxEntries) this.drop(this.entries.keys().next().value as string);
  }

  /** Drops every entry that involves the key `id` (keys.ts keyId). */
  forget(id: string): void {
    const owners = this.byKey.get(id);
    if (owners === undefined) return;
    for (const name of [...owners]) this.drop(name);
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

function entryName(ids: readonly string[]): string {
  return JSON.stringify(ids);
}

function aged(d: Decision, elapsedMs: number): Decision {
  const retry = d.retryAfterMs ? Math.max(0, Math.ceil(d.retryAfterMs - elapsedMs)) : 0;
  const reset = Math.max(retry, Math.ceil(d.resetAfterMs - elapsedMs));
  return d.with({ allowed: d.allowed || retry === 0, retryAfterMs: retry, resetAfterMs: reset, cached: true });
}
