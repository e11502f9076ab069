"""The engine: sends one operation on the backend in use, and finds that
backend: on first use, and again when a reply says it is gone (a failover
to a node without the module, FUNCTION FLUSH, a restart). The call itself
is the probe: a refusal means nothing ran, so nothing is charged twice.
While one call checks or loads the Functions library, the others answer
through the EVAL script, so a burst of first calls loads it once.

Each operation is a plan: a generator that yields the Redis commands to
send and receives their replies (or has their errors thrown in). The sync
Limiter runs a plan with blocking calls, the asyncio one with awaits;
neither knows what the commands are. The Node package's twin is
engine.ts; clients/spec/backend.json holds the scenarios.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from typing import Any, Literal, Optional, TypeVar

from redis.exceptions import NoScriptError, ResponseError

from ._bucket import KeyT
from ._commands import Command, Once, ToNode, Waited
from ._contract import WARNINGS
from ._errors import NoBackendError, ReplicasBehind
from ._scripts import (
    VERSION_ARGS,
    Args,
    Group,
    LeaseHead,
    Op,
    eval_args,
    eval_script,
    fcall_args,
    library_source,
    library_version,
    module_args,
    wire_op,
)

log = logging.getLogger("redis_tokenbucket")

T = TypeVar("T")

Plan = Generator[Command, Any, T]
"""Yields commands, receives replies, returns the result."""

BackendName = Literal["module", "functions", "eval"]
BACKENDS: tuple[BackendName, ...] = ("module", "functions", "eval")
# The operations that can take a token or a slot: WAIT goes behind them.
WRITES = frozenset({"consume", "mconsume", "acquire", "quota", "charge"})


def config_value(reply: Any) -> str:
    """The value of CONFIG GET's one parameter, whatever shape the client
    gives it: [name, value], {name: value}, or a Cluster's {node: reply}."""
    if isinstance(reply, dict):
        if reply and all(isinstance(v, (dict, list)) for v in reply.values()):
            reply = next(iter(reply.values()))  # one node's answer
        if isinstance(reply, dict):
            reply = [x for kv in reply.items() for x in kv]
    if not isinstance(reply, list) or len(reply) < 2:
        return ""
    value = reply[1]
    return value.decode() if isinstance(value, bytes) else str(value)


def eviction_warning(policy: str, maxmemory: int) -> Optional[str]:
    """The module's warning (core/src/eviction.rs, contract.json's
    "warnings") where `policy` with `maxmemory` can evict limiter keys."""
    if maxmemory == 0 or policy.lower() in ("noeviction", ""):
        return None
    what = WARNINGS["eviction_volatile" if policy.lower().startswith("volatile-") else "eviction_allkeys"]
    return WARNINGS["eviction"].format(policy=policy, maxmemory=maxmemory, what=what)


def refused(exc: BaseException) -> bool:
    """The server (or a cluster client, from the server's command table)
    says this command doesn't exist here, or that this user may not run it."""
    text = str(exc).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text or "no permissions to run" in text


def function_missing(exc: BaseException) -> bool:
    """The Functions library is not loaded (never, or flushed since)."""
    return isinstance(exc, ResponseError) and "function not found" in str(exc).lower()


class _Unavailable(Exception):
    """A backend can't serve this server: try the next one."""

    def __init__(self, backend: BackendName, cause: BaseException) -> None:
        super().__init__(backend, cause)
        self.backend = backend
        self.cause = cause


