"""Keys that share a Redis Cluster slot."""

from __future__ import annotations


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
