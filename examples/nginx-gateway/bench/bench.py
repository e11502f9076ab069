"""`make bench-nginx`: wrk against GET /v1/models at the edge.

The same saturated users (50 API keys, each a bucket of max 20 refilled at
2/s, the FastAPI gateway bench's), limited six ways, each at 200 and 1,000
connections, on one nginx node and on two sharing one Redis:

  module            this module in three lines of nginx.conf: one rule,
                    the user's bucket keyed by X-API-Key, its denial cache
                    on (10,000 entries, as the gateway example's)
  module, no cache  the same without the denial cache: a Redis call per request
  gateway           the nginx gateway example (run.sh): user, key and IP
                    buckets in one TB.MCONSUME, the key hashed, tiers
  pasted script     the recipe users copy: a token-bucket Lua script
                    (bench/pasted.lua) called with EVALSHA through
                    lua-nginx-redis in access_by_lua, one key per user
  limit_req         nginx's own leaky bucket (rate=2r/s burst=19 nodelay),
                    in each node's shared memory
  nginx alone       no limit

Redis 7.0 with the module on loopback; 2 worker processes per node; one
wrk per node (2 threads for one node, 1 each for two), the connections
split between them, every wrk cycling all 50 keys with the repository's
bench/gateway_load.lua (which drives the FastAPI gateway as well). The exact budget is users x
(max + rate x seconds) over wrk's measured duration. Writes its section of
docs/benchmarks.md (--report).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent
ROOT = EXAMPLE.parents[1]
sys.path.append(str(ROOT / "clients" / "openresty" / "test" / "nginx"))
sys.path.append(str(ROOT / "clients" / "python" / "tests"))
sys.path.append(str(ROOT / "bench"))
from doc_section import write_section  # noqa: E402
from gateway_load import USER_MAX, USER_RATE, USERS, budget, gateway_env, wrk  # noqa: E402
from nginxkit import Gateway, Nginx  # noqa: E402
from tbservers import Server  # noqa: E402

MODELS = '\'{"data":[{"id":"stub-echo"}]}\''


@dataclass
class Run:
    variant: str
    nodes: int
    connections: int
    seconds: float
    requests: int
    p50_ms: float
    p99_ms: float
    admitted: int
    denied: int
    degraded: int
    shed: int
    other: int
    socket_errors: int

    @property
    def budget(self) -> float:
        return budget(self.seconds)

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds


def pasted(redis_port: int) -> Nginx:
    """The recipe users paste: bench/pasted.lua with EVALSHA through
    lua-nginx-redis, loaded by each worker on its first call."""
    script = (HERE / "pasted.lua").read_text()
    init = f"""
        SCRIPT = [==[{script}]==]
        SHA = nil
        REDIS_PORT = {redis_port}
    """
    access = """
            access_by_lua_block {
                local redis = require "nginx.redis"
                local red = redis:new()
                red:set_timeout(100)
                local ok, err = red:connect("127.0.0.1", REDIS_PORT)
                if not ok then return ngx.exit(500) end
                local key = "rl:pasted:" .. (ngx.var.http_x_api_key or ngx.var.remote_addr)
                local res
                if SHA then res, err = red:evalsha(SHA, 1, key, @RATE@, @MAX@, ngx.now(), 1) end
                if not res then
                    res, err = red:eval(SCRIPT, 1, key, @RATE@, @MAX@, ngx.now(), 1)
                    SHA = SHA or red:script("load", SCRIPT)
                end
                red:set_keepalive(10000, 100)
                if not res then return ngx.exit(500) end
                if res[1] == 0 then return ngx.exit(429) end
            }
    """
    access = access.replace("@RATE@", f"{USER_RATE:g}").replace("@MAX@", str(USER_MAX))
    return Nginx(init, models_location(access))


def module(redis_url: str, denial_cache: bool) -> Nginx:
    """The three lines of nginx.conf, and one rule."""
    config = (
        f'{{ redis = "{redis_url}", shared_dict = "tokenbucket", on_error = "closed", '
        f"denial_cache = {10000 if denial_cache else 'false'}, "
        f'rules = {{ {{ name = "user", max = {USER_MAX}, rate = {USER_RATE}, key = "$http_x_api_key" }} }} }}'
    )
    init = f'limit = require("resty.tokenbucket").new({config})'
    return Nginx(init, models_location("access_by_lua_block { limit:access() }"))


def limit_req() -> Nginx:
    return Nginx(
        "",
        models_location(f"limit_req zone=users burst={USER_MAX - 1} nodelay;"),
        http=f"limit_req_zone $http_x_api_key zone=users:10m rate={USER_RATE:g}r/s; limit_req_status 429;",
    )


def alone() -> Nginx:
    return Nginx("", models_location(""))


def models_location(limit: str) -> str:
    return f"""
        location = /v1/models {{
            {limit}
            default_type application/json;
            content_by_lua_block {{ ngx.print({MODELS}) }}
        }}
    """


def run(variant: str, nodes: int, connections: int, seconds: int, make: Callable[[], Any]) -> Run:
    started = [make() for _ in range(nodes)]
    try:
        for s in started:
            s.start()
        time.sleep(0.3)
        results = wrk([s.port for s in started], connections, seconds)
    finally:
        for s in started:
            s.cleanup()
    total = {k: sum(r[k] for r in results) for k in results[0]}
    duration = max(r["duration_us"] for r in results) / 1e6
    # Percentiles: the slower node's (each wrk has its own histogram).
    p50 = max(r["p50_us"] for r in results) / 1000
    p99 = max(r["p99_us"] for r in results) / 1000
    # load.lua counts a 200 without RateLimit fields as "degraded": the
    # module's fail-open answer. The other variants send no fields: each
    # of their 200s is an admission.
    admitted, degraded = total["admitted"], total["degraded"]
    if variant in ("pasted script", "limit_req", "nginx alone"):
        admitted, degraded = admitted + degraded, 0
    return Run(variant, nodes, connections, duration, total["requests"], p50, p99, admitted, total["denied"],
               degraded, total["shed"] + total["closed"], total["other"], total["socket_errors"])  # fmt: skip


LIMITED = ("module", "module, no cache", "gateway")


def no_bypass(r: Run) -> bool:
    """At most one token per user over the exact budget, and nothing
    admitted unchecked (degraded): the FastAPI gateway bench's target."""
    return r.admitted <= r.budget + USERS and r.degraded == 0


