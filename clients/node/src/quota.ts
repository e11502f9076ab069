// Calendar quotas (TB.QUOTA): a budget per day, week, month, year or fixed
// number of seconds, checked when built with the module's rules and error
// texts, as Bucket is. The Python package's twin is _quota.py.

import { brand } from "./brand.js";
import { type Amount, type Bucket, chargesNothing, checkName, encode, number, refusal } from "./bucket.js";
import { MAX_CAPACITY, MAX_OFFSET_MINUTES, MAX_PERIOD_SECONDS } from "./contract.js";

/** A calendar period (any case), or a whole number of seconds from 1 to 1e10. */
export type Period = "day" | "week" | "month" | "year" | "DAY" | "WEEK" | "MONTH" | "YEAR" | string | number;

export interface QuotaOptions {
  /** The budget per period, `0 < limit <= 1e12`. */
  limit: Amount;
  /** "day", "week" (ISO, from Monday), "month", "year" (any case), or whole seconds 1..1e10. */
  period: Period;
  /** The calendar's distance from UTC in minutes, -1439..1439 (default 0). */
  offset?: number;
  /** The policy's name in the RateLimit headers (default: the period, "day" or "3600s"). */
  name?: string;
}

const WORDS = ["DAY", "WEEK", "MONTH", "YEAR"] as const;
const DAY_MS = 86_400_000;

function checkPeriod(period: unknown): string {
  if (typeof period === "string") {
    const word = period.toUpperCase();
    if ((WORDS as readonly string[]).includes(word)) return word;
    if (/^[0-9]+$/.test(period)) return checkPeriod(Number(period));
  } else if (typeof period === "number" && Number.isInteger(period) && period >= 1 && period <= MAX_PERIOD_SECONDS) {
    return String(period);
  }
  throw refusal("period", "bad_period");
}

function checkOffset(offset: unknown): number {
  if (typeof offset !== "number" || !Number.isInteger(offset)) {
    throw refusal("offset", "not_an_integer", { arg: "offset" });
  }
  if (offset < -MAX_OFFSET_MINUTES || offset > MAX_OFFSET_MINUTES) {
    throw refusal("offset", "int_out_of_range", {
      arg: "offset",
      least: -MAX_OFFSET_MINUTES,
      most: MAX_OFFSET_MINUTES,
    });
  }
  return offset === 0 ? 0 : offset; // -0 is 0
}

/**
 * `limit` per period: a budget that comes back whole at the start of each
 * day, week, month or year (at UTC + `offset` minutes), or of each fixed
 * period of seconds. Checked when built, with the module's rules and
 * messages; immutable. `max` is the limit, so code that reads a rule's
 * capacity (the headers' `q`, `tightest`) reads a Quota as a Bucket.
 */
export class Quota {
  static {
    brand(Quota);
  }
  readonly limit: number;
  /** The same as `limit`: a rule's capacity. */
  readonly max: number;
  /** As sent: DAY, WEEK, MONTH, YEAR, or the seconds' digits. */
  readonly period: string;
  readonly offset: number;
  readonly name: string | undefined;
  /** limit and period as sent, encoded once. */
  readonly args: readonly [string, string];
  /** What follows the amount: ` OFFSET m` when the offset is not 0. */
  readonly tail: readonly string[];

  constructor(options: QuotaOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError("Quota takes { limit, period, offset?, name? }");
    }
    const limit = number(options.limit, "limit");
    if (!(limit > 0 && limit <= MAX_CAPACITY)) throw refusal("limit", "limit_out_of_range");
    this.limit = limit;
    this.max = limit;
    this.period = checkPeriod(options.period);
    this.offset = options.offset === undefined ? 0 : checkOffset(options.offset);
    this.name = options.name === undefined ? undefined : checkName(options.name);
    this.args = [encode(limit), this.period];
    this.tail = this.offset === 0 ? [] : ["OFFSET", String(this.offset)];
    Object.freeze(this);
  }

  /** The policy's name when none is given: "day", "week", "month", "year", or "<n>s". */
  get periodName(): string {
    return /^[0-9]+$/.test(this.period) ? `${this.period}s` : this.period.toLowerCase();
  }

  /**
   * The length in seconds of the period that ends `resetAfterMs` from
   * `now` (ms since the epoch): DAY 86400, WEEK 604800, fixed its seconds,
   * MONTH and YEAR the days of the month or year of the day before that
   * end, at UTC + offset (the client's clock need only be within a day).
   */
  windowSeconds(resetAfterMs: number, now: number = Date.now()): number {
    if (this.period === "DAY") return 86_400;
    if (this.period === "WEEK") return 604_800;
    if (this.period !== "MONTH" && this.period !== "YEAR") return Number(this.period);
    const last = new Date(now + resetAfterMs + this.offset * 60_000 - DAY_MS);
    const y = last.getUTCFullYear();
    if (this.period === "YEAR") return (Date.UTC(y + 1, 0, 1) - Date.UTC(y, 0, 1)) / 1000;
    const m = last.getUTCMonth();
    return (Date.UTC(y, m + 1, 1) - Date.UTC(y, m, 1)) / 1000;
  }

  /** The same quota under another policy name. */
  named(name: string): Quota {
    return new Quota({ limit: this.limit, period: this.period, offset: this.offset, name });
  }

  /** Same rule (the name doesn't change what passes); never a Bucket. */
  sameLimits(other: unknown): boolean {
    return (
      other instanceof Quota &&
      this.limit === other.limit &&
      this.period === other.period &&
      this.offset === other.offset
    );
  }
}

/** A quota's cost, checked as the module checks it. */
export function checkQuotaCost(cost: unknown, quota: Quota, group?: number): number {
  const value = number(cost, "cost", group);
  const g: Record<string, number> = group === undefined ? {} : { group };
  if (value < 0) throw refusal("cost", "cost_negative", g);
  if (value > quota.limit) throw refusal("cost", "cost_above_limit", g);
  if (chargesNothing(value, quota.limit)) throw refusal("cost", "quota_cost_too_small", g);
  return value;
}

/** What a limit is given as: a token bucket or a calendar quota. */
export type Rule = Bucket | Quota;
