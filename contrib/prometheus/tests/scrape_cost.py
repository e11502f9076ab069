"""What tb-collect.lua costs Redis per scrape, measured, not asserted
(`make bench-prometheus`).

Redis 7.0 with the module; two redis_exporters on it, one with the script
and one without; each scraped over HTTP as Prometheus would, in
alternating rounds (so a noisy neighbour skews both alike). After each
round Redis's own INFO commandstats says which commands the scrapes sent
and how long Redis spent in them; the median round is reported. For scale,
the same Redis's time per TB.CONSUME call, from the same counters.

Writes Markdown to stdout, and with --out FILE to FILE.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from promstack import EXPORTER_BIN, Exporter, Server

ROUNDS = 7
SCRAPES = 200  # per round and exporter
CONSUMES = 20_000
# A bucket that never empties: every call is an admitted, written charge.
BIG = 1e12


def command_stats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """calls and usec of every command since the last CONFIG RESETSTAT."""
    stats: dict[str, dict[str, int]] = client.info("commandstats")  # type: ignore[assignment]
    return {name.removeprefix("cmdstat_"): (int(s["calls"]), int(s["usec"])) for name, s in stats.items()}


def scrape_round(client: redis.Redis, exporter: Exporter) -> dict[str, tuple[int, int]]:
    client.config_resetstat()
    for _ in range(SCRAPES):
        exporter.scrape()
    stats = command_stats(client)
    # The reset is this script's (a command counts itself once it is done,
    # so the INFO that reads the stats is not in them).
    stats.pop("config|resetstat", None)
    return stats


def per_scrape_us(stats: dict[str, tuple[int, int]]) -> float:
    return sum(usec for _, usec in stats.values()) / SCRAPES


def consume_us(client: redis.Redis) -> float:
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for i in range(CONSUMES):
        pipe.execute_command("TB.CONSUME", f"rl:{i % 1000}", BIG, BIG)
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    calls, usec = command_stats(client)["tb.consume"]
    return usec / calls


def exporter_version() -> str:
    out = subprocess.run([EXPORTER_BIN, "-version"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    return text.split("Redis Metrics Exporter", 1)[1].split()[0] if "Redis Metrics Exporter" in text else "?"


def report() -> str:
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server("redis-7.0", Path(tmp) / "redis", module=True).start()
        plain = with_script = None
        try:
            plain = Exporter(Path(tmp) / "plain", server.port, script=None).start()
            with_script = Exporter(Path(tmp) / "script", server.port).start()
            with server.client() as client:
                version = client.info("server")["redis_version"]
                client.execute_command("TB.CONSUME", "rl:warm", BIG, BIG)
                rounds_plain, rounds_script = [], []
                for _ in range(ROUNDS):
                    rounds_plain.append(scrape_round(client, plain))
                    rounds_script.append(scrape_round(client, with_script))
                consume = statistics.median(consume_us(client) for _ in range(ROUNDS))
                cached = client.info("memory")["number_of_cached_scripts"]
        finally:
            for p in (with_script, plain, server):
                if p is not None:
                    p.stop()
    load_end = os.getloadavg()

    base = sorted(rounds_plain, key=per_scrape_us)[ROUNDS // 2]
    full = sorted(rounds_script, key=per_scrape_us)[ROUNDS // 2]
    evals = full["eval"][1] / full["eval"][0]
    base_us = per_scrape_us(base)
    commands = sorted(set(base) | set(full))

    def row(cmd: str) -> str:
        def cell(stats: dict[str, tuple[int, int]]) -> str:
            if cmd not in stats:
                return "- | -"
            calls, usec = stats[cmd]
            return f"{calls / SCRAPES:g} | {usec / calls:.1f}"

        # Subcommands are named command|sub: escaped, a table cell holds them.
        return f"| `{cmd.replace('|', chr(92) + '|')}` | {cell(base)} | {cell(full)} |"

    lines = [
        "# What tb-collect.lua costs per scrape",
        "",
        f"Written by `make bench-prometheus` ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}):",
        "measured, never asserted. Method: the docstring of `tests/scrape_cost.py`.",
        "",
        "| | |",
        "|---|---|",
        f"| server | Redis {version}, with the module |",
        f"| exporter | redis_exporter {exporter_version()} (Debian) |",
        f"| machine | {os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()} |",
        f"| load average at start / end | {' '.join(f'{x:.2f}' for x in load_start)} / "
        f"{' '.join(f'{x:.2f}' for x in load_end)} |",
        f"| rounds | {ROUNDS} per exporter, alternating, {SCRAPES} scrapes each; the median round |",
        "",
        "Time Redis spent in each command a scrape sent (INFO commandstats, µs per call):",
        "",
        "| command | calls per scrape, no script | µs per call | calls per scrape, tb-collect.lua | µs per call |",
        "|---|---|---|---|---|",
        *[row(cmd) for cmd in commands],
        f"| **all** | | **{base_us:.1f} µs per scrape** | | |",
        "",
        f"- The script is the `eval` row: **{evals:.1f} µs** of Redis time per scrape, its `INFO tb`",
        "  included. Commands a script runs are also counted under their",
        "  own name, so the `info` row of that column holds the exporter's `INFO ALL` and the",
        "  script's `INFO tb`: adding up that column would count `INFO tb` twice.",
        f"- So a scrape costs Redis about {base_us:.1f} + {evals:.1f} = {base_us + evals:.1f} µs with the script,"
        f" {evals / base_us:.0%} more",
        f"  than without; the script alone takes the time of about {evals / consume:.1f} admitted TB.CONSUME",
        f"  calls ({consume:.2f} µs each on this server, sent in pipelines of 1,000; median of {ROUNDS} runs",
        f"  of {CONSUMES:,}).",
        f"- At one scrape every 15 s that is {evals / 15e6:.2e} of one core; at one a second,",
        f"  {evals / 1e6:.2e}.",
        f"- Redis caches the script once (`number_of_cached_scripts` {cached} after {2 * ROUNDS * SCRAPES:,} scrapes),",
        "  as every scrape sends the same text.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the report to this file too")
    options = parser.parse_args()
    text = report()
    print(text)
    if options.out:
        options.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