def report(rows: list[Run], every: list[Run], seconds: int, rounds: int, nginx_version: str) -> str:
    lines = [
        "",
        f"`make bench-nginx`, {time.strftime('%Y-%m-%d')}: Debian's nginx {nginx_version} with "
        "lua-nginx-module 0.10.23 and lua-nginx-redis 0.27, 2 worker processes per node; Redis 7.0 with the "
        f"module on loopback; wrk, {rounds} interleaved rounds of {seconds} s per row (medians), {USERS} "
        f"saturated users (a bucket of max {USER_MAX}, rate {USER_RATE:g}/s each) on `GET /v1/models`. "
        "*module* is this module in three lines of nginx.conf with one rule keyed by X-API-Key and its denial "
        "cache on; *module, no cache* the same without it; *gateway* the nginx gateway example (user, key and "
        "IP buckets in one TB.MCONSUME, the key hashed); *pasted script* a token-bucket script as users paste "
        "it (examples/nginx-gateway/bench/pasted.lua) through lua-nginx-redis; *limit_req* nginx's own "
        "(rate=2r/s burst=19 nodelay). Two nodes are two nginx sharing the Redis, each driven by a wrk of its "
        "own with half the connections. The exact budget is users x (max + rate x seconds) over wrk's "
        "measured duration; p50/p99 are the slower node's. Under the budget is no bypass: answers in flight "
        "when wrk stops are not counted, and shed requests (503) were refused tokens their users still had. "
        "*other* counts 500s (the pasted script's when Redis does not answer within its 100 ms) and socket "
        "errors. 2 cores shared by wrk, every nginx worker and Redis (and other work): req/s are this "
        "machine's, to compare within the table.",
        "",
        "| limiter | nodes | connections | req/s | p50 ms | p99 ms | admitted | exact budget | admitted - budget "
        "| 503 | other | at most budget + 1 per user |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        verdict = "(no limit)" if r.variant == "nginx alone" else ("PASS" if no_bypass(r) else "MISS")
        lines.append(
            f"| {r.variant} | {r.nodes} | {r.connections:,} | {r.req_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.admitted:,} | {r.budget:,.0f} | {r.admitted - r.budget:+,.0f} | {r.shed:,} | "
            f"{r.other + r.socket_errors:,} | {verdict} |"
        )
    lines += ["", "| target | measured | |", "|---|---|---|"]
    ours = [r for r in every if r.variant in LIMITED]
    if ours:
        worst = max(ours, key=lambda r: r.admitted - r.budget)
        lines.append(
            f"| admitted within one token per user of the exact budget (at most budget + {USERS}, nothing "
            f"degraded), every run of module, module no cache and gateway | most over: "
            f"{worst.admitted - worst.budget:+,.0f} ({worst.variant}, {worst.nodes} node(s), {worst.connections:,} "
            f"connections); degraded {sum(r.degraded for r in ours)} | "
            f"{'PASS' if all(no_bypass(r) for r in ours) else 'MISS'} |"
        )
    for variant in LIMITED:
        ratios = []
        for r in rows:
            setup = (r.nodes, r.connections)
            base = [x for x in rows if x.variant == "pasted script" and (x.nodes, x.connections) == setup]
            if r.variant == variant and base:
                where = f"{r.nodes} node{'s' if r.nodes > 1 else ''}, {r.connections:,}"
                ratios.append((where, r.req_per_s / base[0].req_per_s))
        if ratios:
            target = "req/s >= 1.0x the pasted script, every row" if variant == "module" else "(for comparison)"
            least = min(x for _, x in ratios)
            verdict = ("PASS" if least >= 1.0 else "MISS") if variant == "module" else ""
            shown = "; ".join(f"{where}: {x:.2f}x" for where, x in ratios)
            lines.append(f"| {variant}: {target} | {least:.2f}x at least ({shown}) | {verdict} |")
    lines.append("")
    return "\n".join(lines)


def median_run(runs: list[Run]) -> Run:
    """One row from a variant's rounds: the median of each figure (the
    admitted and budget of the round whose excess is the median)."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    by_excess = sorted(runs, key=lambda r: r.admitted - r.budget)
    mid = by_excess[len(by_excess) // 2]
    total_time = sum(r.seconds for r in runs)
    return Run(
        runs[0].variant, runs[0].nodes, runs[0].connections, mid.seconds,
        int(med([r.req_per_s for r in runs]) * mid.seconds), med([r.p50_ms for r in runs]),
        med([r.p99_ms for r in runs]), mid.admitted, mid.denied, sum(r.degraded for r in runs),
        int(sum(r.shed for r in runs) * mid.seconds / total_time), mid.other, mid.socket_errors,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path, help="docs/benchmarks.md: replace or append the section")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", default="200,1000")
    parser.add_argument("--variants", default="module,module, no cache,gateway,pasted script,limit_req,nginx alone")
    args = parser.parse_args()
    variants = [v.strip() for v in re.split(r",(?! no cache)", args.variants)]
    rows: list[Run] = []
    every: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server("redis-7.0", Path(tmp) / "redis", module=True).start()
        try:
            makers: dict[str, Callable[[], Any]] = {
                "module": lambda: module(server.url, True),
                "module, no cache": lambda: module(server.url, False),
                "gateway": lambda: Gateway(gateway_env(server.url, denial_cache="10000", log_level="warn")),
                "pasted script": lambda: pasted(server.port),
                "limit_req": limit_req,
                "nginx alone": alone,
            }
            for nodes in (1, 2):
                for c in (int(x) for x in args.connections.split(",")):
                    runs: dict[str, list[Run]] = {v: [] for v in variants}
                    for k in range(args.rounds):
                        # Interleaved, and each round in another order.
                        for variant in variants[k % len(variants) :] + variants[: k % len(variants)]:
                            server.client().flushall()
                            r = run(variant, nodes, c, args.seconds, makers[variant])
                            print(
                                f"{variant:17} nodes={nodes} c={c:5} {r.req_per_s:9,.0f} req/s p99 {r.p99_ms:6.1f} ms "
                                f"admitted {r.admitted:6,} budget {r.budget:8,.0f} 503 {r.shed} "
                                f"degraded {r.degraded} other {r.other} errors {r.socket_errors}",
                                flush=True,
                            )
                            runs[variant].append(r)
                            every.append(r)
                    rows += [median_run(runs[v]) for v in variants]
        finally:
            server.stop()
    version = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1]
    text = report(rows, every, args.seconds, args.rounds, version)
    print(text)
    if args.report:
        write_section(args.report, "bench-nginx", text, "The edge: nginx and OpenResty")


if __name__ == "__main__":
    main()
