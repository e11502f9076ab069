// The Express gateway over HTTP, on Redis 7.0 with the module and without it
// (the Lua library): tiers, one call per request, 429 and the headers,
// reserve and settle, fail open and closed, readiness. Run by
// scripts/test-node.sh beside the package's tests (their server kit).

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { calls, Server, stopAll, target } from "../../servers.mjs";
import { LLMError } from "../llm.mjs";
import { gateway } from "./kit.mjs";

after(stopAll);

for (const name of ["redis-7.0+module", "redis-7.0"]) {
  test(`${name}: capacity + 1 gives one 429 with the headers, one Redis call per request`, async () => {
    const t = await target(name);
    const g = await gateway(t.port);
    try {
      const statuses = [];
      for (let i = 0; i < 4; i++) statuses.push((await g.call("GET", "/v1/models", { key: "demo-free" })).status);
      assert.deepEqual(statuses, [200, 200, 200, 429]);
      const denied = await g.call("GET", "/v1/models", { key: "demo-free" });
      assert.equal(denied.status, 429);
      assert.deepEqual(denied.body, { error: "rate_limited", dimension: "user", retry_after: 1000 });
      assert.equal(denied.headers["retry-after"], "1000");
      assert.equal(denied.headers["ratelimit-policy"], '"user";q=3;w=3000, "key";q=5;w=5000, "ip";q=8;w=8000');
      assert.equal(denied.headers.ratelimit, '"user";r=0;t=1000, "key";r=2;t=3000, "ip";r=5;t=3000');
      assert.equal(denied.headers["x-ratelimit-limit"], "3");
      assert.equal(denied.headers["x-ratelimit-remaining"], "0");
      const command = name.endsWith("module") ? "tb.mconsume" : "fcall";
      assert.equal(await calls(t.server, command), 5);
      // No raw API key in Redis: keys hold its hash.
      const keys = await g.redis.keys("*");
      assert.ok(keys.every((k) => !k.includes("demo-free")));
    } finally {
      g.close();
    }
  });

  test(`${name}: an IP denial charges neither the user nor the key; 401 after the IP paid`, async () => {
    const t = await target(name);
    const g = await gateway(t.port);
    try {
      for (let i = 0; i < 6; i++)
        assert.equal((await g.call("GET", "/v1/models", { key: "demo-standard" })).status, 200);
      assert.equal((await g.call("GET", "/v1/models", { key: "nope" })).status, 401);
      assert.equal((await g.call("GET", "/v1/models", { key: "nope" })).status, 401);
      const denied = await g.call("GET", "/v1/models", { key: "demo-free" });
      assert.equal(denied.status, 429);
      assert.equal(denied.body.dimension, "ip");
      assert.equal(await g.redis.exists("rl:user:alice"), 0, "the user bucket was not charged");
    } finally {
      g.close();
    }
  });

  test(`${name}: chat reserves and settles the LLM budget; a failed model refunds it all`, async () => {
    const t = await target(name);
    let fail = false;
    const llm = {
      async complete(prompt, maxTokens) {
        if (fail) throw new LLMError("down");
        const words = prompt.split(" ").reverse().slice(0, maxTokens);
        return { text: words.join(" "), promptTokens: 3, completionTokens: words.length };
      },
    };
    const g = await gateway(t.port, { llm });
    try {
      const ok = await g.call("POST", "/v1/chat", {
        key: "demo-standard",
        body: { prompt: "hello big model", max_tokens: 50 },
      });
      assert.equal(ok.status, 200);
      assert.deepEqual(ok.body.usage, { prompt_tokens: 3, completion_tokens: 3, reserved_tokens: 53 });
      // Reserved 53, used 6: the header shows the budget after the refund.
      assert.match(ok.headers.ratelimit, /"llm";r=994;t=\d+$/);
      fail = true;
      const failed = await g.call("POST", "/v1/chat", {
        key: "demo-standard",
        body: { prompt: "a b", max_tokens: 100 },
      });
      assert.equal(failed.status, 502);
      assert.equal(Math.floor(Number(await g.redis.hget("rl:llm:user:bob", "tokens"))), 994);
      const over = await g.call("POST", "/v1/chat", { key: "demo-free", body: { prompt: "a", max_tokens: 100 } });
      assert.deepEqual([over.status, over.body.error], [413, "over_budget"]);
    } finally {
      g.close();
    }
  });

  test(`${name}: /readyz names the backend and the breaker`, async () => {
    const t = await target(name);
    const g = await gateway(t.port);
    try {
      const r = await g.call("GET", "/readyz");
      assert.deepEqual(r.body, {
        ready: true,
        backend: name.endsWith("module") ? "module" : "functions",
        breaker: "closed",
      });
      assert.deepEqual((await g.call("GET", "/healthz")).body, { ok: true });
    } finally {
      g.close();
    }
  });
}

test("Redis down: models fails open without headers, chat fails closed with 503, readyz is 503", async () => {
  const server = await new Server("redis-7.0", { module: true }).start();
  const g = await gateway(server.port);
  try {
    assert.equal((await g.call("GET", "/v1/models", { key: "demo-free" })).status, 200);
    await server.stopAndWait();
    const open = await g.call("GET", "/v1/models", { key: "demo-free" });
    assert.equal(open.status, 200);
    assert.equal(open.headers.ratelimit, undefined);
    const closed = await g.call("POST", "/v1/chat", { key: "demo-free", body: { prompt: "x", max_tokens: 1 } });
    assert.deepEqual(
      [closed.status, closed.body, closed.headers["retry-after"]],
      [503, { error: "rate_limiter_unavailable" }, "1"],
    );
    const ready = await g.call("GET", "/readyz");
    assert.equal(ready.status, 503);
    assert.equal(ready.body.ready, false);
  } finally {
    g.close();
    server.stop();
  }
});
