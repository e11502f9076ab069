// The package as npm installs it: ESM and CommonJS entry points with their
// types, the Lua copies equal to what the repository generates, the
// version is the project's, and the client sends the packaged script.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { Bucket, EVAL_SCRIPT, EVAL_SOURCE, LIBRARY_SOURCE, LIBRARY_VERSION, Limiter } from "redis-tokenbucket";
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
  for (const peer of ["ioredis", "redis", "wasmoon"]) assert.equal(meta.peerDependenciesMeta[peer].optional, true);
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

