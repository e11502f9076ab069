"""Build hook: puts the repository's Lua files into the package.

The Lua library has one source, `lua/` at the repository root. Every
`*.lua` there and in `lua/eval/` goes into the wheel under
`redis_tokenbucket/lua/`, whatever the files are called, so adding or
renaming an EVAL script needs no change here. An sdist carries its own copy
in `lua/`, so a wheel can be built from it away from the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PATTERNS = ("*.lua", "eval/*.lua")


class LuaFilesHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        # An unpacked sdist has lua/ beside this file; a checkout has it two levels up.
        source = root / "lua" if (root / "lua").is_dir() else root.parent.parent / "lua"
        files = sorted(f for pattern in PATTERNS for f in source.glob(pattern))
        if not any(f.name == "tb.lua" and f.parent == source for f in files):
            raise RuntimeError(f"no Lua library at {source / 'tb.lua'}: build from the repository or its sdist")
        prefix = "redis_tokenbucket/lua" if self.target_name == "wheel" else "lua"
        for f in files:
            build_data["force_include"][str(f)] = f"{prefix}/{f.relative_to(source).as_posix()}"
