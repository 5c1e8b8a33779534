"""Lite mode's upstream key: `--engine-api-key`, or `$LLUMNIX_ENGINE_API_KEY` (so it need
not show in `ps`), sent to every `--engine-url` and to a config file's endpoints that name
none of their own."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import httpx
import pytest

from llumnix.cli import build_parser
from llumnix.cluster.startup import free_port
from llumnix.lite.backend import LiteBackend
from llumnix.lite.config import from_doc
from llumnix.lite.serve import lite_config
from tests.gateway.fake_backend import chatml_tokenizer
from tests.lite.conftest import FAST, gateway, wait_healthy


def test_the_key_from_the_environment_reaches_the_engine(engines, monkeypatch):
    engine = engines()
    monkeypatch.setenv("LLUMNIX_ENGINE_API_KEY", "upstream-secret")
    args = build_parser().parse_args(["serve", "--engine-url", engine.url, "--served-model-name", "fake-model"])
    cfg, _, name = lite_config(args)
    cfg = dataclasses.replace(cfg, **FAST)
    with gateway(LiteBackend(cfg, chatml_tokenizer(), name, vocab_size=258, max_model_len=4096)) as url:
        r = httpx.post(f"{url}/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 3},
                       timeout=30)
    assert r.status_code == 200, r.text
    assert engine.authorizations == ["Bearer upstream-secret"]


def test_the_flag_wins_over_the_environment_and_no_key_sends_none(monkeypatch):
    monkeypatch.setenv("LLUMNIX_ENGINE_API_KEY", "env")
    args = build_parser().parse_args(["serve", "--engine-url", "http://e:1", "--engine-api-key", "flag"])
    assert [e.api_key for e in lite_config(args)[0].pools[0].endpoints] == ["flag"]
    monkeypatch.delenv("LLUMNIX_ENGINE_API_KEY")
    args = build_parser().parse_args(["serve", "--engine-url", "http://e:1"])
    assert [e.api_key for e in lite_config(args)[0].pools[0].endpoints] == [None]


def test_a_config_files_own_key_is_kept():
    cfg = from_doc([{"name": "p", "endpoints": ["http://a:1", {"url": "http://b:1", "api_key": "own"}]}],
                   api_key="default")
    assert [e.api_key for e in cfg.pools[0].endpoints] == ["default", "own"]


@pytest.mark.slow
def test_a_lite_serve_sends_the_key_from_its_environment_and_exits_0_on_sigterm(engines, tmp_path):
    """The real command: `llumnix serve --engine-url` with $LLUMNIX_ENGINE_API_KEY set."""
    from tests.tiny_model import save_tiny_llama

    save_tiny_llama(tmp_path / "model")
    engine = engines()
    port = free_port()
    log = tmp_path / "lite.log"
    proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "serve", "--engine-url", engine.url, "--model",
                             str(tmp_path / "model"), "--served-model-name", "fake-model", "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "LLUMNIX_ENGINE_API_KEY": "from-env"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log)
        r = httpx.post(f"{url}/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 3},
                       timeout=30)
        assert r.status_code == 200, r.text
        assert engine.authorizations == ["Bearer from-env"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
