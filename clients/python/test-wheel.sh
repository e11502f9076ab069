#!/usr/bin/env bash
# Runs the package's suite from its built wheel, in a fresh venv with the
# given test dependencies: `make test-python` runs it with the pinned set and
# with the newest versions the package's bounds allow.
#
#   bash clients/python/test-wheel.sh NAME PACKAGE...
#
# The venv is clients/python/.venv-wheel-NAME; the wheel is the one in
# clients/python/dist/ (`make python-wheel`); the servers' paths come from
# the environment (TB_SERVER_*), as the Makefile passes them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="$1"
shift
venv="$here/.venv-wheel-$name"
wheels=("$here"/dist/*.whl)
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$@" "${wheels[0]}[fastapi]"
echo "== $name: $("$venv/bin/python" - <<'PY'
from importlib.metadata import version
print(", ".join(f"{p} {version(p)}" for p in ("redis", "fastapi", "starlette", "fakeredis")))
PY
)"
cd "$here"
"$venv/bin/pytest" -q
