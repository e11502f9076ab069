// Backend detection on every server of the matrix and with every client
// library, forced backends, the library version, and detection again when
// the backend goes away.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Bucket, LIBRARY_SOURCE, LIBRARY_VERSION, Limiter, NoBackendError } from "redis-tokenbucket";
import { client, LIBRARIES } from "./clients.mjs";
import { calls, MODULE, Server, SLOW, stopAll, TARGETS, target } from "./servers.mjs";

after(stopAll);

const B = new Bucket({ max: 10, rate: SLOW });

for (const name of Object.keys(TARGETS)) {
  for (const lib of LIBRARIES) {
    test(`${name} through ${lib}: the first call finds the backend`, async () => {
      const t = await target(name);
      const c = await client(lib, t.port, t.auth);
      try {
        const lim = new Limiter(c.client);
        assert.equal(lim.backend, undefined);
        const d = await lim.consume("rl:user:42", B);
        assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs, d.resetAfterMs], [true, 9, 0, 1000 / SLOW]);
        assert.equal(lim.backend, t.backend);
        const admin = t.server.admin();
        if (t.backend === "functions") {
          assert.equal(await admin.call("FCALL_RO", "tb_version", "0"), LIBRARY_VERSION);
        }
        // A bucket is the same hash whoever wrote it.
        assert.deepEqual(Object.keys(await admin.hgetall("rl:user:42")).sort(), ["tokens", "ts"]);
        admin.disconnect();
        const m = await lim.consumeMany([
          ["rl:a", B, 2],
          [Buffer.from("rl:\xffbin", "latin1"), B, 3],
        ]);
        assert.deepEqual(
          m.decisions.map((x) => x.remaining),
          [8, 7],
        );
        assert.deepEqual((await lim.peek("rl:a", B, 9)).allowed, false);
        assert.deepEqual((await lim.adjust("rl:a", B, -20)).remaining, -10);
      } finally {
        c.close();
      }
    });
  }
}

test("detect() probes read-only", async () => {
  for (const name of Object.keys(TARGETS)) {
    const t = await target(name);
    const c = await client("ioredis", t.port, t.auth);
    const lim = new Limiter(c.client);
    assert.equal(await lim.detect(), t.backend);
    assert.equal(await c.client.dbsize(), 0);
    c.close();
  }
});

test("a forced backend serves where the server has it, else NoBackendError", async () => {
  const order = ["module", "functions", "eval"];
  for (const name of ["redis-7.0+module", "redis-7.0", "redis-6.2"]) {
    for (const forced of order) {
      const t = await target(name);
      const c = await client("ioredis", t.port, t.auth);
      const lim = new Limiter(c.client, { backend: forced });
      if (order.indexOf(forced) >= order.indexOf(t.backend)) {
        assert.equal((await lim.consume("k", B)).remaining, 9);
      } else {
        await assert.rejects(lim.consume("k", B), NoBackendError);
        // A usage error, whatever the policy.
        await assert.rejects(
          new Limiter(c.client, { backend: forced, onError: "open" }).consume("k", B),
          NoBackendError,
        );
      }
      c.close();
    }
  }
  assert.throws(() => new Limiter({ call() {}, status: "ready" }, { backend: "lua" }), /backend must be one of/);
});

test("a stale or foreign library is replaced with the package's own", async () => {
  const t = await target("redis-7.0");
  const admin = t.server.admin();
  const stale = LIBRARY_SOURCE.replace(LIBRARY_VERSION, "0.0.1+stale");
  await admin.call("FUNCTION", "LOAD", stale);
  assert.equal(await admin.call("FCALL_RO", "tb_version", "0"), "0.0.1+stale");
  const c = await client("ioredis", t.port);
  const warnings = [];
  const lim = new Limiter(c.client, { logger: { error() {}, warn: (m) => warnings.push(m) } });
  assert.equal((await lim.consume("k", B)).remaining, 9);
  assert.equal(await admin.call("FCALL_RO", "tb_version", "0"), LIBRARY_VERSION);
  assert.match(warnings.join("\n"), /0\.0\.1\+stale/);
  // Checked once per detection, not per call.
  await admin.call("CONFIG", "RESETSTAT");
  await lim.consume("k", B);
  assert.equal(await calls(t.server, "fcall_ro"), 0);
  assert.equal(await calls(t.server, "fcall"), 1);
  // The same version is left alone.
  const again = new Limiter(c.client);
  await again.consume("k", B);
  assert.equal(await calls(t.server, "function|load"), 0);
  admin.disconnect();
  c.close();
});

