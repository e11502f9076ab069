// The package as npm installs it: ESM and CommonJS entry points with their
// types, the Lua copies equal to what the repository generates, the
// version is the project's, and the client sends the packaged script.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import * as esm from "redis-tokenbucket";
import { Bucket, EVAL_SCRIPT, EVAL_SOURCE, LIBRARY_SOURCE, LIBRARY_VERSION, Limiter } from "redis-tokenbucket";
import { rateLimitResponse } from "redis-tokenbucket/fetch";
import { client } from "./clients.mjs";
import { REPO, stopAll, target } from "./servers.mjs";

after(stopAll);

const require = createRequire(import.meta.url);
const root = dirname(require.resolve("redis-tokenbucket/package.json"));

test("installed from the packed tarball, not the source tree", () => {
  assert.ok(root.includes("node_modules"), root);
  assert.ok(!existsSync(join(root, "src")), "no sources in the package");
});

test("CommonJS and ESM both load, with type declarations for each", async () => {
  const cjs = require("redis-tokenbucket");
  const esm = await import("redis-tokenbucket");
  assert.equal(typeof cjs.Limiter, "function");
  for (const name of ["Concurrency", "Lease", "Busy"]) {
    assert.deepEqual([typeof cjs[name], typeof esm[name]], ["function", "function"], name);
  }
  assert.equal(typeof require("redis-tokenbucket/express").concurrencyLimit, "function");
  assert.equal(typeof (await import("redis-tokenbucket/fastify")).concurrencyHook, "function");
  assert.equal(cjs.LIBRARY_VERSION, esm.LIBRARY_VERSION);
  for (const sub of ["express", "fastify", "fetch"]) {
    assert.equal(typeof require(`redis-tokenbucket/${sub}`), "object");
    assert.equal(typeof (await import(`redis-tokenbucket/${sub}`)), "object");
  }
  for (const dir of ["esm", "cjs"]) {
    for (const name of ["index", "express", "fastify", "fetch"]) {
      assert.ok(existsSync(join(root, "dist", dir, `${name}.d.ts`)), `${dir}/${name}.d.ts`);
    }
  }
  assert.equal(JSON.parse(readFileSync(join(root, "dist", "cjs", "package.json"), "utf8")).type, "commonjs");
});

test("the version is the project's, from Cargo.toml, and the library's is the contract's", () => {
  const cargo = readFileSync(join(REPO, "Cargo.toml"), "utf8").split("[package]")[1];
  const version = /version\s*=\s*"([^"]+)"/.exec(cargo)[1];
  assert.equal(require("redis-tokenbucket/package.json").version, version);
  assert.ok(LIBRARY_VERSION.startsWith(`${version}+`));
  assert.match(LIBRARY_SOURCE, new RegExp(`LIBRARY_VERSION = '${LIBRARY_VERSION.replace(/[+.]/g, "\\$&")}'`));
});

test("the packaged library is the repository's, byte for byte", () => {
  const repo = readFileSync(join(REPO, "lua", "tb.lua"), "utf8");
  assert.equal(readFileSync(join(root, "lua", "tb.lua"), "utf8"), repo);
  assert.equal(LIBRARY_SOURCE, repo);
});

test("the packaged EVAL script is what lua/gen_eval.py writes", () => {
  const file = join(root, "lua", "tb-eval.lua");
  execFileSync("python3", [join(REPO, "lua", "gen_eval.py"), "--check", file]);
  assert.equal(EVAL_SOURCE, readFileSync(file, "utf8"));
  // The check itself can fail: a changed copy is refused.
  const changed = join(mkdtempSync(join(tmpdir(), "tb-eval-")), "tb-eval.lua");
  writeFileSync(changed, `${EVAL_SOURCE}-- changed\n`);
  assert.throws(() =>
    execFileSync("python3", [join(REPO, "lua", "gen_eval.py"), "--check", changed], { stdio: "ignore" }),
  );
});

test("the client sends the packaged EVAL script", async () => {
  const t = await target("redis-6.2");
  const c = await client("ioredis", t.port);
  try {
    assert.equal(EVAL_SCRIPT.sha, createHash("sha1").update(EVAL_SOURCE).digest("hex"));
    await new Limiter(c.client).consume("k", new Bucket({ max: 2, rate: 1 }));
    assert.deepEqual(await c.client.call("SCRIPT", "EXISTS", EVAL_SCRIPT.sha), [1]);
  } finally {
    c.close();
  }
});

