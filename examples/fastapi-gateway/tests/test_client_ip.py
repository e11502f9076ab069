"""X-Forwarded-For counts only when the socket peer is a trusted proxy."""

from __future__ import annotations

import pytest

from conftest import auth

TRUSTED = ["10.0.0.0/8", "fd00::/8"]


@pytest.mark.parametrize(
    "peer, forwarded, client_ip",
    [
        ("203.0.113.7", None, "203.0.113.7"),
        # Anyone can send the header: from an untrusted peer it is ignored.
        ("203.0.113.7", "198.51.100.1", "203.0.113.7"),
        ("10.0.0.5", "198.51.100.1", "198.51.100.1"),
        # The rightmost untrusted hop; what the client wrote left of it is ignored.
        ("10.0.0.5", "1.2.3.4, 198.51.100.1, 10.1.1.1", "198.51.100.1"),
        # All trusted: the leftmost.
        ("10.0.0.5", "10.9.9.9, 10.1.1.1", "10.9.9.9"),
        # Garbage ends the walk at the proxy that passed it on.
        ("10.0.0.5", "1.2.3.4, not-an-ip", "10.0.0.5"),
        ("10.0.0.5", "", "10.0.0.5"),
        # IPv6 clients are limited per /64; IPv4-mapped addresses as IPv4.
        ("2001:db8:1:2:3:4:5:6", None, "2001:db8:1:2::/64"),
        ("fd00::1", "2001:db8::9", "2001:db8::/64"),
        ("::ffff:203.0.113.9", None, "203.0.113.9"),
    ],
)
def test_client_ip(make_client, r, peer, forwarded, client_ip):
    client = make_client(trusted_proxies=TRUSTED)
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
