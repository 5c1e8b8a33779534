"""A real `llumnix serve`, started with a vLLM command line from a clean environment,
says what it does while it starts, answers as vLLM would, and the command it prints
attaches a second gateway from another clean environment (Ray's token found, not
inherited from this test process, whose own ray.init sets RAY_* variables)."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from llumnix.cluster.startup import free_port

BIN = Path(sys.executable).parent
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "


def clean_env() -> dict[str, str]:
    """What a new shell has: no RAY_*, no LLUMNIX_*, nothing this test process set."""
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}


def read_until(proc: subprocess.Popen, pattern: str, timeout_s: float, seen: list[str]) -> re.Match[str]:
    """The first stdout line matching ``pattern`` (every line read goes into ``seen``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = proc.lines.get(timeout=1.0)  # type: ignore[attr-defined]
        except queue.Empty:
            continue
        assert line, "".join(seen)[-3000:]  # "": the process closed its output
        seen.append(line)
        if m := re.search(pattern, line):
            return m
    pytest.fail(f"no line matching {pattern!r} in {timeout_s:g} s:\n" + "".join(seen)[-3000:])


@contextlib.contextmanager
def started(argv: list[str]):
    # SIGINT as a terminal's foreground job has it (a backgrounded `make test` passes it on ignored)
    proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # a thread blocked in readline: select on the pipe would miss lines already in Python's buffer
    proc.lines = queue.Queue()  # type: ignore[attr-defined]

    def read() -> None:
        for line in proc.stdout:
            proc.lines.put(line)  # type: ignore[attr-defined]
        proc.lines.put("")  # type: ignore[attr-defined]

    threading.Thread(target=read, daemon=True).start()
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.tiny_model import save_tiny_llama

    d = tmp_path_factory.mktemp("tiny-startup-model")
    save_tiny_llama(d)
    return d


@pytest.mark.slow
def test_a_vllm_command_line_starts_serve_and_its_printed_command_attaches_a_gateway(tiny_model, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    port, lines = free_port(), []
    argv = [str(BIN / "llumnix"), "serve", str(tiny_model), "--served-model-name", "tiny", "--max-model-len",
            "256", "--dtype", "float32", "--seed", "1", "--chat-template", str(template), "--enforce-eager",
            "--gpu-memory-utilization", "0.9", "--max-num-seqs", "8", "--max-num-batched-tokens", "64",
            "--no-enable-prefix-caching", "--enable-chunked-prefill", "--disable-log-requests",
            "--uvicorn-log-level", "warning", "--port", str(port), "--instances", "1", "--kv-cache-mib", "4"]
    with started(argv) as serve:
        attach = read_until(serve, r"attach another gateway with: (llumnix gateway .*)$", 240, lines).group(1)
        read_until(serve, r"instance 1 of 1 loaded in \d+\.\d s", 240, lines)
        read_until(serve, r"ready in \d+\.\d s: http://127\.0\.0\.1:\d+/v1", 240, lines)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/version").json()["version"]
        (model,) = httpx.get(f"{url}/v1/models").json()["data"]
        assert (model["id"], model["root"], model["max_model_len"]) == ("tiny", str(tiny_model), 256)
        ids = httpx.post(f"{url}/tokenize", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert ids.status_code == 200 and bytes(ids.json()["tokens"]) != b""  # rendered by our template
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        g_port = free_port()
        gw_argv = shlex.split(attach)
        gw_argv[0] = str(BIN / gw_argv[0])
        gw_argv[gw_argv.index("--port") + 1] = str(g_port)
        with started(gw_argv) as gateway:
            read_until(gateway, r"ready in \d+\.\d s", 240, lines)
            r = httpx.post(f"http://127.0.0.1:{g_port}/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    text = "".join(lines)
    assert "--gpu-memory-utilization has no effect on cpu: each instance's KV cache is --kv-cache-mib (4 MiB)" in text
    assert text.index("Ray started") < text.index("instance 1 of 1 loading") < text.index("ready in")
    assert "Traceback" not in text
