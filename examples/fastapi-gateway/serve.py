"""The gateway under uvicorn in N worker processes, each with a listening
socket of its own on one port (SO_REUSEPORT, Linux): the kernel spreads
new connections evenly over the workers.

`uvicorn --workers N` gives every worker the one socket, and whichever
worker wakes first accepts the whole burst of connections waiting on it:
under wrk, which opens all its connections at once, one worker of two got
all 200 of them while the other sat idle (docs/benchmarks.md, the gateway
under load). Here every socket is bound and listening before any worker
starts, so no connection waits on a socket nobody serves.

    python serve.py --workers 2 --port 8000   # GATEWAY_* as for app:app

Once every worker serves, it prints "all N workers up". SIGTERM or SIGINT
stops them all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import signal
import socket
import sys
from multiprocessing.synchronize import Event
from types import FrameType
from typing import Optional

import uvicorn


def listener(host: str, port: int, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def worker(sock: socket.socket, options: dict[str, object], ready: Event) -> None:
    server = uvicorn.Server(uvicorn.Config("app:app", **options))  # type: ignore[arg-type]

    async def serve() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        # What startup made lives as long as the worker: out of the cyclic
        # collector's scans (a full one scanned all of it, ~90 ms apiece with
        # 1,000 connections open, in docs/benchmarks.md's profile).
        gc.freeze()
        ready.set()
        await serving

    asyncio.run(serve())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=2048)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    options: dict[str, object] = {
        "proxy_headers": False,  # the gateway's own rule reads X-Forwarded-For (README, Client IP)
        "access_log": False,
        "log_level": args.log_level,
        "backlog": args.backlog,
    }
    spawn = multiprocessing.get_context("spawn")
    sockets = [listener(args.host, args.port, args.backlog) for _ in range(args.workers)]
    started = [(spawn.Process(target=worker, args=(sock, options, ready)), ready)
               for sock, ready in ((s, spawn.Event()) for s in sockets)]  # fmt: skip

    def stop(signum: int, frame: Optional[FrameType]) -> None:
        for process, _ in started:
            if process.is_alive() and process.pid is not None:
                process.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for process, _ in started:
        process.start()
    for process, ready in started:
        while not ready.wait(0.1):
            if not process.is_alive():
                stop(signal.SIGTERM, None)
                sys.exit(f"a worker exited before serving (exit code {process.exitcode})")
    print(f"all {args.workers} workers up on {args.host}:{args.port}", flush=True)
    for process, _ in started:
        process.join()


if __name__ == "__main__":
    main()
