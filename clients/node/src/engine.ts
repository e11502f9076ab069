// Sends one operation on the backend in use, and finds that backend: on
// first use, and again when a reply says it is gone (a failover to a node
// without the module, FUNCTION FLUSH, a restart). The call itself is the
// probe: a refusal means nothing ran, so nothing is charged twice. While
// one call checks or loads the Functions library, the others answer
// through the EVAL script, so a burst of first calls loads it once. The
// rules are the Python package's and the OpenResty module's alike
// (clients/spec/backend.json).

import { LIBRARY_VERSION, WARNINGS } from "./contract.js";
import { NoBackendError } from "./errors.js";
import type { ReplicaWait } from "./replicas.js";
import {
  type Arg,
  EVAL_SCRIPT,
  evalArgs,
  fcallArgs,
  type Group,
  type LeaseHead,
  LOAD_ARGS,
  moduleArgs,
  type Op,
  readOnly,
  VERSION_ARGS,
} from "./scripts.js";

export type BackendName = "module" | "functions" | "eval";
export const BACKENDS: readonly BackendName[] = ["module", "functions", "eval"];

/**
 * How the engine reaches Redis: one command (routed by `key` on a
 * Cluster), or one to every primary. `mints` marks the command that makes
 * a decision able to admit (consume, mconsume, acquire): the replica wait
 * (replicas.ts) goes behind it.
 */
export interface IO {
  send(args: readonly Arg[], key: Group["key"] | undefined, readonly: boolean, mints?: boolean): Promise<unknown>;
  /** The call's replica wait, when the limiter has one and the call can admit. */
  readonly wait?: ReplicaWait;
  everyPrimary(args: readonly Arg[]): Promise<unknown[]>;
}

export interface Logger {
  error(message: string): void;
  warn(message: string): void;
  info?(message: string): void;
}

