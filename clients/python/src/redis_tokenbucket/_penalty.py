"""The penalty (rate-limiter-flexible's `blockDuration`): a denied caller
is refused for `block` seconds, built on TB.ADJUST's debt. On a denial the
bucket is charged what lengthens the denial's wait to `block`:
`rate * (block - retry_after)` tokens, so a call of the same cost passes
`block` seconds after the denial, whatever else it would have waited.

The module floors a balance at `-max`, and a call of cost `c` passes once
the balance is back at `c`: from the floor that takes `(max + c) / rate`
seconds, the longest block the bucket can hold. A longer one is refused
when it is written. The Node package's twin is penalty.ts.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Optional

from ._bucket import Bucket, InvalidArgument, number
from ._decision import Decision


def longest_block(bucket: Bucket, cost: float) -> float:
    """Seconds a call of `cost` waits from the floor, `-max`, to `cost`."""
    return (bucket.max + cost) / bucket.rate


def check_block(block: Any, bucket: Any, cost: float) -> Optional[float]:
    """`block` (seconds, or None: no penalty) checked against what the
    bucket's floor can hold for a call of `cost`."""
    if block is None:
        return None
    seconds = number(block, "block")
    if seconds <= 0:
        raise InvalidArgument("block", f"block must be > 0 seconds, got {block!r}")
    if not isinstance(bucket, Bucket):
        raise InvalidArgument("block", "block needs a Bucket: a Quota's period ends when it ends")
    bound = longest_block(bucket, cost)
    if seconds > bound:
        raise InvalidArgument(
            "block",
            f"block {seconds:g} s is longer than this bucket can hold: TB.ADJUST's debt stops at -max, "
            f"so a call of cost {cost:g} waits at most (max + cost) / rate = {bound:g} s",
        )
    return seconds


def penalty(decision: Decision, block: float) -> float:
    """The tokens to charge for this decision: 0 unless Redis denied it
    now (not admitted, shadow, cached, shed or made up by the failure
    policy) and the bucket is not in debt already (a block running: its
    denials must not lengthen it)."""
    if decision.allowed or decision.shadow or decision.cached or decision.shed or decision.degraded:
        return 0.0
    if decision.remaining < 0 or not isinstance(decision.bucket, Bucket):
        return 0.0
    wait = block - decision.retry_after_ms / 1000
    return decision.bucket.rate * wait if wait > 0 else 0.0


def penalized(decision: Decision, adjusted: Decision, block: float) -> Decision:
    """The denial as the penalty left it: the balance and reset time
    TB.ADJUST answered, and the block's wait. A penalty whose TB.ADJUST
    failed (the failure policy answered) leaves the denial as it was."""
    if adjusted.degraded or adjusted.shed:
        return decision
    retry = max(decision.retry_after_ms, math.ceil(block * 1000))
    return replace(decision, remaining=adjusted.remaining, retry_after_ms=retry, reset_after_ms=adjusted.reset_after_ms)
