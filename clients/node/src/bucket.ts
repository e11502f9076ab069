// Buckets and argument checks, with the module's rules and error texts
// (contract.ts, generated from contract/contract.json), so a bad limit fails
// where it is written instead of as an error reply on a request path.

import { brand } from "./brand.js";
import {
  type ErrorName,
  LIMIT_ALIASES,
  LIMIT_ERROR,
  LIMIT_MULTIPLE_LEAST,
  LIMIT_MULTIPLE_MOST,
  LIMIT_PER,
  LIMIT_SEPARATORS,
  LIMIT_UNITS,
  MAX_CAPACITY,
  MAX_FILL_SECONDS,
  MAX_RATE,
  message,
} from "./contract.js";

/** A Redis key: a string, or a Buffer for binary keys. */
export type Key = string | Buffer;

/** A number as the module reads it: a finite number, or a decimal string. */
export type Amount = number | string;

/**
 * A limit, cost or delta the module would refuse. The message is the
 * module's error text without its `ERR ` prefix, and starts with the
 * argument's name; `field` holds that name.
 */
export class InvalidArgument extends RangeError {
  static {
    brand(InvalidArgument);
  }
  readonly field: string;
  constructor(field: string, text: string) {
    super(text);
    this.name = "InvalidArgument";
    this.field = field;
  }
}

/** An InvalidArgument with the contract's message `name`, without the reply's `ERR ` prefix. */
export function refusal(field: string, name: ErrorName, values: Record<string, string | number> = {}): InvalidArgument {
  return new InvalidArgument(field, message(name, values).replace(/^ERR /, ""));
}

function groupOf(group: number | undefined): Record<string, number> {
  return group === undefined ? {} : { group };
}

// [+-] (digits [. digits] | . digits) [(e|E) [+-] digits], ASCII digits only:
// the grammar the module and the Lua library accept.
const DECIMAL = /^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;

/**
 * A finite number; `InvalidArgument` for anything the module's grammar
 * refuses (NaN, infinities, hex or padded text, other types).
 */
export function number(value: unknown, name: string, group?: number): number {
  let result = Number.NaN;
  if (typeof value === "number") result = value;
  else if (typeof value === "string" && DECIMAL.test(value)) result = Number(value);
  if (Number.isFinite(result)) return result === 0 ? 0 : result; // -0 is 0
  throw refusal(name, "not_a_number", { arg: name, ...groupOf(group) });
}

/**
 * How a checked number is sent: JavaScript's shortest round-trip form
 * (`10`, `0.17`, `1e-7`, `1e+21`) always fits the grammar and parses back
 * to the same double.
 */
export function encode(value: number): string {
  return String(value);
}

const scratch = new Float64Array(1);
const bits = new BigInt64Array(scratch.buffer);

/** The largest double below `x`, for a positive finite `x`. */
function below(x: number): number {
  scratch[0] = x;
  bits[0] -= 1n;
  return scratch[0];
}

/**
 * A positive cost so small that taking it from a balance near `max` rounds
 * back to that balance: admitted forever, charging nothing. The top two
 * doubles up to `max` keep the most in rounding, so checking those two is
 * exact (the module's rule, core/src/args.rs).
 */
export function chargesNothing(cost: number, max: number): boolean {
  const under = below(max);
  return cost > 0 && (max - cost === max || under - cost === under);
}

export function checkCost(cost: unknown, bucket: Bucket, group?: number): number {
  const value = number(cost, "cost", group);
  const g = groupOf(group);
  if (value < 0) throw refusal("cost", "cost_negative", g);
  if (value > bucket.max) throw refusal("cost", "cost_above_max", g);
  if (chargesNothing(value, bucket.max)) throw refusal("cost", "cost_too_small", g);
  return value;
}

export function checkDelta(delta: unknown): number {
  return number(delta, "delta");
}

export function checkName(name: unknown): string {
  // Policy names are sf-strings in the RateLimit fields: printable ASCII.
  if (typeof name !== "string" || !/^[ -~]+$/.test(name)) {
    throw new InvalidArgument("name", "name must be a non-empty string of printable ASCII");
  }
  return name;
}

export interface BucketOptions {
  /** Capacity: the largest burst, `0 < max <= 1e12`. */
  max: Amount;
  /** Tokens refilled per second, `0 < rate <= 1e12`, `max / rate <= 1e10` s. */
  rate: Amount;
  /** The policy's name in the RateLimit headers (`"user";q=10;w=59`). */
  name?: string;
}

/**
 * `max` tokens of burst, refilled at `rate` tokens per second. Checked when
 * built, with the module's rules and messages; immutable.
 */
export class Bucket {
  static {
    brand(Bucket);
  }
  readonly max: number;
  readonly rate: number;
  readonly name: string | undefined;
  /** max and rate as sent, encoded once. */
  readonly args: readonly [string, string];

