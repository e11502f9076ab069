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

from ._bucket import KeyT, encode
from ._quota import Rule

BucketOp = Literal["consume", "peek", "adjust", "mconsume"]
QuotaOp = Literal["quota", "qpeek", "qadjust", "charge"]
LeaseOp = Literal["acquire", "release", "renew", "inflight"]
Op = Literal[BucketOp, QuotaOp, LeaseOp]
Args = tuple[Any, ...]
Group = tuple[KeyT, Rule, float]
"""(key, bucket or quota, cost or delta), checked."""

# A call names the bucket operation; a quota is charged by its own
# command, and several rules of which one is a quota by TB.CHARGE.
_QUOTA_OPS: dict[str, QuotaOp] = {"consume": "quota", "peek": "qpeek", "adjust": "qadjust", "mconsume": "charge"}


def wire_op(op: Op, groups: Sequence[Group], after: Args = ()) -> Op:
    """The operation sent for `op` on `groups`: a quota's own for a
    quota, TB.CHARGE for several rules with a quota among them or a wait."""
    if op == "mconsume":
        return "charge" if after or any(r.kind == "quota" for _, r, _ in groups) else op
    if len(groups) == 1 and groups[0][1].kind == "quota":
        return _QUOTA_OPS.get(op, op)
    return op


def _rule_args(rule: Rule, amount: float) -> tuple[str, ...]:
    """A rule's arguments after its key: `max rate amount`, or a quota's
    `limit period amount [OFFSET m]`."""
    return (*rule._limit_args, encode(amount), *rule._after_args)


def _clause(rule: Rule, amount: float) -> tuple[str, ...]:
    """A TB.CHARGE clause: BUCKET max rate cost, or QUOTA limit period cost
    [OFFSET m]."""
    return ("QUOTA" if rule.kind == "quota" else "BUCKET", *_rule_args(rule, amount))


def _keyed_clause(key: KeyT, rule: Rule, amount: float) -> tuple[Any, ...]:
    """A TB.ACQUIRE clause: a TB.CHARGE clause with its key after the
    keyword."""
    keyword, *rest = _clause(rule, amount)
    return (keyword, key, *rest)


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
    "quota": "TB.QUOTA",
    "qpeek": "TB.QPEEK",
    "qadjust": "TB.QADJUST",
    "charge": "TB.CHARGE",
}


def module_args(op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None, after: Args = ()) -> Args:
    """TB.<OP> key max rate amount [key max rate amount ...] (a quota's
    `key limit period amount [OFFSET m]`), then `after` (WAIT max_ms); for
    TB.CHARGE numkeys key... [WAIT max_ms] clause...; for a lease
    operation TB.<OP> key head... [BUCKET bkey max rate cost | QUOTA qkey
    limit period cost [OFFSET m] ...]"""
    if lease is not None:
        key, head = lease
        return (COMMANDS[op], key, *head, *(a for k, r, n in groups for a in _keyed_clause(k, r, n)))
    if op == "charge":
        return (COMMANDS[op], len(groups), *_keys(groups), *after, *_clauses(groups))
    if len(groups) == 1:  # the common case, without the generator
        key, rule, amount = groups[0]
        if not after and not rule._after_args:
            return (COMMANDS[op], key, *rule._limit_args, encode(amount))
        return (COMMANDS[op], key, *_rule_args(rule, amount), *after)
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
    "quota": ("FCALL", "tb_quota"),
    "qpeek": ("FCALL_RO", "tb_qpeek"),
    "qadjust": ("FCALL", "tb_qadjust"),
    "charge": ("FCALL", "tb_charge"),
}


def fcall_args(op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None, after: Args = ()) -> Args:
    """FCALL tb_<op> numkeys key... max rate amount ... [WAIT max_ms];
    tb_charge's numkeys key... [WAIT max_ms] clause...; for a lease
    operation the lease key comes first, then the clause keys, then its
    head, then the clauses (lua/tb.lua's form, see `_lease_clauses`)."""
    command, function = FUNCTIONS[op]
    if lease is not None:
        key, head = lease
        return (command, function, 1 + len(groups), key, *_keys(groups), *head, *_lease_clauses(groups))
    return (command, function, len(groups), *_keys(groups), *_arguments(op, groups, after))


# Lua takes keys and arguments apart: every key first, then one
# `max rate amount` group per key, in the same order.


def _keys(groups: Sequence[Group]) -> list[KeyT]:
    return [k for k, _, _ in groups]


def _limits(groups: Sequence[Group]) -> list[str]:
    return [a for _, b, n in groups for a in (*b._limit_args, encode(n))]


def _clauses(groups: Sequence[Group]) -> list[str]:
    return [a for _, r, n in groups for a in _clause(r, n)]


def _lease_clauses(groups: Sequence[Group]) -> list[str]:
    """tb_acquire's clauses: with a quota among them, as tb_charge's; of
    buckets alone, `max rate cost` each, the form every version of the
    library reads."""
    if any(r.kind == "quota" for _, r, _ in groups):
        return _clauses(groups)
    return _limits(groups)


def _arguments(op: Op, groups: Sequence[Group], after: Args) -> list[Any]:
    """ARGV of a bucket or quota operation: each group's rule and amount,
    `after` behind them (tb_charge's WAIT goes first, then its clauses)."""
    if op == "charge":
        return [*after, *_clauses(groups)]
    if len(groups) == 1:
        return [*_rule_args(groups[0][1], groups[0][2]), *after]
    return _limits(groups)


# ---- the EVAL script (lua/gen_eval.py) ------------------------------------

EVAL_FILE = "tb-eval.lua"


def eval_args(op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None, after: Args = ()) -> Args:
    """What follows `EVALSHA <sha>` (or `EVAL <source>`): numkeys key...
    <op> max rate amount ..., the operation named as in FCALL tb_<op>
    (consume, peek, adjust, mconsume, acquire, ...), then what that
    function takes. Plain EVALSHA for peek and inflight too: EVALSHA_RO
    needs Redis 7, and Redis 6.2 is what this backend is mostly for."""
    if lease is not None:
        key, head = lease
        return (1 + len(groups), key, *_keys(groups), op, *head, *_lease_clauses(groups))
    return (len(groups), *_keys(groups), op, *_arguments(op, groups, after))


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
