from __future__ import annotations

import json

import numpy as np
import pytest

from llumnix.sim.workloads import (
    BURSTGPT_INPUT,
    SHAREGPT_OUTPUT,
    TraceError,
    TraceSpec,
    arrival_times,
    load_burstgpt,
    load_sharegpt,
    make_trace,
    power_law_lengths,
)


@pytest.mark.parametrize("mean,alpha", [(128, 2.0), (256, 1.5), (512, 1.15)])
def test_power_law_lengths_have_the_class_mean_and_the_cap(mean, alpha):
    x = power_law_lengths(np.random.default_rng(1), 200_000, mean, alpha)
    assert x.min() >= 1 and x.max() <= 6144
    assert x.mean() == pytest.approx(mean, rel=0.03)  # ceil adds ~0.5, the cap takes a little
    assert np.median(x) < mean  # heavy tailed


def test_dataset_like_lengths_match_the_published_statistics():
    t = make_trace(TraceSpec("s", "sharegpt", num_requests=100_000), 1.0, 0)
    assert t.output_lens.mean() == pytest.approx(SHAREGPT_OUTPUT.mean, rel=0.02)
    assert np.percentile(t.output_lens, 50) == pytest.approx(SHAREGPT_OUTPUT.p50, rel=0.02)
    assert np.percentile(t.output_lens, 99) == pytest.approx(SHAREGPT_OUTPUT.p99, rel=0.02)
    assert (t.prompt_lens + t.output_lens).max() < 12800
    b = make_trace(TraceSpec("b", "burstgpt", num_requests=100_000), 1.0, 0)
    assert b.prompt_lens.mean() == pytest.approx(BURSTGPT_INPUT.mean, rel=0.02)
    assert np.percentile(b.prompt_lens, 80) == pytest.approx(BURSTGPT_INPUT.p80, rel=0.02)
    assert b.prompt_lens.max() <= 6144 and b.output_lens.max() <= 6144


def test_arrivals_poisson_and_gamma_have_the_rate_and_burstiness():
    rng = np.random.default_rng(0)
    t = arrival_times(rng, 100_000, 4.0)
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)
    g = np.diff(arrival_times(rng, 100_000, 2.0, cv=4.0))
    assert 1 / g.mean() == pytest.approx(2.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(4.0, rel=0.1)
    with pytest.raises(TraceError):
        arrival_times(rng, 10, -1.0)


def test_same_seed_same_trace_and_rates_share_requests():
    spec = TraceSpec("m", "M-M", num_requests=500, high_priority_fraction=0.1)
    a, b = make_trace(spec, 7.6, 3), make_trace(spec, 7.6, 3)
    for k in ("arrival_times", "prompt_lens", "output_lens", "priorities"):
        assert np.array_equal(getattr(a, k), getattr(b, k))
    c = make_trace(spec, 3.8, 3)
    assert np.array_equal(a.prompt_lens, c.prompt_lens)
    assert np.allclose(c.arrival_times, 2 * a.arrival_times)
    assert not np.array_equal(make_trace(spec, 7.6, 4).prompt_lens, a.prompt_lens)
    assert 0.05 < a.priorities.mean() < 0.15


def test_loaders_read_real_files(tmp_path):
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 80}]},
        {"conversations": [{"from": "gpt", "value": "hi"}]},
    ]))
    ins, outs = load_sharegpt(sg)
    assert ins.tolist() == [100] and outs.tolist() == [20]
    bg = tmp_path / "bg.csv"
    bg.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "1,GPT-4,417,276,693,Conversation log\n2,ChatGPT,10,10,20,Conversation log\n"
                  "3,GPT-4,0,0,0,Conversation log\n4,GPT-4,9000,10,9010,Conversation log\n")
    ins, outs = load_burstgpt(bg)
    assert ins.tolist() == [417, 6144] and outs.tolist() == [276, 10]
    t = make_trace(TraceSpec("b", "burstgpt", num_requests=50, path=str(bg)), 1.0, 0)
    assert set(t.prompt_lens.tolist()) <= {417, 6144}
    with pytest.raises(TraceError, match="not found"):
        load_burstgpt(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="unknown trace kind"):
        TraceSpec("x", "X-Y")
