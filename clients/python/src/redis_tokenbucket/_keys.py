"""Keys: what a key may be, the one rule every call applies, and keys
that share a Redis Cluster slot."""

from __future__ import annotations

from typing import Any, Optional, Union

KeyT = Union[str, bytes]
"""A Redis key: any string or binary string (an int stands for its decimal
text, a bytearray or memoryview for its bytes)."""


def check_key(key: Any, group: Optional[int] = None) -> KeyT:
    """The key as it is sent and reported: a str or bytes as it is, an int
    as its decimal text (what redis-py sends for it), a bytearray or
    memoryview as bytes. Anything else (None, a float, a bool, a dict) is a
    TypeError, raised before anything is sent."""
    if isinstance(key, (str, bytes)):
        return key
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return str(int(key))
    where = "" if group is None else f" (group {group})"
    raise TypeError(f"key must be a str, bytes or int{where}, got {type(key).__name__}")


def key_bytes(key: KeyT, encoding: str = "utf-8") -> bytes:
    """The bytes Redis sees for a checked key: a str encoded as the client
    encodes it. `7`, `"7"` and `b"7"` are one key."""
    return key.encode(encoding) if isinstance(key, str) else key


def client_encoding(client: Any) -> str:
    """The encoding a redis-py client (sync or asyncio, single node or
    Cluster) gives str keys; UTF-8, redis-py's default, for anything else."""
    get_encoder = getattr(client, "get_encoder", None)
    encoding = getattr(get_encoder(), "encoding", None) if callable(get_encoder) else None
    return encoding if isinstance(encoding, str) else "utf-8"


def hash_tagged(tag: str, *names: str, prefix: str = "rl") -> list[str]:
    """Keys `prefix:{tag}:name`, one per name, all in one Cluster slot
    (only the `{tag}` part is hashed), so `consume_many` on them is one
    atomic TB.MCONSUME::

        hash_tagged("user42", "user", "llm")  # ['rl:{user42}:user', 'rl:{user42}:llm']
    """
    if not tag or "}" in tag:
        raise ValueError("tag must be non-empty and must not contain '}'")
    if "{" in prefix:
        # Redis hashes the first {...} of the key: it must be the tag.
        raise ValueError("prefix must not contain '{'")
    if not names:
        raise ValueError("hash_tagged needs at least one name")
    return [f"{prefix}:{{{tag}}}:{name}" for name in names]
