#!/usr/bin/env bash
# Release test: what `make dist` packs, and what `make install` puts under a
# PREFIX, installs and loads on a fresh server. For each tree: Debian's
# redis-server loads the module from it (MODULE LIST name tb, ver from
# Cargo.toml, INFO tb_version), TB.CONSUME answers; its tb.lua loads with
# FUNCTION LOAD and FCALL tb_consume answers; its EVAL script loads with
# SCRIPT LOAD, EVALSHA answers, and gen_eval.py --check finds it current.
# The tarball also has to match its .sha256 and hold one top directory with
# the install tree's files; a DESTDIR install has the same files.
#
#   make test-dist                       # builds the tarball first
#   bash tests/dist.sh target/dist/redis-tokenbucket-<version>-linux-<arch>.tar.gz
#
# Needs redis-server and redis-cli (make deps). Takes a few seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVER="${TB_REDIS_SERVER:-/usr/bin/redis-server}"
VERSION=$(awk -F'"' '/^\[/ { p = ($0 == "[package]") } p && /^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")
NAME="redis-tokenbucket-$VERSION-linux-$(uname -m)"
TARBALL="${1:-$ROOT/target/dist/$NAME.tar.gz}"
TARBALL="$(cd "$(dirname "$TARBALL")" && pwd)/$(basename "$TARBALL")"
# MODULE LIST's ver: major * 10000 + minor * 100 + patch, as src/lib.rs says.
IFS=.- read -r MAJOR MINOR PATCH _ <<<"$VERSION"
VER=$(( MAJOR * 10000 + MINOR * 100 + PATCH ))

SO=lib/redis/modules/libredis_tokenbucket.so
LIB=share/redis-tokenbucket/lua/tb.lua
EVAL=share/redis-tokenbucket/lua/tb-eval.lua
DOC=share/doc/redis-tokenbucket
RESTY=share/lua/5.1/resty

fail() { echo "dist test: $*" >&2; exit 1; }
[ -x "$SERVER" ] || fail "no $SERVER (make deps)"
[ -f "$TARBALL" ] || fail "no $TARBALL (make dist)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tb-dist.XXXXXX")
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# Starts the server with the tree's module on a free loopback port; retries
# a few ports in case another process takes the one picked in between.
start_server() {
  local module=$1 log=$2
  for _ in 1 2 3 4 5; do
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$TMP" --logfile "$log" \
      --save '' --appendonly no --loadmodule "$module" &
    SERVER_PID=$!
    for _ in $(seq 100); do
      cli PING >/dev/null 2>&1 && return 0
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.05
    done
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  done
  cat "$log" >&2 2>/dev/null || true
  fail "redis-server did not start with $module"
}
stop_server() {
  cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}
cli() { redis-cli -p "$PORT" "$@"; }
# Compares a reply (redis-cli's one line per element) with the expected lines.
expect() {
  local what=$1 got=$2; shift 2
  local want; want=$(printf '%s\n' "$@")
  [ "$got" = "$want" ] || fail "$what: expected $(echo "$want" | paste -sd' ') but got $(echo "$got" | paste -sd' ')"
}

# Every relative link of the installed Markdown names a file the tree
# holds (a link to a source folder, examples/nginx-gateway say, names no
# file, and is left to the repository).
check_links() {
  local doc=$1 label=$2
  python3 - "$doc" "$ROOT" <<'PY' || fail "$label: the installed docs link to files it does not hold"
import os, re, sys
doc, root = sys.argv[1], sys.argv[2]
missing = []
for base, _, names in os.walk(doc):
    for name in names:
        if not name.endswith(".md"):
            continue
        path = os.path.join(base, name)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", open(path, encoding="utf-8").read()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            installed = os.path.normpath(os.path.join(base, target))
            source = os.path.join(root, os.path.relpath(installed, doc))
            if not os.path.exists(installed) and not os.path.isdir(source):
                missing.append(f"{os.path.relpath(path, doc)} -> {target}")
for m in missing:
    print("dist test: missing link target:", m, file=sys.stderr)
sys.exit(1 if missing else 0)
PY
}

