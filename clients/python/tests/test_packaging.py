"""The suite runs against the installed wheel; the wheel carries the
repository's Functions library byte for byte, and the EVAL script that
`lua/gen_eval.py` builds from it; the sdist carries what builds them."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from importlib import metadata, resources
from pathlib import Path

import pytest
from tbservers import ROOT

import redis_tokenbucket
import redis_tokenbucket.asyncio
from redis_tokenbucket import _contract, _scripts

LUA = ROOT / "lua"
GEN_EVAL = LUA / "gen_eval.py"
SDISTS = ROOT / "clients" / "python" / "dist"


@pytest.fixture
def packaged_lua() -> Iterator[Path]:
    """The package's lua/ folder as a real directory."""
    with resources.as_file(resources.files("redis_tokenbucket").joinpath("lua")) as folder:
        yield folder


def gen_eval_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GEN_EVAL), "--check", str(path)], capture_output=True, text=True)


def test_imported_from_the_installed_package_not_the_source_tree():
    where = Path(redis_tokenbucket.__file__).resolve()
    assert Path(sys.prefix).resolve() in where.parents
    assert ROOT / "clients" / "python" / "src" not in where.parents


def test_the_version_is_the_projects_one_in_cargo_toml():
    package = ""
    for line in (ROOT / "Cargo.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith("["):
            package = line.strip()
        elif package == "[package]" and line.startswith("version"):
            assert metadata.version("redis-tokenbucket") == line.split("=", 1)[1].strip().strip('"')
            return
    pytest.fail("no [package] version in Cargo.toml")


def test_the_package_carries_the_library_and_the_eval_script(packaged_lua: Path):
    assert sorted(p.name for p in packaged_lua.iterdir()) == [_scripts.EVAL_FILE, _scripts.LIBRARY_FILE]


def test_packaged_library_is_the_repositorys(packaged_lua: Path):
    assert (packaged_lua / "tb.lua").read_bytes() == (LUA / "tb.lua").read_bytes()
    assert _scripts.library_source() == (LUA / "tb.lua").read_bytes()


def test_the_library_states_the_packages_version():
    """What the library's tb_version answers is the version the package
    checks servers against: the project's, then a hash of the library's
    code (contract/gen.py stamps it), as the generated contract says."""
    version = _scripts.library_version()
    assert version == _contract.LIBRARY_VERSION
    assert version.startswith(metadata.version("redis-tokenbucket") + "+")


def test_packaged_eval_script_is_what_gen_eval_writes(packaged_lua: Path, tmp_path: Path):
    checked = gen_eval_check(packaged_lua / _scripts.EVAL_FILE)
    assert checked.returncode == 0, checked.stderr
    # The check can fail: one byte off, and it says so.
    stale = tmp_path / "stale.lua"
    stale.write_bytes((packaged_lua / _scripts.EVAL_FILE).read_bytes() + b"\n")
    assert gen_eval_check(stale).returncode == 1


def test_the_client_sends_the_packaged_eval_script(packaged_lua: Path):
    script = _scripts.eval_script()
    assert script.source == (packaged_lua / _scripts.EVAL_FILE).read_bytes()
    assert script.sha == hashlib.sha1(script.source).hexdigest()


def test_sdist_carries_the_library_and_its_generator():
    """A wheel built from the sdist, away from the repository, generates the
    EVAL script from these two (`make test-python` installs such a wheel)."""
    sdists = sorted(SDISTS.glob("redis_tokenbucket-*.tar.gz"))
    if not sdists:
        pytest.skip(f"no sdist in {SDISTS}: `make test-python` builds one")
    with tarfile.open(sdists[-1]) as sdist:
        # Members are <name>-<version>/<path>.
        members = {m.name.split("/", 1)[-1]: m for m in sdist.getmembers()}
        lua = {path[len("lua/") :]: m for path, m in members.items() if path.startswith("lua/")}
        assert sorted(lua) == ["gen_eval.py", "tb.lua"]
        for name, member in lua.items():
            carried = sdist.extractfile(member)
            assert carried is not None and carried.read() == (LUA / name).read_bytes(), name


def test_distribution_metadata():
    dist = metadata.distribution("redis-tokenbucket")
    assert dist.metadata["Requires-Python"] == ">=3.10"
    requires = dist.requires or []
    # The redis-py range, with an upper bound: `make test-python`
    # runs the suite on its oldest and its newest.
    (redis_py,) = [r for r in requires if r.startswith("redis") and "extra" not in r]
    assert sorted(redis_py.removeprefix("redis").replace(" ", "").split(",")) == ["<9", ">=5.0.8"], redis_py
    assert any(r.startswith("fastapi>=") and "extra == " in r for r in requires)
    assert resources.files("redis_tokenbucket").joinpath("py.typed").is_file()
    assert redis_tokenbucket.asyncio.Limiter.__module__ == "redis_tokenbucket.asyncio"


def test_the_installed_contract_is_the_repositorys():
    """The package's bounds and messages are contract/contract.json's, as
    contract/gen.py writes them: a copy that drifted fails here (and
    `make lint` fails on the repository's copy)."""
    contract = json.loads((ROOT / "contract" / "contract.json").read_text())
    limits = {name: spec["value"] for name, spec in contract["limits"].items()}
    for name, value in limits.items():
        assert getattr(_contract, name.upper()) == float(value), name
    for name, template in contract["errors"].items():
        filled = re.sub(r"\{(\w+)\}", lambda m: limits.get(m.group(1), m.group(0)), template)
        assert _contract.ERRORS[name] == filled, name
    assert set(_contract.ERRORS) == set(contract["errors"])
    # The Bucket's checks speak those messages.
    with pytest.raises(redis_tokenbucket.InvalidArgument) as bad:
        redis_tokenbucket.Bucket(0, 1)
    assert "ERR " + str(bad.value) == _contract.message("max_out_of_range")
