// The example as its README tells a newcomer to run it: a fresh `git
// clone` of this checkout (its commits, plus the uncommitted changes to
// tracked files that are being tested), then the README's commands as
// written: `cd`, `npm install` (the package comes from ../../clients/node,
// unbuilt in a clone), `node server.mjs`, and the `curl`. Only the Redis
// URL and the port are this test's: a server on a free port.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { freePort, REPO, stopAll, target } from "../../servers.mjs";

after(stopAll);

/** The README's shell block that installs and starts the gateway, one command a line. */
function steps() {
  const readme = readFileSync(join(REPO, "examples/express-gateway/README.md"), "utf8");
  const block = [...readme.matchAll(/^```sh\n([\s\S]*?)^```$/gm)]
    .map((m) => m[1])
    .find((b) => b.includes("npm install"));
  assert.ok(block, "the README has a sh block with npm install");
  return block
    .split("\n")
    .map((line) => line.replace(/\s+#.*$/, "").trim())
    .filter(Boolean);
}

function sh(command, cwd, env = process.env) {
  return execFileSync("sh", ["-c", command], { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

test("from a clean clone, the README's steps install and start the gateway", { timeout: 600_000 }, async () => {
  const t = await target("redis-7.0+module");
  const port = await freePort();
  const root = mkdtempSync(join(tmpdir(), "tb-clone-"));
  let server;
  try {
    execFileSync("git", ["clone", "--quiet", REPO, root]);
    const diff = execFileSync("git", ["-C", REPO, "diff", "HEAD", "--binary"]);
    if (diff.length > 0) execFileSync("git", ["-C", root, "apply", "--binary", "-"], { input: diff });
    let cwd = root;
    let answered = false;
    for (const line of steps()) {
      const cd = /^cd (\S+)$/.exec(line);
      if (cd) {
        cwd = join(cwd, cd[1]);
      } else if (line.includes("node server.mjs")) {
        const command = line.replace("127.0.0.1:6379", `127.0.0.1:${t.port}`);
        server = spawn("sh", ["-c", `exec env ${command}`], { cwd, env: { ...process.env, PORT: String(port) } });
        let log = "";
        await new Promise((resolve, reject) => {
          server.stdout.on("data", (chunk) => {
            log += chunk;
            if (log.includes("gateway on")) resolve();
          });
          server.stderr.on("data", (chunk) => {
            log += chunk;
          });
          server.once("exit", (code) => reject(new Error(`node server.mjs exited (${code}):\n${log}`)));
        });
      } else if (line.startsWith("curl ")) {
        const out = sh(line.replace("localhost:8000", `127.0.0.1:${port}`), cwd);
        assert.match(out, /^HTTP\/1\.1 200 /);
        assert.match(out, /^ratelimit-policy: "user";q=10;w=59, "key";q=10;w=59, "ip";q=600;w=20\r?$/im);
        assert.match(out, /"stub-echo"/);
        answered = true;
      } else {
        sh(line, cwd);
      }
    }
    assert.ok(answered, "the README's steps end with a request to the gateway");
  } finally {
    server?.kill();
    rmSync(root, { recursive: true, force: true });
  }
});
