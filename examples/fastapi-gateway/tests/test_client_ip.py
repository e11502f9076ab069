"""X-Forwarded-For counts only when the socket peer is a trusted proxy: the
rule of redis_tokenbucket.fastapi.client_ip, wired into the gateway."""

from __future__ import annotations

import pytest

from conftest import auth
from tbasgi import CLIENT_IP_CASES, TRUSTED_PROXIES


@pytest.mark.parametrize("peer, forwarded, client_ip", CLIENT_IP_CASES)
def test_client_ip(make_client, r, peer, forwarded, client_ip):
    client = make_client(trusted_proxies=TRUSTED_PROXIES)
    headers = auth("k-free", **{"X-Test-Peer": peer})
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    assert client.get("/v1/models", headers=headers).status_code == 200
    assert r.keys("rl:ip:*") == [f"rl:ip:{client_ip}"]


def test_no_trusted_proxies_means_no_forwarding(make_client, r):
    client = make_client()
    headers = auth("k-free", **{"X-Test-Peer": "127.0.0.1", "X-Forwarded-For": "198.51.100.1"})
    client.get("/v1/models", headers=headers)
    assert r.keys("rl:ip:*") == ["rl:ip:127.0.0.1"]
