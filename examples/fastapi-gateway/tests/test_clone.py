"""The example as its README tells a newcomer to run it: a fresh `git
clone` of this checkout (its commits, plus the uncommitted changes to
tracked files being tested), then the README's commands as written: `cd`,
`make install` (a venv of its own, the package from ../../clients/python,
uvicorn), and the uvicorn line. Only the Redis URL and the port are this
test's: a server with the module on a free port. About half a minute, most
of it pip."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import GatewayServer

sys.path.append(str(Path(__file__).resolve().parents[3] / "clients" / "python" / "tests"))
from tbservers import free_port

REPO = Path(__file__).resolve().parents[3]


def steps() -> list[str]:
    """The README's sh block that installs and starts the gateway, one command a line."""
    readme = (REPO / "examples" / "fastapi-gateway" / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```sh\n(.*?)^```$", readme, re.MULTILINE | re.DOTALL)
    block = next(b for b in blocks if "make install" in b)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_from_a_clean_clone_the_readme_installs_and_starts_the_gateway(server: GatewayServer, tmp_path: Path) -> None:
    if not server.with_module:
        return  # once is enough: the gateway finds either backend by itself
    root = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(root)], check=True)
    diff = subprocess.run(["git", "-C", str(REPO), "diff", "HEAD", "--binary"], check=True, capture_output=True).stdout
    if diff:
        subprocess.run(["git", "-C", str(root), "apply", "--binary", "-"], input=diff, check=True)
    # The steps as a newcomer's shell has them: no venv of the tests' own.
    # (Nor the make variables of the root `make test` that runs this.)
    unset = ("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PYTHON", "INSTALL_FLAGS", "VENV")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    cwd, port = root, free_port()
    for line in steps():
        if line.startswith("cd "):
            cwd = cwd / line[3:]
            continue
        if "uvicorn" not in line:
            subprocess.run(["sh", "-c", line], cwd=cwd, env=env, check=True, capture_output=True, timeout=600)
            continue
        command = line.replace("127.0.0.1:6379", f"127.0.0.1:{server.port}").replace("--port 8000", f"--port {port}")
        proc = subprocess.Popen(["sh", "-c", f"exec env {command}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline, answered = time.monotonic() + 30, None
            while time.monotonic() < deadline and answered is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as res:
                        answered = res.status
                except OSError:
                    assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "uvicorn exited"
                    time.sleep(0.2)
            assert answered == 200
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        return
    raise AssertionError("the README's block never starts uvicorn")
