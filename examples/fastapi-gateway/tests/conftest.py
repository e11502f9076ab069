"""Real redis-servers on free loopback ports: one with the module, one
without (the gateway's limiter then loads the Lua library it ships). The
`server` fixture is parametrized over both, so every test that touches
Redis runs twice. The servers come from the package's test kit
(clients/python/tests/tbservers.py), shared with the package's own tests."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from redis_tokenbucket import Limiter

import app as gateway
from config import Limits, Principal, Settings, TierLimits, TokenBucket, key_id

# Appended, not prepended: this directory's conftest must stay `conftest`.
sys.path.append(str(Path(__file__).resolve().parents[3] / "clients" / "python" / "tests"))
from tbasgi import PeerFromHeader  # noqa: E402
from tbservers import Server  # noqa: E402

# Refill so slow that no test lives long enough to see a whole token back.
SLOW = 0.001



def bucket(max_: float, rate: float = SLOW) -> TokenBucket:
    return TokenBucket(max=max_, rate=rate)


def tier(user: TokenBucket, key: TokenBucket, llm: TokenBucket = bucket(100), streams: int = 2) -> TierLimits:
    return TierLimits(user=user, key=key, llm=llm, streams=streams)


LIMITS = Limits(
    tiers={
        "free": tier(bucket(3), bucket(5), bucket(100), streams=2),
        "standard": tier(bucket(4), bucket(6), bucket(1000), streams=3),
        "enterprise": tier(bucket(8), bucket(5), bucket(1000), streams=4),
    },
    ip=bucket(50),
    # Far longer than any test: only a release frees a stream's slot in time.
    stream_lease_ms=60_000,
    model_streams=5,
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

class GatewayServer(Server):
    """A Redis 7.0, with or without the module; `backend` is what the
    gateway's limiter should find."""

    def __init__(self, with_module: bool, workdir: Path) -> None:
        super().__init__("redis-7.0", workdir, module=with_module)
        self.with_module = with_module
        self.backend = "module" if with_module else "functions"

    def peek(self, r: redis.Redis, key: str, bucket: TokenBucket, cost: float = 1) -> list[int]:
        """[allowed, remaining, retry_after_ms, reset_after_ms] of a bucket,
        through the package on whichever backend the server has."""
        d = Limiter(r).peek(key, bucket.named("x"), cost)
        return [int(d.allowed), d.remaining, d.retry_after_ms, d.reset_after_ms]


@pytest.fixture(scope="session", params=["module", "lua"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    s = GatewayServer(request.param == "module", tmp_path_factory.mktemp(request.param))
    s.start()
    yield s
    s.stop()


@pytest.fixture
def r(server: GatewayServer) -> Iterator[redis.Redis]:
    """A clean server for each test: no buckets, and no Lua library, so the
    gateway has to load it again."""
    client = redis.Redis(port=server.port, decode_responses=True)
    client.flushall()
    client.function_flush()
    yield client
    client.close()


@pytest.fixture
def own_server(server: GatewayServer, tmp_path: Path) -> Iterator[GatewayServer]:
    """A server of the same kind that a test may stop."""
    s = GatewayServer(server.with_module, tmp_path)
    s.start()
    yield s
    s.stop()


@pytest.fixture(params=[False, True], ids=["mconsume", "cluster"])
def cluster_mode(request: pytest.FixtureRequest) -> bool:
    """Both ways of checking several buckets; on one node they must agree."""
    return request.param


MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(server: GatewayServer, r: redis.Redis) -> Iterator[MakeClient]:
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
