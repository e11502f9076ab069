"""LiteLLM proxies for the tests: `litellm --config` processes on free
loopback ports, offline (LITELLM_LOCAL_MODEL_COST_MAP, models answered by
`mock_response` or by the stub upstream, tbllmstub.py), each killed
afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import yaml
from tbservers import free_port

HERE = Path(__file__).resolve().parent
MASTER_KEY = "sk-master-test"
# Where the proxy's CLI is: beside the interpreter running the tests.
LITELLM = str(Path(sys.executable).with_name("litellm"))


def offline_env(**more: str) -> dict[str, str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", **more}
    env.pop("DATABASE_URL", None)
    return env


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer, see {log}")
        time.sleep(0.1)


class Stub:
    """The OpenAI-compatible upstream."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "stub.log"
        workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, str(HERE / "tbllmstub.py"), str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        wait_http(f"http://127.0.0.1:{self.port}/v1/chat/completions", self.proc, self.log, timeout=30)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop(self.proc)


def config(stub: Stub) -> dict[str, Any]:
    """The proxy's config.yaml: stub models "fast", "slow" (a 4 s stream)
    and "fail" (a 500), a mock_response model "capped", and the hook."""
    stubbed = [
        {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": stub.base, "api_key": "sk-stub"}}
        for name in ("fast", "slow", "fail")
    ]
    mocked = {"model_name": "capped", "litellm_params": {"model": "openai/gpt-4o", "mock_response": "capped reply"}}
    return {
        "model_list": [*stubbed, mocked],
        "litellm_settings": {"callbacks": ["redis_tokenbucket.litellm.hook"], "num_retries": 0},
        "general_settings": {"master_key": MASTER_KEY},
    }


class Proxy:
    """One `litellm --config` process."""

    def __init__(self, workdir: Path, cfg: dict[str, Any], rules: Optional[dict[str, Any]]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = workdir / "proxy.log"
        (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
        env = offline_env()
        if rules is not None:
            (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
            env["TB_LITELLM_RULES"] = str(workdir / "rules.yaml")
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [LITELLM, "--config", str(workdir / "config.yaml"), "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir,
            )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self) -> Proxy:
        wait_http(f"{self.url}/health/liveliness", self.proc, self.log)
        return self

    def stop(self) -> None:
        stop(self.proc)


def start_proxies(workdir: Path, cfg: dict[str, Any], rules: list[Optional[dict[str, Any]]]) -> list[Proxy]:
    """Proxies started together (each takes seconds to import LiteLLM),
    then waited for; all are stopped if one fails. A proxy's rules of None
    leave TB_LITELLM_RULES unset."""
    proxies = [Proxy(workdir / f"proxy{i}", cfg, r) for i, r in enumerate(rules)]
    try:
        for p in proxies:
            p.wait()
    except BaseException:
        for p in proxies:
            p.stop()
        raise
    return proxies


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def chat(model: str, user: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "user": user, "messages": [{"role": "user", "content": "say hello"}], **more}


AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
