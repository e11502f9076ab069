// POST /v1/chat with "stream": true, over HTTP, on Redis 7.0 with the
// module and without it (the Lua library): server-sent events from the stub
// model, one `streams` slot per stream taken in the same call as the
// request buckets and the LLM reservation, renewed while it streams,
// released after the last byte or at once when the client goes away; the
// reservation settled with what was generated.

import assert from "node:assert/strict";
import { request } from "node:http";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Limiter } from "redis-tokenbucket";
import { Cluster, stopAll, target } from "../../servers.mjs";
import { limits } from "../config.mjs";
import { LLMError, StubLLM } from "../llm.mjs";
import { gateway, SLOW, TINY } from "./kit.mjs";

after(stopAll);

const LIMITS = { ...TINY, stream_lease_ms: 60_000 };
const STREAMS_KEY = "rl:streams:alice";
const LLM_KEY = "rl:llm:user:alice";
const PROMPT = "a b c d"; // 4 prompt tokens; the stub answers d c b a

/** The data of each server-sent event, JSON-decoded (but [DONE]). */
function events(text) {
  const out = [];
  for (const block of text.split("\n\n")) {
    for (const line of block.split("\n")) {
      if (!line.startsWith("data: ")) continue;
      const data = line.slice("data: ".length);
      out.push(data === "[DONE]" ? data : JSON.parse(data));
    }
  }
  return out;
}

const chat = (g, max_tokens = 10, key = "demo-free") =>
  g.call("POST", "/v1/chat", { key, body: { prompt: PROMPT, max_tokens, stream: true } });

async function until(check, ms, what) {
  const deadline = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`${what}: not within ${ms} ms`);
    await sleep(10);
  }
}

async function balance(g) {
  const tokens = await g.redis.hget(LLM_KEY, "tokens");
  return tokens === null ? 100 : Math.floor(Number(tokens));
}

for (const name of ["redis-7.0+module", "redis-7.0"]) {
  test(`${name}: a streamed chat sends its tokens, settles its reservation and gives its slot back`, async () => {
    const t = await target(name);
    const g = await gateway(t.port, { limits: LIMITS });
    try {
      const res = await chat(g);
      assert.equal(res.status, 200);
      assert.match(res.headers["content-type"], /^text\/event-stream/);
      assert.deepEqual(events(res.body), [
        { token: "d" },
        { token: "c" },
        { token: "b" },
        { token: "a" },
        { usage: { prompt_tokens: 4, completion_tokens: 4, reserved_tokens: 14 } },
        "[DONE]",
      ]);
      // Reserved 4 + 10, used 4 + 4: the rest came back after the stream.
      await until(async () => (await balance(g)) === 100 - 8, 2000, "settled");
      await until(async () => (await g.redis.exists(STREAMS_KEY)) === 0, 2000, "the slot given back");
      // The headers name the policy as the draft does, the slot first.
      assert.match(res.headers["ratelimit-policy"], /^"streams";q=2;qu="concurrent-requests", "user";q=3;w=3000, /);
      assert.match(res.headers.ratelimit, /^"streams";r=1, "user";r=2;t=1000, /);
    } finally {
      g.close();
    }
  });

  test(`${name}: full streams are a 429 that charges nothing; a budget that can't pay takes no slot`, async () => {
    const t = await target(name);
    const g = await gateway(t.port, { limits: LIMITS });
    try {
      const held = new Limiter(g.redis);
      const streams = limits(LIMITS).forTier("free").streams;
      for (let i = 0; i < streams.limit; i++) assert.ok((await held.acquire(STREAMS_KEY, streams)).acquired);
      const res = await chat(g);
      assert.equal(res.status, 429);
      assert.deepEqual(res.body, { error: "rate_limited", dimension: "streams", retry_after: 60 });
      assert.equal(res.headers["retry-after"], "60");
      assert.match(res.headers.ratelimit, /^"streams";r=0;t=60, "user";r=3;t=0, /);
      // All or nothing: no request token, no LLM token spent.
      assert.equal(await g.redis.exists("rl:user:alice"), 0);
      assert.equal(await balance(g), 100);
      // A non-streamed chat takes no slot.
      const plain = await g.call("POST", "/v1/chat", { key: "demo-free", body: { prompt: PROMPT, max_tokens: 10 } });
      assert.equal(plain.status, 200);
      await g.redis.del(STREAMS_KEY);
      assert.equal((await chat(g, 80)).status, 200); // 84 reserved, 8 used
      await until(async () => (await balance(g)) === 100 - 8 - 8, 2000, "settled");
      const poor = await chat(g, 85); // 89 > 84
      assert.deepEqual([poor.status, poor.body.dimension], [429, "llm"]);
      assert.equal(await g.redis.exists(STREAMS_KEY), 0);
    } finally {
      g.close();
    }
  });
}