test("a user who can't load the library uses the EVAL script, even where a stale one is loaded", async () => {
  const t = await target("redis-7.0-acl");
  const admin = t.server.admin();
  await admin.call("FUNCTION", "LOAD", LIBRARY_SOURCE.replace(LIBRARY_VERSION, "0.0.1+stale"));
  const c = await client("ioredis", t.port, t.auth);
  const lim = new Limiter(c.client, { logger: { error() {}, warn() {} } });
  assert.equal((await lim.consume("k", B)).remaining, 9);
  assert.equal(lim.backend, "eval");
  // The library's own version is loaded where it is allowed.
  await admin.call("FUNCTION", "LOAD", "REPLACE", LIBRARY_SOURCE);
  const fresh = new Limiter(c.client);
  assert.equal((await fresh.consume("k", B)).remaining, 8);
  assert.equal(fresh.backend, "functions");
  admin.disconnect();
  c.close();
});

test("the library flushed under the limiter is loaded again, the script cache too", async () => {
  for (const [name, command] of [
    ["redis-7.0", ["FUNCTION", "FLUSH"]],
    ["redis-6.2", ["SCRIPT", "FLUSH"]],
  ]) {
    const t = await target(name);
    const c = await client("redis6", t.port);
    const lim = new Limiter(c.client);
    assert.equal((await lim.consume("k", B)).remaining, 9);
    const admin = t.server.admin();
    await admin.call(...command);
    assert.equal((await lim.consume("k", B)).remaining, 8);
    assert.equal(lim.backend, t.backend);
    admin.disconnect();
    c.close();
  }
});

test("the module unloaded under the limiter: detected again, same buckets", async () => {
  const server = await new Server("redis-7.0", { module: true, args: ["--enable-module-command", "yes"] }).start();
  const c = await client("ioredis", server.port);
  try {
    const warnings = [];
    const lim = new Limiter(c.client, { logger: { error() {}, warn: (m) => warnings.push(m) } });
    assert.equal((await lim.consume("k", B)).remaining, 9);
    assert.equal(lim.backend, "module");
    await c.client.call("MODULE", "UNLOAD", "tb");
    assert.equal((await lim.consume("k", B)).remaining, 8);
    assert.equal(lim.backend, "functions");
    assert.match(warnings.join("\n"), /the module backend is gone/);
    // Forced, it does not fall back.
    await c.client.call("MODULE", "LOAD", MODULE);
    const forced = new Limiter(c.client, { backend: "module" });
    assert.equal((await forced.consume("k", B)).remaining, 7);
    await c.client.call("MODULE", "UNLOAD", "tb");
    await assert.rejects(forced.consume("k", B), NoBackendError);
  } finally {
    c.close();
    server.stop();
  }
});

test("nothing serves a user without scripting: NoBackendError under every policy", async () => {
  const t = await target("redis-7.0");
  const admin = t.server.admin();
  await admin.call("ACL", "SETUSER", "plain", "on", ">pw", "~*", "+@all", "-@scripting");
  admin.disconnect();
  const c = await client("ioredis", t.port, { username: "plain", password: "pw" });
  for (const onError of ["raise", "open", "closed"]) {
    const lim = new Limiter(c.client, { onError });
    await assert.rejects(lim.consume("k", B), (e) => e instanceof NoBackendError && e.causes.length === 3);
  }
  c.close();
});