test("the package metadata: peers optional, no dependencies", () => {
  const meta = require("redis-tokenbucket/package.json");
  assert.equal(meta.dependencies, undefined);
  // Every peer is optional: ioredis or node-redis, wasmoon for onError "local", the types of Express and Fastify.
  assert.deepEqual(Object.keys(meta.peerDependencies).sort(), [
    "@types/express",
    "fastify",
    "ioredis",
    "redis",
    "wasmoon",
  ]);
  for (const peer of Object.keys(meta.peerDependencies)) assert.equal(meta.peerDependenciesMeta[peer].optional, true);
  assert.equal(meta.engines.node, ">=18");
});

test("the Lua sources are typed as string in lua.d.ts, not as literal types of their whole text", () => {
  for (const dir of ["esm", "cjs"]) {
    const dts = readFileSync(join(root, "dist", dir, "lua.d.ts"), "utf8");
    assert.ok(dts.length < 1000, `dist/${dir}/lua.d.ts is ${dts.length} bytes`);
    assert.match(dts, /LIBRARY_SOURCE: string;/);
    assert.match(dts, /EVAL_SOURCE: string;/);
  }
});

test("the ESM and CommonJS builds take each other's objects", async () => {
  const cjs = require("redis-tokenbucket");
  const streams = new cjs.Concurrency({ limit: 1, leaseMs: 1000, name: "streams" });
  const lease = new cjs.Lease({
    ...{ acquired: false, inUse: 1, retryAfterMs: 2500, expiresInMs: 0, id: "l", key: "rl:streams:a" },
    ...{ concurrency: streams, weight: 1, decisions: [], held: "none" },
  });
  const refused = rateLimitResponse(lease);
  assert.equal(refused.status, 429);
  assert.equal(refused.headers.get("retry-after"), "3");
  assert.equal(refused.headers.get("ratelimit-policy"), '"streams";q=1;qu="concurrent-requests"');
  const user = new cjs.Bucket({ max: 5, rate: 1, name: "user" });
  const multi = new cjs.MultiDecision(true, 0, [new cjs.Decision(true, 4, 0, 1000, "k", user, 1)]);
  assert.equal(esm.rateLimitHeaders(multi).RateLimit, '"user";r=4;t=1');
  // instanceof holds across the builds too.
  assert.ok(lease instanceof esm.Lease && streams instanceof esm.Concurrency && user instanceof esm.Bucket);
  assert.ok(multi instanceof esm.MultiDecision && multi.decisions[0] instanceof esm.Decision);
  assert.ok(new cjs.Busy(lease) instanceof esm.Busy && new cjs.Shed("x") instanceof esm.LimiterError);
  assert.ok(
    !(new cjs.Shed("x") instanceof esm.Busy) && !(user instanceof esm.Concurrency) && !({} instanceof esm.Bucket),
  );
  // A limiter of one build with the buckets and leases of the other.
  const t = await target("redis-7.0+module");
  const c = await client("ioredis", t.port);
  try {
    const d = await new Limiter(c.client).consume("rl:user:x", user);
    assert.equal(d.remaining, 4);
    const lim = new cjs.Limiter(c.client);
    const held = await new Limiter(c.client).acquire("rl:streams:x", new esm.Concurrency({ limit: 1, leaseMs: 5000 }));
    assert.equal(await lim.release(held), true);
  } finally {
    c.close();
  }
});

test('onError "local" without wasmoon is refused when the limiter is built, naming what to install', () => {
  // The package alone, where no wasmoon can be found.
  const dir = mkdtempSync(join(tmpdir(), "tb-no-wasmoon-"));
  cpSync(root, join(dir, "node_modules", "redis-tokenbucket"), { recursive: true });
  const body = `
const fake = { call() { throw new Error("nothing may be sent"); }, status: "ready" };
(async () => {
  const out = [];
  try { new Limiter(fake, { onError: "local" }); out.push("built"); } catch (e) { out.push(e.message); }
  const lim = new Limiter(fake, { onError: "closed" });
  try { await lim.consume("k", new Bucket({ max: 1, rate: 1 }), 1, { onError: "local" }); out.push("sent"); } catch (e) { out.push(e.message); }
  console.log(JSON.stringify(out));
})();`;
  writeFileSync(join(dir, "esm.mjs"), `import { Bucket, Limiter } from "redis-tokenbucket";${body}`);
  writeFileSync(join(dir, "cjs.cjs"), `const { Bucket, Limiter } = require("redis-tokenbucket");${body}`);
  const message = 'onError "local" needs wasmoon, an optional peer dependency: npm install wasmoon';
  for (const file of ["esm.mjs", "cjs.cjs"]) {
    const out = execFileSync(process.execPath, [file], { cwd: dir, encoding: "utf8" });
    assert.deepEqual(JSON.parse(out), [message, message], file);
  }
  // Where wasmoon is installed (here), it is accepted.
  assert.equal(new Limiter({ call() {}, status: "ready" }, { onError: "local" }).onError, "local");
});
