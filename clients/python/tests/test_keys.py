"""One key rule for every call: str and bytes as they are, an int as its
decimal text, a bytearray or memoryview as bytes; anything else is a
TypeError raised before anything is sent, whatever the failure policy."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import SLOW, Target, calls, run

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, InvalidArgument, Limiter

B = Bucket(10, SLOW)
NOT_KEYS: list[Any] = [None, {"user": 7}, 7.0, True, ["k"], object()]


def stored_keys(target: Target) -> list[bytes]:
    with target.server.client() as raw:
        return sorted(raw.keys("*"))


def tb_calls(target: Target) -> int:
    with target.admin() as admin:
        return calls(admin, "tb.consume", "tb.peek", "tb.adjust", "tb.mconsume", "del")


def test_an_int_is_its_decimal_text_and_a_bytearray_its_bytes(module_target: Target):
    lim = Limiter(module_target.client())
    assert lim.consume(7, B).remaining == 9
    assert lim.consume("7", B).remaining == 8
    assert lim.consume(b"7", B).remaining == 7
    assert lim.consume(bytearray(b"7"), B).remaining == 6
    assert lim.consume(memoryview(b"7"), B).remaining == 5
    d = lim.adjust(7, B, 1)
    assert (d.key, d.remaining) == ("7", 6)
    assert lim.consume(bytearray(b"\xffbin"), B).key == b"\xffbin"
    assert stored_keys(module_target) == [b"7", b"\xffbin"]


@pytest.mark.parametrize("key", NOT_KEYS, ids=lambda k: type(k).__name__)
def test_anything_else_is_a_type_error_before_anything_is_sent(module_target: Target, key: Any):
    lim = Limiter(module_target.client(), on_error="open")
    for call in (
        lambda: lim.consume(key, B),
        lambda: lim.peek(key, B),
        lambda: lim.adjust(key, B, 1),
        lambda: lim.reset(key),
        lambda: lim.consume_many([("a", B), (key, B)]),
    ):
        with pytest.raises(TypeError, match="key must be a str, bytes or int"):
            call()
    with pytest.raises(TypeError, match=r"\(group 2\)"):
        lim.consume_many([("a", B), (key, B)])
    assert tb_calls(module_target) == 0
    assert lim.backend is None


def test_asyncio_has_the_same_rule(module_target: Target):
    async def main() -> tuple[int, str]:
        client = module_target.async_client()
        try:
            lim = tb_asyncio.Limiter(client, on_error="open")
            with pytest.raises(TypeError):
                await lim.consume(None, B)  # type: ignore[arg-type]
            await lim.consume("3", B)
            d = await lim.consume(3, B)
            return d.remaining, str(d.key)
        finally:
            await client.aclose()

    assert run(main()) == (8, "3")


def test_consume_many_keys_follow_the_same_rule(module_target: Target):
    lim = Limiter(module_target.client())
    # 3 is "3", not bytes(3) == b"\0\0\0": no duplicate.
    m = lim.consume_many([(3, B), (b"\0\0\0", B), (-1, B)])
    assert m.allowed and [d.key for d in m.decisions] == ["3", b"\0\0\0", "-1"]
    assert stored_keys(module_target) == [b"\0\0\0", b"-1", b"3"]
    # The same key spelled two ways is one key, as in Redis.
    for pair in ([(7, B), ("7", B)], [("k", B), (bytearray(b"k"), B)], [("é", B), ("é".encode(), B)]):
        with pytest.raises(InvalidArgument, match="duplicate key: group 2 repeats the key of group 1"):
            lim.consume_many(pair)


def test_str_keys_are_compared_as_the_client_encodes_them(module_target: Target):
    """A client that encodes str keys as latin-1 sends "é" as b"\\xe9": the
    same key as those bytes, another key than its UTF-8 bytes."""
    lim = Limiter(redis.Redis(port=module_target.server.port, encoding="latin-1"))
    with pytest.raises(InvalidArgument, match="duplicate key"):
        lim.consume_many([("é", B), (b"\xe9", B)])
    assert lim.consume_many([("é", B), ("é".encode(), B)]).allowed