class FailingLLM extends StubLLM {
  constructor(after) {
    super();
    this.after = after;
  }

  async *stream(prompt, maxTokens) {
    let sent = 0;
    for await (const token of super.stream(prompt, maxTokens)) {
      if (sent === this.after) throw new LLMError("model backend exploded");
      sent++;
      yield token;
    }
  }
}

test("a model failing mid-stream: nothing generated gives the whole reservation back, some gives back the rest", async () => {
  for (const [failAfter, left] of [
    [0, 100],
    [2, 100 - 4 - 2],
  ]) {
    const t = await target("redis-7.0+module");
    const g = await gateway(t.port, { limits: LIMITS, llm: new FailingLLM(failAfter) });
    try {
      const warn = console.warn;
      console.warn = () => {};
      const res = await chat(g).finally(() => {
        console.warn = warn;
      });
      assert.equal(res.status, 200);
      const got = events(res.body);
      assert.deepEqual([got.length, got.at(-1)], [failAfter + 1, { error: "upstream_failed" }]);
      await until(async () => (await balance(g)) === left, 2000, "settled");
      await until(async () => (await g.redis.exists(STREAMS_KEY)) === 0, 2000, "the slot given back");
    } finally {
      g.close();
    }
  }
});

test("an unauthenticated stream is refused, after its IP paid, and takes no slot", async () => {
  const t = await target("redis-7.0+module");
  const g = await gateway(t.port, { limits: LIMITS });
  try {
    const res = await g.call("POST", "/v1/chat", { body: { prompt: "hi", max_tokens: 1, stream: true } });
    assert.equal(res.status, 401);
    assert.deepEqual(await g.redis.keys("rl:streams:*"), []);
    assert.equal(await g.redis.exists("rl:ip:127.0.0.1"), 1);
    const bad = await g.call("POST", "/v1/chat", {
      key: "demo-free",
      body: { prompt: "hi", max_tokens: 1, stream: 1 },
    });
    assert.equal(bad.status, 422);
    // A body that is no JSON at all is the same 422, not a 500.
    const broken = await g.call("POST", "/v1/chat", { key: "demo-free", raw: '{"prompt": "hi", ' });
    assert.deepEqual([broken.status, broken.body], [422, { error: "invalid_request" }]);
  } finally {
    g.close();
  }
});

// ---- held over a real connection ------------------------------------------------------

const BIG = {
  ...LIMITS,
  tiers: { ...LIMITS.tiers, free: { ...LIMITS.tiers.free, llm: { max: 100_000, rate: SLOW } } },
};
const LONG_PROMPT = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ");

/** A streamed chat over its own connection, its headers and first event read; `close()` hangs up. */
function stream(base) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt: LONG_PROMPT, max_tokens: 40, stream: true });
    const req = request(`${base}/v1/chat`, {
      method: "POST",
      agent: false, // a connection of its own
      headers: { "x-api-key": "demo-free", "content-type": "application/json" },
    });
    req.on("error", () => {});
    req.on("response", (res) => {
      let text = "";
      const done = new Promise((end) => res.on("end", () => end(text)));
      res.setEncoding("utf8");
      res.once("data", (chunk) => {
        text += chunk;
        res.on("data", (more) => {
          text += more;
        });
        resolve({ status: res.statusCode, first: chunk, rest: () => done, close: () => req.destroy() });
      });
      res.on("error", () => {});
    });
    req.on("error", reject);
    req.end(body);
  });
}