  constructor(options: BucketOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError("Bucket takes { max, rate, name? }");
    }
    const max = number(options.max, "max");
    if (!(max > 0 && max <= MAX_CAPACITY)) throw refusal("max", "max_out_of_range");
    const rate = number(options.rate, "rate");
    if (!(rate > 0 && rate <= MAX_RATE)) throw refusal("rate", "rate_out_of_range");
    if (max / rate > MAX_FILL_SECONDS) throw refusal("rate", "fill_too_slow");
    this.max = max;
    this.rate = rate;
    this.name = options.name === undefined ? undefined : checkName(options.name);
    this.args = [encode(max), encode(rate)];
    Object.freeze(this);
  }

  /** Seconds an empty bucket takes to fill. */
  get fillSeconds(): number {
    return this.max / this.rate;
  }

  /** The same limits under another policy name. */
  named(name: string): Bucket {
    return new Bucket({ max: this.max, rate: this.rate, name });
  }

  /** Same limits (the name doesn't change what passes); never a Quota. */
  sameLimits(other: unknown): boolean {
    return other instanceof Bucket && this.max === other.max && this.rate === other.rate;
  }

  /**
   * A limit string as the `limits` library (and slowapi) writes it,
   * `"N/unit"`, `"N/k units"`, `"N per unit"` or `"N per k units"`, as a
   * bucket of `max` N refilled at N per k units, as the Python package's
   * and the OpenResty module's `parse` (one grammar, contract.ts): units
   * second, minute, hour, day, month (30 days), year (360 days), singular
   * or plural, or s, sec, m, min, h, hr, d, mo, y; case ignored. A token
   * bucket, not a window (the N may go at once, then one comes back every
   * period/N); `"1000/day"` too, never a budget reset at midnight (that
   * is a Quota).
   */
  static parse(limit: string, name?: string): Bucket {
    const [count, seconds] = readLimit(limit);
    const n = number(count, "max");
    return new Bucket({ max: n, rate: n / seconds, ...(name === undefined ? {} : { name }) });
  }

  /**
   * Several limit strings joined by `;`, `,` or `|` (`"10/second;1000/day"`),
   * as `limits.parse_many` reads them: one bucket each, in order. Each
   * needs a key of its own (a key holds one bucket).
   */
  static parseMany(limits: string): Bucket[] {
    if (typeof limits !== "string") throw limitError(limits);
    let parts = [limits];
    for (const separator of LIMIT_SEPARATORS) parts = parts.flatMap((part) => part.split(separator));
    return parts.map((part) => Bucket.parse(part));
  }
}

// Limit strings (contract.ts's LIMIT_*). ASCII whitespace only, as Lua's %s
// and the Python parser read it: the three must agree on a string.
const SPACE = " \t\n\r\f\v";
const TRIM = /^[ \t\n\r\f\v]+|[ \t\n\r\f\v]+$/g;
// N: whatever stands before the per word or "/"; number() then checks it.
const COUNT = /^([^/ \t\n\r\f\v]+)[ \t\n\r\f\v]*([\s\S]*)$/;
// [k] unit, after the per word.
const UNIT = /^([0-9]*)[ \t\n\r\f\v]*([a-z]+)$/;

function limitError(limit: unknown): InvalidArgument {
  const text = typeof limit === "string" ? limit.replace(TRIM, "") : String(limit);
  return new InvalidArgument(
    "limit",
    LIMIT_ERROR.replace("{limit}", () => text),
  );
}

/**
 * A limit string's N (as written) and its k units in seconds, or the
 * grammar's error naming it; in the same steps as the Python and OpenResty
 * parsers, so all three read a string alike.
 */
function readLimit(limit: unknown): [string, number] {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: ASCII is the range
  if (typeof limit !== "string" || /[^\x00-\x7f]/.test(limit)) throw limitError(limit);
  const head = COUNT.exec(limit.replace(TRIM, ""));
  if (head === null) throw limitError(limit);
  const rest = (head[2] as string).toLowerCase();
  let tail: RegExpExecArray | null = null;
  const per = LIMIT_PER.find(
    // A word needs a space after it ("10 per minute", not "10 perminute");
    // one before it is there already, N ending at the first space.
    (p) => rest.startsWith(p) && (p === "/" || SPACE.includes(rest.charAt(p.length) || "x")),
  );
  if (per !== undefined) tail = UNIT.exec(rest.slice(per.length).replace(/^[ \t\n\r\f\v]+/, ""));
  const unit = tail === null ? undefined : LIMIT_ALIASES.get(tail[2] as string);
  if (tail === null || unit === undefined) throw limitError(limit);
  const multiple = tail[1] === "" ? 1 : Number(tail[1]);
  if (!(multiple >= LIMIT_MULTIPLE_LEAST && multiple <= LIMIT_MULTIPLE_MOST)) throw limitError(limit);
  return [head[1] as string, multiple * (LIMIT_UNITS.get(unit) as number)];
}
