#!/usr/bin/env bash
# `make test-litellm`: the LiteLLM proxy hook against real proxies, on each
# litellm release given. Each release gets a venv of its own
# (clients/python/.venv-litellm-<version>, kept between runs: litellm is
# hundreds of MB), and the package from this checkout is installed over it.
#   scripts/test-litellm.sh "VERSION..." PACKAGE...   (PACKAGEs: the test tools)
# TB_LITELLM_SETUP_ONLY=1 makes the venvs and skips the tests (`make bench-litellm`).
set -euo pipefail
cd "$(dirname "$0")/.."
versions=$1
shift
for v in $versions; do
  venv=$PWD/clients/python/.venv-litellm-$v
  if [ ! -f "$venv/.installed" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "litellm[proxy]==$v" "$@"
    touch "$venv/.installed"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./clients/python >/dev/null
  if [ -n "${TB_LITELLM_SETUP_ONLY:-}" ]; then
    continue
  fi
  echo "== litellm $v"
  (cd clients/python && "$venv/bin/pytest" -q tests/test_litellm.py)
done
