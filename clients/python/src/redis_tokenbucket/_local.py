"""The bounded fail-open of ``on_error="local"``: while Redis is failing,
each process answers from token buckets of its own, with `max` and `rate`
divided by the number of processes that share the limit, and from leases
of its own, with a `Concurrency` limit divided likewise (at least 1).

The arithmetic is not written again here: these buckets and leases run the
package's own Lua library (the `tb.lua` that Redis runs as Functions), in
process, on lupa's Lua 5.1, the Lua of Redis. What this file adds is the
part of Redis that library touches: eleven commands (TIME, TYPE, HLEN, HGET,
HMGET, HGETALL, HSET, HDEL, DEL, PEXPIREAT, GET) over a dict. Needs the extra:
``pip install "redis-tokenbucket[local]"``.

Approximate by design: each process sees only its own traffic, so the
whole fleet admits about the limit only while load spreads evenly over
`processes` processes, and a bucket starts full in each process when the
breaker opens (what a client already spent in Redis is not known here).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

from redis.exceptions import ResponseError

from ._bucket import Bucket
from ._keys import KeyT
from ._quota import Quota, Rule
from ._scripts import Args, Group, Op, fcall_args, library_source, wire_op

try:  # Redis runs Lua 5.1; lupa ships it next to newer ones.
    from lupa.lua51 import LuaRuntime  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # an older lupa, or none
    try:
        from lupa import LuaRuntime  # type: ignore[import-untyped, import-not-found, no-redef, unused-ignore]
    except ImportError:
        LuaRuntime = None

MISSING = 'on_error="local" needs lupa: pip install "redis-tokenbucket[local]"'

# The library's entry points, registered as Redis would (redis.register_function).
_PRELUDE = """
function(call)
  local functions = {}
  redis = {
    call = call,
    pcall = call,
    error_reply = function(message) return { err = message } end,
    status_reply = function(message) return { ok = message } end,
    register_function = function(f) functions[f.function_name] = f.callback end,
  }
  return functions
end
"""

# Sweep out expired buckets after this many writes (buckets also expire
# when next read), so memory follows the live keys.
_SWEEP_EVERY = 4096


def available() -> bool:
    return LuaRuntime is not None


def require() -> None:
    if LuaRuntime is None:
        raise ImportError(MISSING)


@functools.lru_cache(maxsize=4096)
def share(rule: Rule, processes: int) -> Rule:
    """This process's part of a bucket or a quota."""
    if processes == 1:
        return rule
    if isinstance(rule, Quota):
        return Quota(rule.limit / processes, rule.period, rule.offset, rule.name)
    return Bucket(rule.max / processes, rule.rate / processes, rule.name)


