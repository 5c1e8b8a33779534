"""`llumnix serve --pace` as a real process: a request is answered, no sooner than the
latency model's steps allow, and `/metrics` counts the paced steps."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.cluster.serve_process import serve_process

pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_paced_server_answers_at_the_models_pace_and_counts_its_steps(tiny_model_dir, tmp_path):
    from llumnix.engine.pace import pace_model

    with serve_process(tiny_model_dir, tmp_path / "serve.log", "--instances", "1",
                       "--pace", "a10-llama7b-serving:2") as (url, _):
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        n = 12
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "paced", "max_tokens": n,
                                                        "ignore_eos": True}, timeout=60)
        took = time.perf_counter() - t0
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n
        # one prefill and n - 1 decodes of one sequence, each at least twice the A10's step
        model = pace_model("a10-llama7b-serving", 2.0)
        floor = (n - 1) * (model.decode_time(1, 1) + model.step_overhead_s)
        assert took >= floor, (took, floor)
        deadline = time.monotonic() + 10  # /metrics shows the instance's last status LlumSched has read
        while True:
            metrics = httpx.get(f"{url}/metrics").text
            if _counter(metrics, "llumnix:paced_steps_total") >= n or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert _counter(metrics, "llumnix:paced_steps_total") >= n
        assert "llumnix:pace_overrun_steps_total{" in metrics  # counted, whatever this machine's load
