// The package's objects are recognised by a brand, not by class identity.
// The ESM and CommonJS builds each define their own classes, and one app
// can load both (an ESM app beside a CommonJS dependency using this
// package), so a Lease made by one build must be a Lease to the other.
// Each class puts its name on its prototype under a registered symbol (the
// same in both builds), and its Symbol.hasInstance asks for that brand, so
// `instanceof` (the package's own checks, and users') holds across builds.

const BRAND = Symbol.for("redis-tokenbucket.class");

/** Whether `value` is an instance of the package's class `name` (or of a subclass), from either build. */
export function isA(value: unknown, name: string): boolean {
  if (value === null || (typeof value !== "object" && typeof value !== "function")) return false;
  for (let p: object | null = Object.getPrototypeOf(value); p !== null; p = Object.getPrototypeOf(p)) {
    if (Object.hasOwn(p, BRAND) && (p as Record<symbol, unknown>)[BRAND] === name) return true;
  }
  return false;
}

/**
 * Brands a class with its name: `static { brand(Lease); }` in its body. A
 * subclass that is not branded itself (a user's) keeps the ordinary
 * `instanceof`.
 */
export function brand(cls: abstract new (...args: never[]) => unknown): void {
  const name = cls.name;
  Object.defineProperty(cls.prototype, BRAND, { value: name });
  Object.defineProperty(cls, Symbol.hasInstance, {
    value(this: abstract new (...args: never[]) => unknown, value: unknown): boolean {
      if (!Object.hasOwn(this.prototype, BRAND)) return Function.prototype[Symbol.hasInstance].call(this, value);
      return isA(value, (this.prototype as Record<symbol, string>)[BRAND] as string);
    },
  });
}
