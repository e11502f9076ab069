#!/usr/bin/env bash
# `make test-python`: the Python package as users get it. The wheel (built
# from the sdist by `make python-wheel`) goes into a fresh venv with only the
# given test dependencies, and the suite runs there against the servers of
# the root venv. `make test-python` runs it with the pinned set and with the
# newest versions the package's bounds allow.
#   scripts/test-python.sh NAME PACKAGE...    (venv: clients/python/.venv-wheel-NAME)
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
shift
venv=$PWD/clients/python/.venv-wheel-$name
wheels=("$PWD"/clients/python/dist/*.whl)
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$@" "${wheels[0]}[fastapi,local]"
echo "== $name: $("$venv/bin/python" - <<'PY'
from importlib.metadata import version
print(", ".join(f"{p} {version(p)}" for p in ("redis", "fastapi", "starlette", "fakeredis", "lupa")))
PY
)"
servers=$(cargo run -q --release -p testkit --no-default-features --bin tb-servers --)
cd clients/python
env $servers "$venv/bin/pytest" -q
