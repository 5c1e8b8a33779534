"""`llumnix serve` as a real process: SIGTERM (what Kubernetes sends) stops it taking new
requests and lets a running stream finish before it exits."""
from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.cluster.serve_process import serve_process

pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("grace", [30.0, 0.1])
def test_sigterm_lets_a_running_stream_finish_within_the_grace_then_exits(tiny_model_dir, tmp_path, grace):
    """With the default grace the stream gets every token; with 0.1 s it is cut (its 480
    tokens take about a second here) and the server still exits."""
    with serve_process(tiny_model_dir, tmp_path / "serve.log", "--instances", "1",
                       "--shutdown-grace", str(grace)) as (url, proc):
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        # logprobs: 0 names every streamed token, so they are counted however many a chunk
        # carries (a stream that falls behind gets the tokens queued for it as one chunk).
        body = {"model": name, "prompt": "last words", "max_tokens": 480, "ignore_eos": True,
                "temperature": 0, "stream": True, "logprobs": 0}
        chunks, tokens, done = 0, 0, False
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
                        tokens += len(json.loads(line[6:])["choices"][0]["logprobs"]["tokens"])
                        if chunks == 3:
                            proc.send_signal(signal.SIGTERM)
                    elif line == "data: [DONE]":
                        done = True
        except httpx.HTTPError:
            assert grace < 1  # only a short grace cuts the stream
        if grace > 1:
            assert done and tokens == 480  # every token, after the signal too
        else:
            assert not done and 3 <= tokens < 480
        with pytest.raises(httpx.HTTPError):  # no new requests once it stops
            httpx.get(f"{url}/health", timeout=2)
        proc.wait(timeout=30)
