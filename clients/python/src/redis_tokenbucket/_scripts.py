"""How each operation is spelled on each backend, and the Lua it needs.

This is the one place that knows the module's commands, the library's
function names and the EVAL script's calling convention: the functions
below turn an operation and its checked `(key, bucket, amount)` groups into
the arguments of one Redis command. `_engine` sends them and reads the
replies (the replies are the same on every backend).

The Lua files are the repository's `lua/tb.lua` and the EVAL script that
`lua/gen_eval.py` generates from it, put into the package when the wheel is
built (hatch_build.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal, Optional

from ._bucket import Bucket, KeyT, encode

BucketOp = Literal["consume", "peek", "adjust", "mconsume"]
LeaseOp = Literal["acquire", "release", "renew", "inflight"]
Op = Literal[BucketOp, LeaseOp]
Args = tuple[Any, ...]
Group = tuple[KeyT, Bucket, float]
"""(key, bucket, cost or delta), checked."""
LeaseHead = tuple[KeyT, Args]
"""A lease operation's key and the arguments before its buckets: `limit
lease_ms id weight` (acquire), `id` (release), `id lease_ms` (renew), none
(inflight)."""

# ---- the module -----------------------------------------------------------

COMMANDS: dict[Op, str] = {
    "consume": "TB.CONSUME",
    "peek": "TB.PEEK",
    "adjust": "TB.ADJUST",
    "mconsume": "TB.MCONSUME",
    "acquire": "TB.ACQUIRE",
    "release": "TB.RELEASE",
    "renew": "TB.RENEW",
    "inflight": "TB.INFLIGHT",
}


def module_args(op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None) -> Args:
    """TB.<OP> key max rate amount [key max rate amount ...], or for a lease
    operation TB.<OP> key head... [BUCKET bkey max rate cost ...]"""
    if lease is not None:
        key, head = lease
        return (COMMANDS[op], key, *head, *(a for k, b, n in groups for a in ("BUCKET", k, *b._limit_args, encode(n))))
    if len(groups) == 1:  # the common case, without the generator
        key, bucket, amount = groups[0]
        return (COMMANDS[op], key, *bucket._limit_args, encode(amount))
    return (COMMANDS[op], *(a for k, b, n in groups for a in (k, *b._limit_args, encode(n))))


# ---- the Functions library (lua/tb.lua) -------------------------------------

LIBRARY_FILE = "tb.lua"
# FCALL_RO tb_version 0: the version of the library a server has loaded.
VERSION_ARGS: Args = ("FCALL_RO", "tb_version", 0)
# How the library states its version (lua/tb.lua).
_VERSION_LINE = re.compile(rb"^local LIBRARY_VERSION = '([^'\r\n]+)'$", re.MULTILINE)
# FCALL_RO for the read-only one, so it also runs on replicas.
FUNCTIONS: dict[Op, tuple[str, str]] = {
    "consume": ("FCALL", "tb_consume"),
    "peek": ("FCALL_RO", "tb_peek"),
    "adjust": ("FCALL", "tb_adjust"),
    "mconsume": ("FCALL", "tb_mconsume"),
    "acquire": ("FCALL", "tb_acquire"),
    "release": ("FCALL", "tb_release"),
    "renew": ("FCALL", "tb_renew"),
    "inflight": ("FCALL_RO", "tb_inflight"),
}


def fcall_args(op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None) -> Args:
    """FCALL tb_<op> numkeys key... max rate amount ...; for a lease
    operation the lease key comes first, then the bucket keys, then its
    head, then max rate cost per bucket (lua/tb.lua's form)."""
    command, function = FUNCTIONS[op]
    if lease is not None:
        key, head = lease
        return (command, function, 1 + len(groups), key, *_keys(groups), *head, *_limits(groups))
    return (command, function, len(groups), *_keys(groups), *_limits(groups))


# Lua takes keys and arguments apart: every key first, then one
# `max rate amount` group per key, in the same order.


def _keys(groups: Sequence[Group]) -> list[KeyT]:
    return [k for k, _, _ in groups]


def _limits(groups: Sequence[Group]) -> list[str]:
    return [a for _, b, n in groups for a in (*b._limit_args, encode(n))]


# ---- the EVAL script (lua/gen_eval.py) ------------------------------------

EVAL_FILE = "tb-eval.lua"


def eval_args(op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None) -> Args:
    """What follows `EVALSHA <sha>` (or `EVAL <source>`): numkeys key...
    <op> max rate amount ..., the operation named as in FCALL tb_<op>
    (consume, peek, adjust, mconsume, acquire, ...), then what that
    function takes. Plain EVALSHA for peek and inflight too: EVALSHA_RO
    needs Redis 7, and Redis 6.2 is what this backend is mostly for."""
    if lease is not None:
        key, head = lease
        return (1 + len(groups), key, *_keys(groups), op, *head, *_limits(groups))
    return (len(groups), *_keys(groups), op, *_limits(groups))


@dataclass(frozen=True)
class Script:
    source: bytes
    sha: str


@cache
def eval_script() -> Script:
    """The EVAL script and its SHA1, read on first use (so importing the
    package never touches the files)."""
    source = lua_source(EVAL_FILE)
    return Script(source, hashlib.sha1(source).hexdigest())


# ---- the packaged files -----------------------------------------------------


class LuaMissing(RuntimeError):
    """The package was installed without its Lua files (not from a wheel or
    sdist built by its own build hook)."""


@cache
def lua_source(name: str) -> bytes:
    """A packaged Lua file, from the package's lua/ folder."""
    try:
        # One name per joinpath: Traversable.joinpath takes one before Python 3.11.
        return resources.files(__package__).joinpath("lua").joinpath(name).read_bytes()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise LuaMissing(f"redis_tokenbucket has no lua/{name}: install it from a built wheel") from exc


def library_source() -> bytes:
    return lua_source(LIBRARY_FILE)


@cache
def library_version() -> str:
    """The version of the library this package ships, as its `tb_version`
    answers it."""
    found = _VERSION_LINE.findall(library_source())
    if len(found) != 1:
        raise LuaMissing(f"redis_tokenbucket's lua/{LIBRARY_FILE} states no version: no one LIBRARY_VERSION line")
    version: bytes = found[0]
    return version.decode()
