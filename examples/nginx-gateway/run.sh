#!/usr/bin/env bash
# The nginx gateway example: examples/nginx-gateway/run.sh [PORT]
#
# Runs nginx in the foreground from a temporary prefix on 127.0.0.1:PORT
# (default 8080), with GATEWAY_WORKERS worker processes (default 2), never
# as the system service; Ctrl-C stops it. It reads GATEWAY_REDIS_URL,
# GATEWAY_API_KEYS, GATEWAY_LIMITS and the other GATEWAY_* variables as
# the FastAPI example does (README.md). NGINX names another nginx binary
# (OpenResty's, say); GATEWAY_LOG_LEVEL the error log's level (notice).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PORT="${1:-8080}"
WORKERS="${GATEWAY_WORKERS:-2}"
NGINX="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"
LIB="$ROOT/clients/openresty/lib"

[[ "$PORT" =~ ^[0-9]+$ ]] || { echo "usage: $0 [PORT]" >&2; exit 2; }
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "GATEWAY_WORKERS must be a number >= 1" >&2; exit 2; }
[ -x "$NGINX" ] || { echo "no nginx: make test installs nginx and libnginx-mod-http-lua" >&2; exit 1; }

# The module carries the Lua library it loads into Redis, generated from
# lua/tb.lua (as `make` does); made here when missing or older than its sources.
LIBRARY="$LIB/resty/tokenbucket/library.lua"
for source in "$ROOT/lua/tb.lua" "$ROOT/lua/gen_eval.py" "$ROOT/clients/openresty/gen_library.py"; do
  if [ ! -f "$LIBRARY" ] || [ "$source" -nt "$LIBRARY" ]; then
    python3 "$ROOT/clients/openresty/gen_library.py" "$LIBRARY"
    break
  fi
done

# Debian's nginx loads lua-nginx-module as a dynamic module; OpenResty has it built in.
LOAD_MODULES=""
if ! "$NGINX" -V 2>&1 | grep -q "lua-nginx-module"; then
  for dir in /usr/lib/nginx/modules /usr/share/nginx/modules /usr/local/nginx/modules; do
    if [ -f "$dir/ngx_http_lua_module.so" ]; then
      [ -f "$dir/ndk_http_module.so" ] && LOAD_MODULES="load_module $dir/ndk_http_module.so;"
      LOAD_MODULES="$LOAD_MODULES"$'\n'"load_module $dir/ngx_http_lua_module.so;"
      break
    fi
  done
  [ -n "$LOAD_MODULES" ] || { echo "no ngx_http_lua_module.so: install libnginx-mod-http-lua" >&2; exit 1; }
fi

REAL_IP=""
IFS=',' read -ra PROXIES <<< "${GATEWAY_TRUSTED_PROXIES:-}"
for p in "${PROXIES[@]}"; do
  p="$(echo "$p" | tr -d '[:space:]')"
  [ -n "$p" ] && REAL_IP="$REAL_IP    set_real_ip_from $p;"$'\n'
done

PREFIX="$(mktemp -d "${TMPDIR:-/tmp}/nginx-gateway.XXXXXX")"
mkdir -p "$PREFIX/conf" "$PREFIX/logs" "$PREFIX/tmp"
# Workers may run as another user (nobody, under a root master): they reach
# the stub model's socket in here.
chmod 755 "$PREFIX"
cleanup() { rm -rf "$PREFIX"; }
trap cleanup EXIT

python3 - "$HERE/nginx.conf.in" "$PREFIX/conf/nginx.conf" <<PY
import sys
text = open(sys.argv[1]).read()
values = {
    "LOAD_MODULES": """$LOAD_MODULES""",
    "WORKERS": "$WORKERS",
    "PORT": "$PORT",
    "PREFIX": "$PREFIX",
    "LUA_PATH": "$LIB/?.lua;$HERE/lua/?.lua",
    "REAL_IP": """$REAL_IP""",
    "LOG_LEVEL": "${GATEWAY_LOG_LEVEL:-notice}",
}
for name, value in values.items():
    text = text.replace("@" + name + "@", value)
open(sys.argv[2], "w").write(text)
PY

"$NGINX" -t -q -p "$PREFIX" -c "$PREFIX/conf/nginx.conf" -g "daemon off;"
echo "nginx gateway on http://127.0.0.1:$PORT ($WORKERS workers, Redis at ${GATEWAY_REDIS_URL:-redis://127.0.0.1:6379/0}); Ctrl-C stops it" >&2
"$NGINX" -p "$PREFIX" -c "$PREFIX/conf/nginx.conf" -g "daemon off;" &
NGINX_PID=$!
# Ctrl-C reaches nginx too (one process group): it stops at once. A TERM
# sent to this script is passed on.
trap 'kill -TERM "$NGINX_PID" 2>/dev/null || true' TERM INT
wait "$NGINX_PID" || wait "$NGINX_PID" || true