# The OpenResty module: `require "resty.tokenbucket.*"` from LuaJIT's
# share/lua/5.1, its Lua library the one the tree's tb.lua is.
check_resty() {
  local dir=$1 label=$2
  [ -f "$dir/$RESTY/tokenbucket.lua" ] || fail "$label: $RESTY/tokenbucket.lua missing"
  command -v luajit >/dev/null || { echo "dist test: no luajit, the OpenResty module's files only"; return 0; }
  local version
  version=$(LUA_PATH="$dir/share/lua/5.1/?.lua" luajit -e \
    'local lib = require "resty.tokenbucket.library"; local c = require "resty.tokenbucket.contract"
     assert(lib.version == c.LIBRARY_VERSION, "library.lua and contract.lua disagree"); io.write(lib.version)') \
    || fail "$label: the OpenResty module does not load from $RESTY"
  grep -q "^local LIBRARY_VERSION = '$version'$" "$dir/$LIB" || fail "$label: the OpenResty library is not $LIB"
}

# Everything a tree must hold and serve; $1 is its root, $2 a label.
check_tree() {
  local dir=$1 label=$2
  for f in "$SO" "$LIB" "$EVAL" "$DOC/README.md" "$DOC/CHANGELOG.md" \
           "$DOC/docs/commands.md" "$DOC/docs/fallback.md" "$DOC/docs/operations.md"; do
    [ -f "$dir/$f" ] || fail "$label: $f missing"
  done
  [ -x "$dir/$SO" ] || fail "$label: $SO is not executable (Redis 7 refuses it)"
  grep -q "^## \[$VERSION\]" "$dir/$DOC/CHANGELOG.md" || fail "$label: CHANGELOG.md has no entry for $VERSION"
  python3 "$ROOT/lua/gen_eval.py" --check "$dir/$EVAL" || fail "$label: $EVAL is not current"
  check_links "$dir/$DOC" "$label"
  check_resty "$dir" "$label"

  start_server "$dir/$SO" "$TMP/$label.log"
  # Flat MODULE LIST reply: name, tb, ver, N, path, P, args, ...
  local list; list=$(cli MODULE LIST)
  expect "$label: MODULE LIST" "$(echo "$list" | awk 'p == "name" || p == "ver" || p == "path" { print } { p = $0 }')" \
    tb "$VER" "$dir/$SO"
  expect "$label: INFO tb" "$(cli INFO tb | tr -d '\r' | sed -n 's/^tb_version://p')" "$VERSION"
  expect "$label: TB.CONSUME" "$(cli TB.CONSUME m 10 1 1)" 1 9 0 1000

  expect "$label: FUNCTION LOAD" "$(cli -x FUNCTION LOAD <"$dir/$LIB")" tb
  expect "$label: FCALL tb_consume" "$(cli FCALL tb_consume 1 f 10 1 1)" 1 9 0 1000

  local sha; sha=$(cli -x SCRIPT LOAD <"$dir/$EVAL")
  # redis-cli -x appends no newline, so the server hashes the file as is.
  expect "$label: SCRIPT LOAD" "$sha" "$(sha1sum <"$dir/$EVAL" | cut -d' ' -f1)"
  expect "$label: EVALSHA consume" "$(cli EVALSHA "$sha" 1 k consume 10 1 1)" 1 9 0 1000
  stop_server
  echo "dist test: $label: files, module $VERSION (ver $VER), TB.CONSUME, FCALL and EVALSHA ok"
}
files() { (cd "$1" && find . -type f | sort); }

# The tarball: checksum, one top directory, then the tree itself.
(cd "$(dirname "$TARBALL")" && sha256sum --quiet -c "$(basename "$TARBALL").sha256") \
  || fail "$TARBALL does not match its .sha256"
tops=$(tar -tzf "$TARBALL" | cut -d/ -f1 | sort -u)
[ "$tops" = "$NAME" ] || fail "$TARBALL: top directories are '$(echo "$tops" | paste -sd' ')', not $NAME"
mkdir "$TMP/dist"
tar -xzf "$TARBALL" -C "$TMP/dist"
check_tree "$TMP/dist/$NAME" tarball

# make install, to a PREFIX and to a DESTDIR: the same files as the tarball.
make -C "$ROOT" --no-print-directory -s install PREFIX="$TMP/prefix"
check_tree "$TMP/prefix" "make-install"
[ "$(files "$TMP/prefix")" = "$(files "$TMP/dist/$NAME")" ] \
  || fail "make install and the tarball hold different files: $(diff <(files "$TMP/prefix") <(files "$TMP/dist/$NAME") | paste -sd' ')"
make -C "$ROOT" --no-print-directory -s install DESTDIR="$TMP/destdir" PREFIX=/opt/tb
[ "$(files "$TMP/destdir/opt/tb")" = "$(files "$TMP/prefix")" ] \
  || fail "make install DESTDIR=... holds different files from PREFIX=..."
echo "dist test: $(basename "$TARBALL") and make install (PREFIX, DESTDIR) ok"