def share_limit(limit: int, processes: int) -> int:
    """This process's part of a Concurrency limit: at least one slot, so a
    limit below the number of processes still admits here."""
    return max(1, limit // processes)


class LocalBuckets:
    """Token buckets in this process, run by the package's Lua library."""

    def __init__(self, processes: int) -> None:
        require()
        assert LuaRuntime is not None
        self.processes = processes
        self._lua = LuaRuntime(encoding=None, unpack_returned_tuples=False)
        self._data: dict[bytes, list[Any]] = {}  # key -> [fields, expires at (ms) or None]
        self._writes = 0
        self._lock = threading.Lock()
        functions = self._lua.eval(_PRELUDE)(self._call)
        source = library_source()
        if source.startswith(b"#!"):  # the shebang line is Redis's, not Lua's
            source = source.split(b"\n", 1)[1]
        self._lua.execute(source)
        self._functions = functions

    def run(self, op: Op, groups: Sequence[Group], after: Args = ()) -> Any:
        """What the FCALL of `op` would answer for `groups` (a quota's
        function for a quota), here; rules are this process's share. A
        cost that can't fit a share is a denial."""
        local = [(k, share(b, self.processes), c) for k, b, c in groups]
        # FCALL's own arguments: the keys, then ARGV.
        _, function, n, *rest = fcall_args(wire_op(op, local, after), local, None, after)
        keys, args = [_bytes(a) for a in rest[:n]], [_bytes(a) for a in rest[n:]]
        with self._lock:
            reply = self._functions[function.encode()](self._lua.table_from(keys), self._lua.table_from(args))
            return _python(reply)

    def run_lease(self, op: Op, key: KeyT, head: Args, groups: Sequence[Group]) -> Any:
        """What FCALL tb_<op> would answer for a lease operation, here: an
        acquire's limit (at least 1) and buckets are this process's share.
        A weight that can't fit a share is an error reply, raised."""
        if op == "acquire":
            head = (str(share_limit(int(head[0]), self.processes)), *head[1:])
        local = [(k, share(b, self.processes), c) for k, b, c in groups]
        _, function, n, *rest = fcall_args(op, local, (key, head))
        keys, args = [_bytes(a) for a in rest[:n]], [_bytes(a) for a in rest[n:]]
        with self._lock:
            reply = self._functions[function.encode()](self._lua.table_from(keys), self._lua.table_from(args))
            return _python(reply)

    def __len__(self) -> int:
        return len(self._data)

    # ---- the Redis the library sees -------------------------------------

    def _call(self, command: bytes, *args: Any) -> Any:
        name = command.upper()
        now_ms = time.time() * 1000
        if name == b"TIME":
            us = time.time_ns() // 1000
            return self._lua.table_from([str(us // 1_000_000).encode(), str(us % 1_000_000).encode()])
        key = bytes(args[0])
        entry = self._live(key, now_ms)
        if name == b"TYPE":
            kind = b"none" if entry is None else (b"hash" if isinstance(entry[0], dict) else b"string")
            return self._lua.table_from({b"ok": kind})
        if name == b"HLEN":
            return 0 if entry is None else len(entry[0])
        if name == b"HGET":
            fields = entry[0] if entry is not None else {}
            return fields.get(bytes(args[1]), False)
        if name == b"HMGET":
            fields = entry[0] if entry is not None else {}
            return self._lua.table_from([fields.get(bytes(f), False) for f in args[1:]])
        if name == b"HGETALL":
            fields = entry[0] if entry is not None else {}
            return self._lua.table_from([x for pair in fields.items() for x in pair])
        if name == b"HDEL":
            if entry is None:
                return 0
            gone = sum(entry[0].pop(bytes(f), None) is not None for f in args[1:])
            if not entry[0]:
                del self._data[key]  # Redis deletes a hash left empty
            return gone
        if name == b"HSET":
            if entry is None:
                entry = self._data[key] = [{}, None]
            pairs = args[1:]
            for i in range(0, len(pairs), 2):
                entry[0][bytes(pairs[i])] = bytes(pairs[i + 1])
            self._wrote(now_ms)
            return len(pairs) // 2
        if name == b"PEXPIREAT":
            if entry is None:
                return 0
            entry[1] = int(args[1])
            return 1
        if name == b"DEL":
            return 0 if self._data.pop(key, None) is None else 1
        if name == b"GET":
            return False  # no key here ever holds a string
        raise ResponseError(f"ERR the local fallback does not run {command!r}")

    def _live(self, key: bytes, now_ms: float) -> Optional[list[Any]]:
        entry = self._data.get(key)
        if entry is not None and entry[1] is not None and entry[1] <= now_ms:
            del self._data[key]
            return None
        return entry

    def _wrote(self, now_ms: float) -> None:
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 0:
            for key in [k for k, (_, at) in self._data.items() if at is not None and at <= now_ms]:
                del self._data[key]


def _bytes(value: KeyT) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _python(value: Any) -> Any:
    """A Lua reply as Redis would send it: integers, lists, errors raised."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, (bool, bytes)):
        return value
    err = value[b"err"]
    if err is not None:
        raise ResponseError(err.decode())
    return [_python(v) for v in value.values()]
