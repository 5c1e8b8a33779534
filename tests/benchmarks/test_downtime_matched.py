"""downtime_matched.py's simulated world and its fit on a real run's step log, without Ray:
a short run of the matched scenario on a closed-form step model, and a synthetic real result."""
from __future__ import annotations

import pytest
from benchmarks.sim.downtime_matched import (
    SimScenario,
    _chunked_models,
    fit_latency,
    real_rows,
    real_steps,
    step_check,
)

from llumnix.bench.migration_bench import Arrivals
from llumnix.sim.latency import MigrationCost, ParametricLatencyModel

COST = MigrationCost(bytes_per_block=737280, bandwidth=5e8, stage_overhead_s=0.05, last_stage_overhead_s=0.002)
# prefill 0.1 s + 2 ms a token, decode 50 ms + 10 ms a sequence
MODEL = ParametricLatencyModel(0.1, 0.002, 0.0, 0.05, 0.01, 0.0, COST)


def run(chunked: int = 0, rate: float = 0.5, seed: int = 0, boundaries: bool = False) -> list[dict[str, float]]:
    sim = SimScenario(MODEL, Arrivals(rate, 256, 8), length=512, gap_s=0.5, num_migrations=12,
                      chunked=chunked, seed=seed, boundaries=boundaries)
    return sim.run()


def test_every_migration_commits_and_its_wait_adds_up():
    rows = run()
    assert len(rows) == 12
    for r in rows:
        parts = r["boundary"] + r["prefill"] + r["decode"] + r["idle"]
        assert parts == pytest.approx(r["wait"], abs=1e-9)
        assert r["downtime"] == pytest.approx(r["before_commit"] + r["wait"])
        assert r["decode"] == 0.0  # the simulator never leaves a committed request out of a decode step


def test_the_boundaries_variant_starts_each_migration_after_a_boundary_of_each_instance():
    sim = SimScenario(MODEL, Arrivals(1.5, 256, 8), length=512, gap_s=0.5, num_migrations=12, boundaries=True)
    rows = sim.run()
    assert len(rows) == 12 and rows != run(rate=1.5)
    for rep in sim.reports:  # its first stage began at a step boundary of its destination
        ends = {round(e, 9) for _, e, _ in sim.inst[rep.dst_instance_id].steps}
        assert round(rep.marks["first_stage"], 9) in ends


def test_the_simulated_side_is_deterministic_per_seed():
    assert run(seed=1) == run(seed=1)
    assert run(seed=1) != run(seed=2)


def test_the_paper_engine_waits_behind_prefills_and_chunked_prefill_does_not():
    unchunked, chunked = run(rate=1.5), run(chunked=128, rate=1.5)
    assert max(r["wait"] for r in unchunked) > 0.5  # behind a 256-token prefill (0.6 s) or more
    assert any(r["boundary_prefill"] for r in unchunked)
    assert all(r["prefill"] == 0.0 for r in chunked)  # every chunked step also decodes
    assert max(r["wait"] for r in chunked) < max(r["wait"] for r in unchunked)


def _step(t0: float, s: float, e: float, k: int, prefill: bool) -> tuple[float, float, int, float, int]:
    return (s - t0, e - t0, k, 0.0, int(prefill))


def test_the_fit_recovers_a_step_model_from_a_real_step_log():
    rows, t = [], 0.0
    for _ in range(4):  # four rows; the first (start-up prefills) is left out of the fit
        steps, s0 = [], t
        for k in (1, 2, 3):  # prefill steps of k 64-token prompts: 0.2 + 0.001 * tokens
            d = 0.2 + 0.001 * 64 * k
            steps.append(_step(s0, t, t + d, k, True))
            t += d + 0.002
        for b in (4, 5, 6, 7):  # decode steps: 0.03 + 0.01 * batch
            d = 0.03 + 0.01 * b
            steps.append(_step(s0, t, t + d, b, False))
            t += d + 0.002
        wait = {"downtime": 0.1, "before_commit": 0.01, "wait": 0.09, "boundary": 0.09, "prefill": 0.0,
                "decode": 0.0, "idle": 0.0, "boundary_prefill": 0.0, "num_prefill_steps": 0.0}
        rows.append({"t0": s0, "from": "src", "mode": "live", "wait": wait, "src_steps": steps, "dst_steps": []})
    result = {"rows": rows}
    assert len(real_steps(result)["src"]) == 21 and len(real_rows(result)) == 4
    model, info = fit_latency(result, 64, MODEL)
    assert info["prefill_s"] == pytest.approx([0.2, 0.001], abs=1e-6)
    assert info["decode_s"] == pytest.approx([0.03, 0.01], abs=1e-6)
    assert info["step_overhead_s"] == pytest.approx(0.002, abs=1e-6)
    assert model.prefill_time([128]) + model.step_overhead_s == pytest.approx(0.2 + 0.128 + 0.002, abs=1e-6)
    # the last stage: the real rows' median pause-to-commit (10 ms) less one block's copy
    assert model.migration.last_stage_overhead_s == pytest.approx(0.01 - COST.copy_time(1))
    assert model.migration.bandwidth == COST.bandwidth


def test_the_step_check_prices_each_kind_of_logged_step():
    # the closed-form model's own prices, logged with their shapes: every ratio is 1
    pre, dec = 0.1 + 0.002 * 200, 0.05 + 0.01 * 4
    mixed = 0.1 + 0.002 * 96 + (0.002 * 4) + 0.01 * 4  # a 96-token chunk beside 4 decodes
    steps = [(0.0, pre, 2, 0.0, 1, 200, 0), (1.0, 1.0 + dec, 4, 0.0, 0, 4, 4), (2.0, 2.0 + mixed, 4, 0.0, 1, 100, 4)]
    rows = [{"t0": 0.0, "from": "src", "src_steps": [], "dst_steps": []},
            {"t0": 10.0, "from": "src", "src_steps": steps, "dst_steps": []}]
    check = step_check({"rows": rows}, MODEL)
    for kind in ("prefill", "decode", "mixed"):
        assert check[kind]["n"] == 1 and check[kind]["median_measured_over_priced"] == pytest.approx(1.0)


def test_the_chunked_world_is_rescaled_on_its_own_mixed_and_decode_steps():
    # mixed steps at half the model's price, decode steps at 1.2x: prefill terms x0.5, decode x1.2
    mixed = 0.5 * (0.1 + 0.002 * 96 + 0.002 * 4 + 0.01 * 4)
    dec = 1.2 * (0.05 + 0.01 * 4)
    steps = [(1.0, 1.0 + mixed, 4, 0.0, 1, 100, 4), (2.0, 2.0 + dec, 4, 0.0, 0, 4, 4)]
    rows = [{"t0": 0.0, "from": "src", "src_steps": [], "dst_steps": []},
            {"t0": 10.0, "from": "src", "src_steps": steps, "dst_steps": []}]
    info: dict = {}
    models = _chunked_models({"sim": MODEL, "sim_boundaries": MODEL}, {"rows": rows}, info)
    assert info["chunked_rescale"] == {"prefill": pytest.approx(0.5), "decode": pytest.approx(1.2)}
    m = models["sim_boundaries"]
    assert (m.prefill_fixed_s, m.prefill_per_token_s) == (pytest.approx(0.05), pytest.approx(0.001))
    assert (m.decode_fixed_s, m.decode_per_seq_s) == (pytest.approx(0.06), pytest.approx(0.012))
    assert models["base"] is MODEL and _chunked_models({"sim": MODEL}, None, {}) == {"sim": MODEL}