class Engine:
    """Sends one operation on the backend in use, and finds that backend:
    on first use, and again when a reply says it is gone (a failover to a
    node without the module, FUNCTION FLUSH, a restart)."""

    def __init__(self, forced: Optional[BackendName], cluster: Any = None, wait: Optional[Args] = None) -> None:
        if forced is not None and forced not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (or None to detect it)")
        self.forced = forced
        # WAIT numreplicas timeout, pipelined behind every operation that
        # can take a token or a slot (None: off).
        self.wait = wait
        self.backend: Optional[BackendName] = forced
        # A cluster client (sync or asyncio), to send each FCALL to its key's node.
        self._cluster = cluster
        self._retryable: tuple[type[Exception], ...] = cluster.ERRORS_ALLOW_RETRY if cluster is not None else ()
        # Whether the Functions library on the server (every primary of a
        # Cluster) is known to be this package's copy, and whether a call
        # is finding out (checking, or loading it) right now.
        self._library_checked = False
        self._library_checking = False
        # Whether the server's eviction settings were looked at (once, by
        # detect(): the Lua library can't warn of them as the module does).
        self.memory_checked = False

    def call(self, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None, after: Args = ()) -> Plan[Any]:
        """Sends `op` on its groups (a lease operation: on its key and head,
        with the groups as its buckets; a quota's operation for a quota),
        `after` behind them (WAIT max_ms), and returns the reply."""
        if lease is None:
            op = wire_op(op, groups, after)
        backend = self.backend
        if backend is not None:
            try:
                return (yield from self._send(backend, op, groups, lease, after))
            except _Unavailable as gone:
                if self.forced:
                    raise NoBackendError([(backend, gone.cause)]) from gone.cause
                log.warning("rate limiter: the %s backend is gone (%s), detecting again", backend, gone.cause)
                self.backend = None
                # The node found next (after a failover) may hold another
                # library, or none: check it again there.
                self._library_checked = False
        return (yield from self._detect(op, groups, lease, after))

    def check_memory(self) -> Plan[None]:
        """Logs the module's warning where the server can evict the
        limiter's keys (maxmemory-policy other than noeviction, with a
        maxmemory); an ACL or a managed service that refuses CONFIG leaves
        it unsaid."""
        self.memory_checked = True
        try:
            policy = config_value((yield ("CONFIG", "GET", "maxmemory-policy")))
            maxmemory = config_value((yield ("CONFIG", "GET", "maxmemory")))
        except Exception as exc:  # NOPERM, an unknown (renamed) command, a timeout: only a warning is lost
            log.debug("rate limiter: CONFIG GET refused (%s): eviction settings not checked", exc)
            return
        warning = eviction_warning(policy, int(maxmemory or 0))
        if warning is not None:
            log.warning("%s", warning)

    def _detect(self, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead], after: Args) -> Plan[Any]:
        # The call itself is the probe: a refusal means nothing ran.
        failures: list[tuple[str, BaseException]] = []
        for name in BACKENDS:
            try:
                reply = yield from self._send(name, op, groups, lease, after)
            except _Unavailable as exc:
                failures.append((name, exc.cause))
                continue
            except ReplicasBehind:
                self.backend = name  # it ran the write: the replicas are what lag
                raise
            self.backend = name
            log.info("rate limiter: using the %s backend", name)
            return reply
        raise NoBackendError(failures)

    def _send(
        self, backend: BackendName, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead], after: Args
    ) -> Plan[Any]:
        if op in ("adjust", "qadjust") and groups[0][2] > 0:
            # A refund: run twice, it would mint. The transport sends it
            # again only where it provably never reached Redis.
            return (yield from _once(self._send_as(backend, op, groups, lease, after)))
        return (yield from self._send_as(backend, op, groups, lease, after))

    def _send_as(
        self, backend: BackendName, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead], after: Args
    ) -> Plan[Any]:
        if backend == "module":
            try:
                return (yield from self._sent(op, module_args(op, groups, lease, after)))
            except Exception as exc:
                if refused(exc):
                    raise _Unavailable(backend, exc) from exc
                raise
        if backend == "functions":
            return (yield from self._fcall(op, groups, lease, after))
        return (yield from self._eval(op, eval_args(op, groups, lease, after)))

    def _sent(self, op: Op, args: Args) -> Plan[Any]:
        """Sends an operation's command; with WAIT pipelined behind it when
        the operation can take a token or a slot. Fewer replicas than asked
        behind a write that admitted is Redis failing (ReplicasBehind); a
        denial wrote nothing, and stands."""
        wait = self.wait
        if wait is None or op not in WRITES:
            return (yield args)
        reply, acknowledged = yield Waited(args, wait)
        if int(acknowledged) < int(wait[1]) and isinstance(reply, list) and reply and reply[0] == 1:
            raise ReplicasBehind(
                f"{acknowledged} of {wait[1]} replicas acknowledged the write within {wait[2]} ms (WAIT)"
            )
        return reply

    def _fcall(self, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead], after: Args) -> Plan[Any]:
        if self._library_checking:
            # Another call is checking or loading the library right now: a
            # burst of first calls (or of calls after FUNCTION FLUSH) must
            # not each load it, since every FUNCTION LOAD compiles it while
            # Redis waits. The EVAL script needs no loading and answers the
            # same.
            return (yield from self._eval(op, eval_args(op, groups, lease, after)))
        args = fcall_args(op, groups, lease, after)
        key = lease[0] if lease is not None else groups[0][0]
        if not self._library_checked:
            self._library_checking = True
            try:
                yield from self._check_library()
            finally:
                self._library_checking = False
        try:
            return (yield from self._to_key_node(op, args, key))
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("functions", exc) from exc
            if not function_missing(exc):
                raise
        self._library_checking = True
        try:
            yield from self._load_library()
        finally:
            self._library_checking = False
        return (yield from self._to_key_node(op, args, key))

    def _check_library(self) -> Plan[None]:
        """Before the first FCALL: the library loaded (on every primary of a
        Cluster) must be this package's copy, as `tb_version` tells. None,
        an older one, or a foreign one (no `tb_version`) is replaced by it."""
        command: Command = ToNode(VERSION_ARGS, self._primaries()) if self._cluster is not None else VERSION_ARGS
        try:
            reply = yield command
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("functions", exc) from exc
            if not function_missing(exc):
                raise
            reply = None
        # A cluster client answers for several nodes with {node: reply}.
        replies = reply.values() if isinstance(reply, dict) else [reply]
        ours = library_version()
        if any((r.decode() if isinstance(r, bytes) else r) != ours for r in replies):
            yield from self._load_library()
        self._library_checked = True

    def _primaries(self) -> Any:
        """Every primary, as nodes: redis-py 8 asks a server for the keys of
        an FCALL sent to the "primaries" flag (COMMAND GETKEYS), not of one
        sent to nodes. An asyncio cluster client knows no node before its
        first command: the flag then."""
        nodes = self._cluster.get_primaries()
        return nodes or "primaries"

    def _load_library(self) -> Plan[None]:
        try:
            # REPLACE: idempotent when gateways race, or some Cluster
            # primaries have it already. A cluster client sends it to all.
            yield ("FUNCTION LOAD", "REPLACE", library_source())
        except ResponseError as exc:
            # Refused (Redis 6.2, an ACL without FUNCTION, a managed service
            # that disables it): the EVAL script needs no loading.
            raise _Unavailable("functions", exc) from exc
        self._library_checked = True

    def _to_key_node(self, op: Op, args: Args, key: KeyT) -> Plan[Any]:
        """Sends an FCALL, on a cluster client straight to the node of its
        first key. Left to itself, redis-py asks a server which arguments
        of an FCALL are keys (COMMAND GETKEYS) before each one: a second
        round trip per call. (TB.* and EVALSHA it parses itself.)"""
        node = self._node_of(key)
        if node is None:
            return (yield from self._sent(op, args))
        try:
            return (yield ToNode(args, node))
        except self._retryable:
            # redis-py retries these on a fresh slot map, but not for a
            # node given to it: let it.
            return (yield args)

    def _node_of(self, key: KeyT) -> Any:
        if self._cluster is None:
            return None
        try:
            return self._cluster.get_node_from_key(key)
        except Exception:  # no slot map yet: let redis-py find it
            return None

    def _eval(self, op: Op, tail: Args) -> Plan[Any]:
        script = eval_script()
        try:
            return (yield from self._sent(op, ("EVALSHA", script.sha, *tail)))
        except NoScriptError:
            pass  # not cached on this node (restart, failover, SCRIPT FLUSH)
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("eval", exc) from exc
            raise
        try:
            # EVAL runs the script and caches it for the next EVALSHA.
            return (yield from self._sent(op, ("EVAL", script.source, *tail)))
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("eval", exc) from exc
            raise


def _once(plan: Plan[T]) -> Plan[T]:
    """The plan, each command it yields marked `Once`."""
    try:
        command = next(plan)
        while True:
            try:
                reply = yield command if isinstance(command, Once) else Once(command)
            except Exception as exc:
                command = plan.throw(exc)
            else:
                command = plan.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
