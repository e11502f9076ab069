"""Bad input: a key header missing, huge or binary, and a Redis reply of
the wrong shape, each a clear 4xx or 5xx with nothing written to Redis; no
worker dies, and the error log names the cause once, not once per
request. Also what no real single Redis sends: Cluster redirects."""

from __future__ import annotations

from conftest import SLOW, one_limiter
from fakeredis_resp import FakeRedis, array, integer
from redis.crc import key_slot

RULES = [f'{{ name = "user", max = 5, rate = {SLOW}, key = "$http_x_user" }}']
BIG_HEADERS = "large_client_header_buffers 4 32k;"


def test_a_missing_key_is_a_400_and_writes_nothing(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=RULES))
    pids = n.worker_pids()
    for _ in range(20):
        res = n.get("/limited")
        assert res.status == 400
        assert res.json() == {"type": "about:blank", "title": "Bad Request", "status": 400,
                              "detail": "The user key is missing."}  # fmt: skip
    assert r.dbsize() == 0
    assert len(n.log_lines("rule user: missing ($http_x_user)")) == 1
    assert n.worker_pids() == pids


def test_a_huge_key_is_a_400_and_writes_nothing(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=RULES), http=BIG_HEADERS)
    for _ in range(5):
        res = n.get("/limited", {"X-User": "a" * 9000})
        assert res.status == 400 and res.json()["detail"] == "The user key is too long (over 1024 bytes)."
    assert r.dbsize() == 0
    assert len(n.log_lines("rule user: too long (over 1024 bytes) ($http_x_user)")) == 1
    assert not n.log_lines("a" * 100), "the log never holds the request's bytes"


def test_a_header_over_nginx_own_limit_is_its_400(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=RULES))
    assert n.get("/limited", {"X-User": "a" * 9000}).status == 400
    assert r.dbsize() == 0


def test_a_binary_key_is_a_400_and_writes_nothing(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=RULES))
    for value in ("ab\x01cd", "caf\xe9", "\x7f"):  # a control byte, Latin-1 (not UTF-8), DEL
        res = n.get("/limited", {"X-User": value})
        assert res.status == 400 and res.json()["detail"] == "The user key is not text.", value
    assert r.dbsize() == 0
    assert len(n.log_lines("rule user: not text ($http_x_user)")) == 1
    # Text in any script is a key, and so is a binary variable's value.
    assert n.get("/limited", {"X-User": "zoë".encode().decode("latin-1")}).status == 200


def test_a_reply_of_the_wrong_shape_is_a_500_named_once(nginx):
    fake = FakeRedis(lambda args: b"+OK\r\n")
    try:
        n = nginx(one_limiter(fake.url, on_error="open", rules=RULES))
        pids = n.worker_pids()
        for _ in range(20):
            res = n.get("/limited", {"X-User": "u"})
            assert res.status == 500
            assert res.json()["detail"] == "The rate limiter failed: see the error log."
        assert len(n.log_lines('Redis answered TB.MCONSUME with the text "OK"')) == 1
        assert n.worker_pids() == pids
        # One command per request, and nothing written after a bad reply.
        assert {a[0].lower() for a in fake.commands} == {b"tb.mconsume"}
    finally:
        fake.close()


def test_an_array_of_the_wrong_shape_is_a_500_too(nginx):
    fake = FakeRedis(lambda args: array(integer(1), integer(0), array(integer(1), integer(2))))
    try:
        n = nginx(one_limiter(fake.url, on_error="open", rules=RULES))
        assert n.get("/limited", {"X-User": "u"}).status == 500
        assert n.log_lines("TB.MCONSUME's bucket 1 with an array of 2")
    finally:
        fake.close()


def ok_reply() -> bytes:
    return array(integer(1), integer(0), array(integer(1), integer(4), integer(0), integer(200)))


def test_moved_is_followed_and_remembered_ask_is_followed_once(nginx):
    target = FakeRedis(lambda args: b"+OK\r\n" if args[0].lower() == b"asking" else ok_reply())
    moved = FakeRedis(lambda args: b"-MOVED %d 127.0.0.1:%d\r\n" % (key_slot(args[1]), target.port))
    asked = FakeRedis(lambda args: b"-ASK %d 127.0.0.1:%d\r\n" % (key_slot(args[1]), target.port))
    try:
        n = nginx(one_limiter(moved.url, rules=RULES), workers=1)
        for _ in range(3):
            res = n.get("/limited", {"X-User": "u"})
            assert res.status == 200, n.error_log.read_text()[-2000:]
        assert len(moved.commands) == 1, "the slot learned from MOVED: straight to its node"
        assert [a[0].lower() for a in target.commands] == [b"tb.mconsume"] * 3
        target.commands.clear()
        m = nginx(one_limiter(asked.url, rules=RULES), workers=1)
        for _ in range(2):
            res = m.get("/limited", {"X-User": "u"})
            assert res.status == 200, m.error_log.read_text()[-2000:]
        assert len(asked.commands) == 2, "ASK is for one command: the next goes to the node again"
        assert [a[0].lower() for a in target.commands] == [b"asking", b"tb.mconsume"] * 2
    finally:
        for f in (target, moved, asked):
            f.close()
