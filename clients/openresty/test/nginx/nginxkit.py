"""Real nginx for the tests and the bench: Debian's nginx with
libnginx-mod-http-lua, run from a temporary prefix on a free loopback
port, never as the system service, stopped afterwards.

`Nginx` runs a configuration made here (the module's tests);
`Gateway` runs examples/nginx-gateway/run.sh as a user would. Both are
shared by clients/openresty/test/nginx, examples/nginx-gateway/tests and
examples/nginx-gateway/bench (which put this directory on sys.path).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
LIB = ROOT / "clients" / "openresty" / "lib"
GATEWAY = ROOT / "examples" / "nginx-gateway"
NGINX = os.environ.get("NGINX") or shutil.which("nginx") or "/usr/sbin/nginx"
MODULES = Path("/usr/lib/nginx/modules")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def load_modules() -> str:
    """The load_module lines Debian's nginx needs for lua-nginx-module
    (none for OpenResty, which has it built in)."""
    version = subprocess.run([NGINX, "-V"], capture_output=True, text=True).stderr
    if "lua-nginx-module" in version:
        return ""
    lines = []
    if (MODULES / "ndk_http_module.so").exists():
        lines.append(f"load_module {MODULES / 'ndk_http_module.so'};")
    lines.append(f"load_module {MODULES / 'ngx_http_lua_module.so'};")
    return "\n".join(lines)


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.headers}, {self.body[:200]!r})"


def request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None, body: Any = None, timeout: float = 10
) -> Response:
    """One request on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        hdrs = dict(headers or {})
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in hdrs.items():
            conn.putheader(name, value)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        res = conn.getresponse()
        out = res.read()
        return Response(res.status, {k.lower(): v for k, v in res.getheaders()}, out)
    finally:
        conn.close()


def wait_http(port: int, proc: subprocess.Popen[bytes], log: Path, deadline_s: float = 15) -> None:
    """Until our nginx answers HTTP on `port`. Another process may take a
    free port between its choice and nginx's bind (other suites run at
    the same time): only an answer from nginx, with ours still running,
    counts."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited ({proc.returncode}): {log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5) as s:
                s.sendall(b"GET /__probe HTTP/1.0\r\nHost: x\r\n\r\n")
                if b"\r\nServer: nginx" in s.recv(4096) and proc.poll() is None:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not answer on {port}: {log.read_text(errors='replace')[-3000:]}")


class Nginx:
    """nginx with `init` (init_by_lua), `locations` and `http` (more http
    directives), `workers` worker processes, from a temporary prefix.
    `files` are written into the prefix's conf/ (on lua_package_path)."""

    def __init__(
        self,
        init: str,
        locations: str,
        *,
        workers: int = 2,
        http: str = "",
        files: dict[str, str] | None = None,
        main: str = "",
    ) -> None:
        self.init, self.locations, self.workers, self.http, self.main = init, locations, workers, http, main
        self.files = files or {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.prefix = Path(tempfile.mkdtemp(prefix="tb-nginx."))

    @property
    def error_log(self) -> Path:
        return self.prefix / "error.log"

    def conf(self) -> str:
        p = self.prefix
        return f"""
{load_modules()}
{self.main}
worker_processes {self.workers};
error_log {p}/error.log info;
pid {p}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {p}/tmp/body; proxy_temp_path {p}/tmp/proxy; fastcgi_temp_path {p}/tmp/fastcgi;
    uwsgi_temp_path {p}/tmp/uwsgi; scgi_temp_path {p}/tmp/scgi;
    lua_package_path "{LIB}/?.lua;{p}/conf/?.lua;;";
    lua_shared_dict tokenbucket 1m;
    {self.http}
    init_by_lua_block {{
{self.init}
    }}
    server {{
        listen 127.0.0.1:{self.port};
        default_type text/plain;
{self.locations}
    }}
}}
"""

    def start(self) -> Nginx:
        (self.prefix / "conf").mkdir(exist_ok=True)
        (self.prefix / "tmp").mkdir(exist_ok=True)
        self.prefix.chmod(0o755)  # workers may run as nobody under a root master
        for name, text in self.files.items():
            (self.prefix / "conf" / name).write_text(text)
        for _ in range(5):
            self.port = free_port()
            (self.prefix / "conf" / "nginx.conf").write_text(self.conf())
            self.error_log.write_text("")
            out = (self.prefix / "stderr.log").open("wb")
            self.proc = subprocess.Popen(
                [NGINX, "-p", str(self.prefix), "-c", str(self.prefix / "conf" / "nginx.conf"), "-g", "daemon off;"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                wait_http(self.port, self.proc, self.error_log)
                return self
            except RuntimeError:
                if "Address already in use" not in self.error_log.read_text(errors="replace"):
                    self.stop()
                    raise
                self.stop()
        raise RuntimeError("nginx could not bind a free port")

    def get(self, path: str, headers: dict[str, str] | None = None, timeout: float = 10) -> Response:
        return request(self.port, "GET", path, headers, timeout=timeout)

    def log_lines(self, text: str) -> list[str]:
        return [line for line in self.error_log.read_text(errors="replace").splitlines() if text in line]

    def worker_pids(self) -> set[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return {int(x) for x in out.split()}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.prefix, ignore_errors=True)


class Gateway:
    """examples/nginx-gateway/run.sh on a free port, configured by `env`
    (GATEWAY_* variables), as a user runs it."""

    def __init__(self, env: dict[str, str], workers: int = 2) -> None:
        self.env = {**os.environ, "GATEWAY_WORKERS": str(workers), "GATEWAY_LOG_LEVEL": "info", **env}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="tb-gateway.", suffix=".log")[1])

    def start(self) -> Gateway:
        for _ in range(5):
            self.port = free_port()
            with self.log.open("wb") as out:
                self.proc = subprocess.Popen(
                    ["bash", str(GATEWAY / "run.sh"), str(self.port)], env=self.env, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            try:
                wait_http(self.port, self.proc, self.log)
                return self
            except RuntimeError:
                self.stop()
                if "Address already in use" not in self.log.read_text(errors="replace"):
                    raise
        raise RuntimeError("the gateway could not bind a free port")

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, body: Any = None) -> Response:
        return request(self.port, method, path, headers, body)

    def log_lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text(errors="replace").splitlines() if text in line]

    def stop(self) -> None:
        """SIGTERM to run.sh, which stops its nginx and removes its prefix."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def cleanup(self) -> None:
        self.stop()
        self.log.unlink(missing_ok=True)
