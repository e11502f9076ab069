"""Build hook: puts the repository's Lua library, and the EVAL script built
from it, into the package.

The Lua library has one source, `lua/tb.lua` at the repository root; the
EVAL script is never committed but generated from it by `lua/gen_eval.py`.
The wheel gets both under `redis_tokenbucket/lua/`: `tb.lua` copied, and
`tb-eval.lua` written by running the generator at build time. An sdist
carries `lua/tb.lua` and `lua/gen_eval.py` (not the generated script), so a
wheel built from it, away from the repository, generates the script the
same way.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

LIBRARY = "tb.lua"
GENERATOR = "gen_eval.py"
# The name `make` gives it too (target/lua/tb-eval.lua).
EVAL_SCRIPT = "tb-eval.lua"


class LuaFilesHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        # An unpacked sdist has lua/ beside this file; a checkout has it two levels up.
        source = root / "lua" if (root / "lua").is_dir() else root.parent.parent / "lua"
        for name in (LIBRARY, GENERATOR):
            if not (source / name).is_file():
                raise RuntimeError(f"no {source / name}: build from the repository or its sdist")
        include = build_data["force_include"]
        if self.target_name != "wheel":
            for name in (LIBRARY, GENERATOR):
                include[str(source / name)] = f"lua/{name}"
            return
        # Written outside the tree, so a build leaves no stray copy behind.
        self._scratch = Path(tempfile.mkdtemp(prefix="redis-tokenbucket-lua-"))
        script = self._scratch / EVAL_SCRIPT
        # The generator's own interface (stdlib only, reads the tb.lua beside it).
        subprocess.run([sys.executable, str(source / GENERATOR), str(script)], check=True)
        include[str(source / LIBRARY)] = f"redis_tokenbucket/lua/{LIBRARY}"
        include[str(script)] = f"redis_tokenbucket/lua/{EVAL_SCRIPT}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
