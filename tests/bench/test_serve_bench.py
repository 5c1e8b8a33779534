"""`llumnix bench serve` against a real HTTP gateway (uvicorn in a thread) over an engine."""
from __future__ import annotations

import asyncio

from llumnix.bench.serve_bench import plan, run_load, summarize
from llumnix.gateway.inprocess import InProcessGateway
from tests.gateway.fake_backend import EngineBackend


def test_a_load_run_measures_ttft_tpot_and_every_inter_token_gap():
    reqs = plan(6, rate=50.0, arrival="gamma", cv=2.0, lengths="uniform", input_len=8, output_len=12,
                max_input=20, max_output=20, seed=3)
    with InProcessGateway(EngineBackend()) as url:
        records, duration = asyncio.run(run_load(url, "fake", reqs, show_progress=False))
    assert all(r.error is None for r in records), [r.error for r in records]
    for r, planned in zip(records, reqs, strict=True):
        assert r.num_output_tokens == planned.max_tokens  # ignore_eos: every token asked for
        # one gap per streamed chunk after the first; a chunk carries one token or more
        assert 1 <= len(r.itl_s) + 1 <= r.num_output_tokens and all(g >= 0 for g in r.itl_s)
        assert r.ttft_s is not None and r.e2e_s is not None
        assert abs(r.ttft_s + sum(r.itl_s) - r.e2e_s) < 0.5  # the gaps span first to last chunk
    s = summarize(records, duration)
    assert s["num_ok"] == 6
    gaps = sorted(g for r in records for g in r.itl_s)
    assert s["itl_s"]["max"] == gaps[-1] and s["itl_s"]["p50"] == gaps[(len(gaps) + 1) // 2 - 1]
