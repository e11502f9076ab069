"""The load both gateway benches drive (examples/fastapi-gateway's
`make bench-gateway` and examples/nginx-gateway's `make bench-nginx`):
USERS saturated users, each an API key whose user bucket holds USER_MAX
tokens refilled at USER_RATE per second, the gateway's other buckets out
of the way, driven by wrk with gateway_load.lua on GET /v1/models.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

LOAD = Path(__file__).resolve().parent / "gateway_load.lua"
USERS = 50
USER_MAX, USER_RATE = 20, 2.0
OUT_OF_THE_WAY = {"max": 1e9, "rate": 1e6}


def budget(seconds: float) -> float:
    """What the users' buckets can admit over `seconds`, exactly."""
    return USERS * (USER_MAX + USER_RATE * seconds)


def gateway_env(redis_url: str, **settings: str) -> dict[str, str]:
    """Either gateway's configuration (they read the same GATEWAY_*
    variables) for these users; `settings` adds GATEWAY_<NAME>s."""
    keys = {
        hashlib.sha256(f"bench-key-{i}".encode()).hexdigest(): {"user_id": f"bench-{i}", "tier": "free"}
        for i in range(USERS)
    }
    limits = {
        "tiers": {"free": {"user": {"max": USER_MAX, "rate": USER_RATE}, "key": OUT_OF_THE_WAY, "llm": OUT_OF_THE_WAY}},
        "ip": OUT_OF_THE_WAY,
    }
    return {
        "GATEWAY_REDIS_URL": redis_url,
        "GATEWAY_API_KEYS": json.dumps(keys),
        "GATEWAY_LIMITS": json.dumps(limits),
        **{f"GATEWAY_{k.upper()}": v for k, v in settings.items()},
    }


def wrk(ports: list[int], connections: int, seconds: int) -> list[dict[str, int]]:
    """One wrk per port, at once, the connections split between them (2
    threads for one port, 1 each for more); each one's RESULT counts."""
    exe = shutil.which("wrk")
    if exe is None:
        raise RuntimeError("wrk is missing: `make deps` installs it")
    threads = 2 if len(ports) == 1 else 1

    def command(port: int) -> list[str]:
        return [exe, f"-t{threads}", f"-c{connections // len(ports)}", f"-d{seconds}s", "--timeout", "10s",
                "-s", str(LOAD), f"http://127.0.0.1:{port}", "--", str(USERS)]  # fmt: skip

    procs = [subprocess.Popen(command(p), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in ports]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=seconds + 60)
        line = re.search(r"^RESULT (.*)$", stdout, re.M)
        if line is None:
            raise RuntimeError(f"wrk gave no result: {stdout}\n{stderr}")
        out.append({k: int(v) for k, v in (kv.split("=") for kv in line.group(1).split())})
    return out
