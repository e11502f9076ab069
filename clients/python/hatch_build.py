"""Build hooks: the package's version is the project's, from the
repository's Cargo.toml; and the repository's Lua library, and the EVAL
script built from it, go into the package.

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
from hatchling.metadata.plugin.interface import MetadataHookInterface

LIBRARY = "tb.lua"
GENERATOR = "gen_eval.py"
# The name `make` gives it too (target/lua/tb-eval.lua).
EVAL_SCRIPT = "tb-eval.lua"


def repository_file(root: Path, name: str) -> Path:
    """`name` at the repository's root, or beside this file in an unpacked
    sdist, which carries its own copy."""
    here = root / name
    return here if here.exists() else root.parent.parent / name


class CargoVersionHook(MetadataHookInterface):
    """The version of Cargo.toml's [package]: one version for the module,
    its releases and this package."""

    PLUGIN_NAME = "custom"

    def update(self, metadata: dict[str, Any]) -> None:
        cargo = repository_file(Path(self.root), "Cargo.toml")
        section = ""
        for line in cargo.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[package]" and line.startswith("version"):
                metadata["version"] = line.split("=", 1)[1].strip().strip('"')
                return
        raise RuntimeError(f"no [package] version in {cargo}")


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
            include[str(repository_file(root, "Cargo.toml"))] = "Cargo.toml"
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
