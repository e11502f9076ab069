#!/usr/bin/env bash
# `make test-python`: the Python package as users get it. The wheel (built
# from the sdist by `make python-wheel`) goes into a fresh venv with only the
# test tools, and the suite runs there against the servers of the root venv.
#   scripts/test-python.sh VENV_DIR PACKAGE...   (the test tools to install)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1
shift
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$@" "$(ls "$PWD"/clients/python/dist/*.whl)[fastapi,local]"
servers=$(cargo run -q --release -p testkit --no-default-features --bin tb-servers --)
cd clients/python
env $servers "$OLDPWD/$venv/bin/pytest" -q