for (const name of ["redis-7.0+module", "redis-7.0"]) {
  test(`${name}: over HTTP, a client gone mid-stream frees its slot at once and is settled`, async () => {
    const t = await target(name);
    const g = await gateway(t.port, { limits: BIG, settings: { stubTokenDelayMs: 200 } });
    try {
      const a = await stream(g.base);
      const b = await stream(g.base);
      assert.deepEqual([a.status, b.status], [200, 200]);
      assert.match(a.first, /^data: \{"token"/);
      assert.equal(await g.redis.hlen(STREAMS_KEY), 2);
      const refused = await g.call("POST", "/v1/chat", {
        key: "demo-free",
        body: { prompt: LONG_PROMPT, max_tokens: 40, stream: true },
      });
      assert.deepEqual([refused.status, refused.body.dimension], [429, "streams"]);
      a.close(); // the client goes away mid-stream; its lease would live 60 s
      await until(async () => (await g.redis.hlen(STREAMS_KEY)) === 1, 2000, "the slot freed");
      const c = await stream(g.base);
      assert.equal(await g.redis.hlen(STREAMS_KEY), 2);
      b.close();
      c.close();
      await until(async () => (await g.redis.exists(STREAMS_KEY)) === 0, 2000, "every slot freed");
      // Each stream reserved 40 + 40 and was cut short: settled with its 40
      // prompt tokens and the 1 to 39 it generated, the rest refunded.
      await until(
        async () => {
          const left = Number(await g.redis.hget(LLM_KEY, "tokens"));
          return left >= 100_000 - 3 * 79 && left <= 100_000 - 3 * 41 + 1;
        },
        2000,
        "the three streams settled",
      );
    } finally {
      g.close();
    }
  });
}

test("over HTTP, a stream longer than its lease keeps its slot by renewing it, and gives it back at the end", async () => {
  const t = await target("redis-7.0+module");
  const g = await gateway(t.port, { limits: { ...BIG, stream_lease_ms: 300 }, settings: { stubTokenDelayMs: 50 } });
  try {
    const s = await stream(g.base);
    const expiry = async () => Number((await g.redis.hvals(STREAMS_KEY))[0].split(":")[0]);
    const first = await expiry();
    await sleep(1000); // more than three leases: only renewals keep it
    assert.equal(await g.redis.hlen(STREAMS_KEY), 1);
    assert.ok((await expiry()) > first + 500_000, "renewed");
    assert.equal(events(await s.rest()).at(-1), "[DONE]");
    await until(async () => (await g.redis.exists(STREAMS_KEY)) === 0, 2000, "the slot given back");
  } finally {
    g.close();
  }
});

test("cluster mode: the slot first, then the buckets one by one; the slot given back when they deny", async () => {
  const cluster = await new Cluster("redis-7.0", { module: true }).start();
  const g = await gateway(cluster.port, { limits: LIMITS, cluster: true });
  try {
    const res = await chat(g);
    assert.equal(res.status, 200);
    assert.equal(events(res.body).at(-1), "[DONE]");
    assert.match(res.headers["ratelimit-policy"], /^"streams";q=2;qu="concurrent-requests", "user";q=3;w=3000, /);
    assert.match(res.headers.ratelimit, /^"streams";r=1, "user";r=2;t=1000, /);
    await until(async () => (await g.redis.exists(STREAMS_KEY)) === 0, 2000, "the slot given back");
    await until(async () => (await balance(g)) === 100 - 8, 2000, "settled");
    const poor = await chat(g, 95); // 99 > 92
    assert.deepEqual([poor.status, poor.body.dimension], [429, "llm"]);
    assert.equal(await g.redis.exists(STREAMS_KEY), 0, "the slot given back after the buckets denied");
    assert.equal(await balance(g), 100 - 8);
  } finally {
    g.close();
    cluster.stop();
  }
});
