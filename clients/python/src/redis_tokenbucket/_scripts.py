"""How each operation is spelled on each backend, and the Lua it needs.

The Lua files are the repository's `lua/tb.lua` and `lua/eval/*.lua`,
copied into the package when the wheel is built (hatch_build.py). This is
the one place that knows their names: when the EVAL scripts change shape,
only `EVAL_CALLS` below changes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Literal

Op = Literal["consume", "peek", "adjust", "mconsume"]

# The module's commands.
COMMANDS: dict[Op, str] = {
    "consume": "TB.CONSUME",
    "peek": "TB.PEEK",
    "adjust": "TB.ADJUST",
    "mconsume": "TB.MCONSUME",
}

# The Functions library (lua/tb.lua): function names; FCALL_RO for the
# read-only one, so it also runs on replicas.
LIBRARY_FILE = "tb.lua"
FUNCTIONS: dict[Op, tuple[str, str]] = {
    "consume": ("FCALL", "tb_consume"),
    "peek": ("FCALL_RO", "tb_peek"),
    "adjust": ("FCALL", "tb_adjust"),
    "mconsume": ("FCALL", "tb_mconsume"),
}


class LuaMissing(RuntimeError):
    """The package was installed without its Lua files (not from a wheel or
    sdist built by its own build hook)."""


@cache
def lua_source(path: str) -> bytes:
    """A packaged Lua file, `path` relative to the package's lua/ folder."""
    try:
        return resources.files(__package__).joinpath("lua", *path.split("/")).read_bytes()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise LuaMissing(f"redis_tokenbucket has no lua/{path}: install it from a built wheel") from exc


@dataclass(frozen=True)
class EvalCall:
    """An operation through EVALSHA: the script (under lua/eval/) and any
    arguments that go before the operation's own, ahead of ARGV."""

    script: str
    leading_args: tuple[str, ...] = ()
    source: bytes = field(init=False, repr=False, compare=False, default=b"")
    sha: str = field(init=False, repr=False, compare=False, default="")

    def load(self) -> EvalCall:
        """This call with its script read and hashed (read lazily, so that
        importing the package never touches the files)."""
        if not self.sha:
            source = lua_source(f"eval/{self.script}")
            object.__setattr__(self, "source", source)
            object.__setattr__(self, "sha", hashlib.sha1(source).hexdigest())
        return self


# Operation -> EVAL script. Today one generated script per operation
# (lua/gen_eval.py); a single dispatching script would be e.g.
# EvalCall("tb.lua", ("consume",)) for each.
EVAL_CALLS: dict[Op, EvalCall] = {
    "consume": EvalCall("consume.lua"),
    "peek": EvalCall("peek.lua"),
    "adjust": EvalCall("adjust.lua"),
    "mconsume": EvalCall("mconsume.lua"),
}


def library_source() -> bytes:
    return lua_source(LIBRARY_FILE)
