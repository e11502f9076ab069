"""The suite runs against the installed wheel, and the wheel carries the
repository's Lua files byte for byte."""

from __future__ import annotations

import sys
from importlib import metadata, resources
from pathlib import Path

from tbservers import ROOT

import redis_tokenbucket
import redis_tokenbucket.asyncio
from redis_tokenbucket import _scripts

LUA = ROOT / "lua"
REPO_LUA = sorted([*LUA.glob("*.lua"), *LUA.glob("eval/*.lua")])


def test_imported_from_the_installed_package_not_the_source_tree():
    where = Path(redis_tokenbucket.__file__).resolve()
    assert Path(sys.prefix).resolve() in where.parents
    assert ROOT / "clients" / "python" / "src" not in where.parents


def test_packaged_lua_files_are_the_repositorys():
    packaged = resources.files("redis_tokenbucket").joinpath("lua")
    names = sorted(p.relative_to(LUA).as_posix() for p in REPO_LUA)
    assert "tb.lua" in names and any(n.startswith("eval/") for n in names)
    shipped = sorted(
        [f.name for f in packaged.iterdir() if f.name.endswith(".lua")]
        + [f"eval/{f.name}" for f in packaged.joinpath("eval").iterdir() if f.name.endswith(".lua")]
    )
    assert shipped == names
    for name in names:
        assert packaged.joinpath(*name.split("/")).read_bytes() == (LUA / name).read_bytes(), name


def test_every_eval_call_names_a_packaged_script():
    for op, call in _scripts.EVAL_CALLS.items():
        assert call.load().source == (LUA / "eval" / call.script).read_bytes(), op
    assert _scripts.library_source() == (LUA / "tb.lua").read_bytes()


def test_distribution_metadata():
    dist = metadata.distribution("redis-tokenbucket")
    assert dist.metadata["Requires-Python"] == ">=3.9"
    requires = dist.requires or []
    assert any(r.startswith("redis>=5") for r in requires)
    assert any(r.startswith("fastapi>=") and "extra == " in r for r in requires)
    assert resources.files("redis_tokenbucket").joinpath("py.typed").is_file()
    assert redis_tokenbucket.asyncio.Limiter.__module__ == "redis_tokenbucket.asyncio"
