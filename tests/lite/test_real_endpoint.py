"""Lite mode in front of a real engine it does not own: our own `llumnix serve
--instances 1`, reached only over HTTP, behind `python -m llumnix.lite --engine-url`."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llumnix.cluster.startup import free_port
from tests.lite.conftest import wait_healthy

pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_model import save_tiny_llama

    d = tmp_path_factory.mktemp("tiny-lite-model")
    save_tiny_llama(d)
    return d


@pytest.fixture(scope="module")
def urls(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the engine's url, the lite gateway's url in front of it)."""
    logs = tmp_path_factory.mktemp("lite-logs")
    eng_port, lite_port = free_port(), free_port()
    procs = []
    try:
        eng_log = logs / "engine.log"
        procs.append(subprocess.Popen([sys.executable, "-m", "llumnix.cli", "serve", "--model", str(tiny_model_dir),
                                       "--instances", "1", "--port", str(eng_port), "--kv-cache-mib", "8"],
                                      stdout=eng_log.open("w"), stderr=subprocess.STDOUT))
        engine = f"http://127.0.0.1:{eng_port}"
        wait_healthy(engine, procs[0], eng_log)
        lite_log = logs / "lite.log"
        procs.append(subprocess.Popen([sys.executable, "-m", "llumnix.lite", "--engine-url", engine,
                                       "--model", str(tiny_model_dir), "--port", str(lite_port)],
                                      stdout=lite_log.open("w"), stderr=subprocess.STDOUT))
        lite = f"http://127.0.0.1:{lite_port}"
        wait_healthy(lite, procs[1], lite_log, 60)
        yield engine, lite
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_greedy_completions_through_lite_mode_equal_the_engines_own(urls):
    engine, lite = urls
    name = httpx.get(f"{lite}/v1/models").json()["data"][0]["id"]
    for prompt in ("The quick brown fox", "Once upon a time"):
        body = {"model": name, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        direct = httpx.post(f"{engine}/v1/completions", json=body, timeout=60).json()
        via = httpx.post(f"{lite}/v1/completions", json=body, timeout=60).json()
        assert via["choices"][0]["text"] == direct["choices"][0]["text"]
        assert via["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 12
    info = httpx.get(f"{lite}/admin/cluster").json()
    (inst,) = info["instances"]
    assert inst["kind"] == "llumnix"  # detected from its metrics: prompts go as token ids
    assert inst["health"]["state"] == "healthy" and inst["lrs"]["num_finished"] == 2
    # An honest engine's answers pass every check (ids, lines, usage, max_tokens) uncharged.
    assert info["gateway"]["engine_faults"] == {} and inst["health"]["failures_in_row"] == 0


def test_streamed_chat_through_lite_mode_equals_the_engines_own(urls):
    engine, lite = urls
    name = httpx.get(f"{lite}/v1/models").json()["data"][0]["id"]
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True, "stream": True}

    def text(url: str) -> str:
        import json

        out = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        out.append(c["delta"].get("content", ""))
        return "".join(out)

    assert text(lite) == text(engine)
    assert httpx.get(f"{lite}/admin/cluster").json()["gateway"]["engine_faults"] == {}
