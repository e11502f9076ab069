"""What a plan yields for the transport to send (`_engine`, `_requests`),
beyond a plain tuple of arguments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

from ._scripts import Args


class ToNode:
    """A command for the Cluster node the plan chose (`Engine._to_key_node`)."""

    __slots__ = ("args", "node")

    def __init__(self, args: Args, node: Any) -> None:
        self.args, self.node = args, node


class Once:
    """A command that would mint tokens if Redis ran it twice (a refund, a
    reset): the limiter's own connections send it again only where it
    provably never reached Redis. Any other command may go twice (a charge
    run twice only charges twice; a lease's acquire, renew and release are
    idempotent by its id)."""

    __slots__ = ("command",)

    def __init__(self, command: Union[Args, ToNode, Waited]) -> None:
        self.command = command


class Waited:
    """A command with `WAIT numreplicas timeout` pipelined behind it, on
    the same connection in one round trip (the limiter's `wait_replicas`):
    answered with both replies, `(reply, acknowledged)`."""

    __slots__ = ("command", "wait")

    def __init__(self, command: Args, wait: Args) -> None:
        self.command, self.wait = command, wait


def waited_reply(replies: Sequence[Any]) -> tuple[Any, Any]:
    """A Waited command's two replies, each read whole (an error reply
    as its exception): the command's error raised first, then WAIT's."""
    reply, acknowledged = replies
    for r in replies:
        if isinstance(r, BaseException):
            raise r
    return reply, acknowledged


Command = Union[Args, ToNode, Once, Waited]