function text(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * The server (or a cluster client) says this command doesn't exist here,
 * or that this user may not run it.
 */
export function refused(error: unknown): boolean {
  const t = text(error).toLowerCase();
  return t.includes("unknown command") || t.includes("no permissions to run");
}

/** The Functions library is not loaded (never, or flushed since). */
function functionMissing(error: unknown): boolean {
  return /function not found/i.test(text(error));
}

function noScript(error: unknown): boolean {
  return text(error).startsWith("NOSCRIPT");
}

/** A backend can't serve this server: try the next one. */
class Unavailable extends Error {
  constructor(
    readonly backend: BackendName,
    override readonly cause: unknown,
  ) {
    super(`${backend}: ${text(cause)}`);
  }
}

export class Engine {
  backend: BackendName | undefined;
  /** Whether the server's library was found to be this package's since the backend was found. */
  private libraryChecked = false;
  /** Whether detect() has read the server's eviction settings (once: the Lua library can't warn of them). */
  memoryChecked = false;
  /** Whether a call is checking or loading the library right now. */
  private libraryChecking = false;

  constructor(
    readonly forced: BackendName | undefined,
    private readonly logger: Logger,
  ) {
    if (forced !== undefined && !BACKENDS.includes(forced)) {
      throw new RangeError(`backend must be one of ${BACKENDS.join(", ")} (or undefined to detect it)`);
    }
    this.backend = forced;
  }

  /**
   * Logs the module's warning where the server can evict the limiter's
   * keys (a maxmemory-policy other than noeviction, with a maxmemory), as
   * the module does at load; an ACL or a managed service that refuses
   * CONFIG leaves it unsaid.
   */
  async checkMemory(io: IO): Promise<void> {
    this.memoryChecked = true;
    let policy: string;
    let maxmemory: number;
    try {
      policy = configValue(await io.send(["CONFIG", "GET", "maxmemory-policy"], undefined, true));
      maxmemory = Number(configValue(await io.send(["CONFIG", "GET", "maxmemory"], undefined, true)) || 0);
    } catch {
      return; // NOPERM, a renamed command, a timeout: only a warning is lost
    }
    const warning = evictionWarning(policy, maxmemory);
    if (warning !== undefined) this.logger.warn(warning);
  }

  /**
   * Sends `op` on its groups (a lease operation: on its key and head, the
   * groups its buckets; TB.CHARGE: `wait` is its `WAIT max_ms`).
   */
  async call(op: Op, groups: readonly Group[], io: IO, lease?: LeaseHead, wait?: readonly string[]): Promise<unknown> {
    const backend = this.backend;
    if (backend !== undefined) {
      try {
        return await this.send(backend, op, groups, io, lease, wait);
      } catch (error) {
        if (!(error instanceof Unavailable)) throw error;
        if (this.forced !== undefined) throw new NoBackendError([[backend, error.cause]]);
        this.logger.warn(`rate limiter: the ${backend} backend is gone (${text(error.cause)}), detecting again`);
        this.backend = undefined;
        this.libraryChecked = false; // the node found next may hold another library
      }
    }
    return this.detect(op, groups, io, lease, wait);
  }

  private async detect(
    op: Op,
    groups: readonly Group[],
    io: IO,
    lease: LeaseHead | undefined,
    wait: readonly string[] | undefined,
  ): Promise<unknown> {
    const failures: [string, unknown][] = [];
    for (const name of BACKENDS) {
      let reply: unknown;
      try {
        reply = await this.send(name, op, groups, io, lease, wait);
      } catch (error) {
        if (!(error instanceof Unavailable)) throw error;
        failures.push([name, error.cause]);
        continue;
      }
      this.backend = name;
      this.logger.info?.(`rate limiter: using the ${name} backend`);
      return reply;
    }
    throw new NoBackendError(failures);
  }

  private async send(
    backend: BackendName,
    op: Op,
    groups: readonly Group[],
    io: IO,
    lease: LeaseHead | undefined,
    wait?: readonly string[],
  ): Promise<unknown> {
    const key = lease === undefined ? groups[0]?.key : lease.key;
    const readonly = readOnly(op);
    const mints = op === "consume" || op === "quota" || op === "mconsume" || op === "charge" || op === "acquire";
    if (backend === "module") {
      try {
        return await io.send(moduleArgs(op, groups, lease, wait), key, readonly, mints);
      } catch (error) {
        if (refused(error)) throw new Unavailable(backend, error);
        throw error;
      }
    }
    if (backend === "functions") return this.fcall(op, groups, lease, key, readonly, mints, io, wait);
    return this.eval(evalArgs(op, groups, lease, wait), key, mints, io);
  }

  private async fcall(
    op: Op,
    groups: readonly Group[],
    lease: LeaseHead | undefined,
    key: Group["key"] | undefined,
    readonly: boolean,
    mints: boolean,
    io: IO,
    wait?: readonly string[],
  ): Promise<unknown> {
    if (this.libraryChecking) {
      // Another call is checking or loading the library right now: a burst
      // of first calls (or of calls after FUNCTION FLUSH) must not each
      // load it, since every FUNCTION LOAD compiles it while Redis waits.
      // The EVAL script needs no loading and answers the same.
      return this.eval(evalArgs(op, groups, lease, wait), key, mints, io);
    }
    const args = fcallArgs(op, groups, lease, wait);
    if (!this.libraryChecked) await this.checking(() => this.checkLibrary(io));
    try {
      return await io.send(args, key, readonly, mints);
    } catch (error) {
      if (refused(error)) throw new Unavailable("functions", error);
      if (!functionMissing(error)) throw error;
    }
    // Flushed since (FUNCTION FLUSH, a restart without persistence).
    await this.checking(() => this.load(io));
    return io.send(args, key, readonly, mints);
  }

  /** Runs a check or load of the library, the other calls going through EVAL meanwhile. */
  private async checking(work: () => Promise<void>): Promise<void> {
    this.libraryChecking = true;
    try {
      await work();
    } finally {
      this.libraryChecking = false;
    }
  }

  /**
   * The library on the server (every primary) must be this package's copy:
   * `FCALL_RO tb_version 0` names it. A missing, older or foreign one is
   * replaced with this package's; where FUNCTION is refused, the EVAL
   * script (always this package's) serves instead.
   */
  private async checkLibrary(io: IO): Promise<void> {
    let versions: unknown[];
    try {
      versions = await io.everyPrimary(VERSION_ARGS);
    } catch (error) {
      if (refused(error)) throw new Unavailable("functions", error);
      if (!functionMissing(error)) throw error;
      versions = [];
    }
    const other = versions.find((v) => v !== LIBRARY_VERSION);
    if (versions.length > 0 && other === undefined) {
      this.libraryChecked = true;
      return;
    }
    if (other !== undefined) {
      this.logger.warn(
        `rate limiter: the server's Lua library is ${String(other)}, loading this package's ${LIBRARY_VERSION}`,
      );
    }
    await this.load(io);
  }

  private async load(io: IO): Promise<void> {
    try {
      // REPLACE: idempotent when gateways race, or some Cluster primaries have it already.
      await io.everyPrimary(LOAD_ARGS);
      this.libraryChecked = true;
    } catch (error) {
      // Refused (Redis 6.2, an ACL without FUNCTION, a managed service
      // that disables it): the EVAL script needs no loading.
      if (refused(error) || /^ERR /.test(text(error))) throw new Unavailable("functions", error);
      throw error;
    }
  }

  private async eval(tail: Arg[], key: Group["key"] | undefined, mints: boolean, io: IO): Promise<unknown> {
    try {
      return await io.send(["EVALSHA", EVAL_SCRIPT.sha, ...tail], key, false, mints);
    } catch (error) {
      if (refused(error)) throw new Unavailable("eval", error);
      if (!noScript(error)) throw error;
      // Not cached on this node (restart, failover, SCRIPT FLUSH)
    }
    try {
      // EVAL runs the script and caches it for the next EVALSHA.
      return await io.send(["EVAL", EVAL_SCRIPT.source, ...tail], key, false, mints);
    } catch (error) {
      if (refused(error)) throw new Unavailable("eval", error);
      throw error;
    }
  }
}

/** CONFIG GET's one value, whatever shape the client gives it: [name, value], {name: value}, or a node's of several. */
function configValue(reply: unknown): string {
  let r: unknown = reply;
  if (Array.isArray(r) && r.length > 0 && Array.isArray(r[0])) r = r[0]; // one node's answer
  if (r !== null && typeof r === "object" && !Array.isArray(r)) r = Object.entries(r)[0] ?? [];
  if (!Array.isArray(r) || r.length < 2) return "";
  const value = r[1];
  return Buffer.isBuffer(value) ? value.toString() : String(value);
}

/** The module's warning (core/src/eviction.rs, contract.json's "warnings"), or undefined where keys can't be evicted. */
export function evictionWarning(policy: string, maxmemory: number): string | undefined {
  if (maxmemory === 0 || policy === "" || policy.toLowerCase() === "noeviction") return undefined;
  const what = policy.toLowerCase().startsWith("volatile-") ? WARNINGS.eviction_volatile : WARNINGS.eviction_allkeys;
  return WARNINGS.eviction
    .replace("{policy}", policy)
    .replace("{maxmemory}", String(maxmemory))
    .replace("{what}", what);
}
