from __future__ import annotations

import json
from pathlib import Path

import pytest

from llumnix.sim import calibration as cal
from llumnix.sim.calibration_report import calibration_report, write_report
from llumnix.sim.latency import fit_a10_llama7b, get_latency_model
from llumnix.sim.profile import ProfileError, load_profile


def test_a10_preset_is_within_5_percent_of_every_anchor():
    rows = calibration_report()
    assert len(rows) == 5 * len(cal.SEQ_LENS)
    bad = [(r.quantity, r.seq_len, round(r.error_pct, 1)) for r in rows if abs(r.error_pct) > 5.0]
    assert not bad, bad


def test_a10_decode_lands_in_the_papers_serving_band():
    m = fit_a10_llama7b()
    # a typical serving batch: ~10 sequences, ~10k context tokens, plus prefill stalls
    step = m.decode_time(10, 10_000)
    assert cal.SERVING_DECODE_BAND_S[0] * 0.8 < step < cal.SERVING_DECODE_BAND_S[1]
    assert m.migration.copy_time(512) == pytest.approx(512 * 8 * 2**20 / 15e9)
    # the serving preset: the same step times plus the serving work of each step
    serving = get_latency_model("a10-llama7b-serving")
    assert serving.step_overhead_s == cal.SERVING_STEP_OVERHEAD_S > 0
    assert serving.decode_time(10, 10_000) == step
    assert cal.SERVING_DECODE_BAND_S[0] < step + serving.step_overhead_s < cal.SERVING_DECODE_BAND_S[1]


def test_configs_without_a_model_get_the_serving_preset():
    from llumnix.sim.config import parse_config

    doc = {"systems": {"rr": {"dispatch": "round-robin"}}, "traces": [{"name": "S", "kind": "S-S", "rates": [1]}]}
    assert parse_config(doc).latency_model == "a10-llama7b-serving"
    assert parse_config({**doc, "latency_model": "a10-llama7b"}).latency_model == "a10-llama7b"


def test_committed_calibration_table_is_current(tmp_path):
    rows = write_report(tmp_path)
    fresh = json.loads((tmp_path / "calibration.json").read_text())
    assert len(fresh) == len(rows)
    committed = Path(__file__).resolve().parents[2] / "benchmarks" / "sim" / "calibration.json"
    try:
        with open(committed) as f:
            old = json.load(f)
    except FileNotFoundError:
        pytest.skip("benchmarks/sim/calibration.json not written yet")
    assert [round(r["model_ms"], 3) for r in old] == [round(r["model_ms"], 3) for r in fresh]


def test_profile_model_loads_and_interpolates(tmp_path):
    m = get_latency_model(str(Path(__file__).parent / "data" / "tiny_profile.json"))
    assert m.prefill_time([16]) == pytest.approx(0.010)
    assert m.prefill_time([100, 100]) == pytest.approx(0.030 + (200 - 128) / (512 - 128) * 0.060)
    assert m.decode_time(1, 0) == pytest.approx(0.020)
    assert m.decode_time(8, 4096) == pytest.approx(0.040)
    assert 0.020 < m.decode_time(4, 2048) < 0.040
    assert m.migration.stage_time(10, is_last=True, num_request_blocks=100) == pytest.approx(
        0.002 + 10 * 65536 / 1e9 + 0.004 + 100 * 1e-5)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "llumnix-sim-profile/1", "prefill": {}}))
    with pytest.raises(ProfileError, match="missing field"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "nope.json")


def test_profile_can_give_the_last_stage_its_own_fixed_cost(tmp_path):
    doc = json.loads((Path(__file__).parent / "data" / "tiny_profile.json").read_text())
    doc["migration"]["last_stage_overhead_s"] = 0.0005
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    mig = get_latency_model(str(p)).migration
    copy = 10 * 65536 / 1e9
    assert mig.stage_time(10, is_last=False, num_request_blocks=100) == pytest.approx(0.002 + copy)
    assert mig.stage_time(10, is_last=True, num_request_blocks=100) == pytest.approx(
        0.0005 + copy + 0.004 + 100 * 1e-5)


def test_profile_extrapolation_never_goes_down(tmp_path):
    """Rows monotone at the knots can cross past the last context knot: batch 1's row
    grows faster with context than batch 2's, and extrapolating in batch along the
    falling segment went negative (CI: a 64-sequence step at 10,000 tokens took -1.49 s).
    Past the last knot of either axis the latency stays at least the last knot's."""
    doc = json.loads((Path(__file__).parent / "data" / "tiny_profile.json").read_text())
    doc["decode"] = {"batch_sizes": [1, 2], "context_tokens": [0, 100], "latency_s": [[1.0, 2.0], [1.1, 2.0]]}
    doc["prefill"] = {"num_tokens": [16, 64], "latency_s": [0.02, 0.01]}  # a dip: noise, or hand-written
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    m = load_profile(p)
    # Inside the grid it is the table.
    assert m.decode_time(2, 50) == pytest.approx(1.55)
    # Past it, each row keeps growing with context, and more sequences than the last knot
    # take at least what the last knot takes.
    assert m.decode_time(1, 10_000) > m.decode_time(1, 100) and m.decode_time(2, 10_000) > m.decode_time(2, 100)
    assert m.decode_time(64, 10_000) >= m.decode_time(2, 10_000) > 0
    assert m.prefill_time([4000]) == pytest.approx(0.01)


def _contended_model(tmp_path, factors):
    doc = json.loads((Path(__file__).parent / "data" / "tiny_profile.json").read_text())
    if factors is not None:
        doc["contention"] = {"neighbor_factor": factors}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    return load_profile(p)


def test_profile_contention_factors_load_and_default_to_none(tmp_path):
    m = _contended_model(tmp_path, {"prefill": 1.05, "decode": 1.2})
    assert (m.contention.prefill, m.contention.decode) == (1.05, 1.2)
    assert _contended_model(tmp_path, None).contention.is_neutral
    with pytest.raises(ProfileError, match="neighbor_factor"):
        _contended_model(tmp_path, {"decode": 0})


def _batch(is_prefill, n=1):
    from llumnix.core.batch import ScheduledRequest, SchedulerOutput
    from llumnix.core.sampling_params import SamplingParams

    entries = [ScheduledRequest(f"r{i}", [1] * 16 if is_prefill else [1], 0 if is_prefill else 16, [0, 1],
                                SamplingParams(), 0, 0 if is_prefill else 1) for i in range(n)]
    return SchedulerOutput(entries, is_prefill=is_prefill)


def test_a_step_started_while_another_instance_steps_pays_the_neighbor_factor(tmp_path):
    from llumnix.sim.executor import HostSteps, SimExecutor

    m = _contended_model(tmp_path, {"prefill": 1.05, "decode": 1.2})
    host = HostSteps()
    a, b = SimExecutor(m, host), SimExecutor(m, host)
    alone = a.execute(_batch(False)).elapsed          # nobody else stepping
    assert alone == pytest.approx(m.decode_time(1, 17))
    assert b.execute(_batch(False)).elapsed == pytest.approx(1.2 * alone)   # a is mid-step
    a.step_done()
    b.step_done()
    assert host.num_stepping == 0
    assert a.execute(_batch(True)).elapsed == pytest.approx(m.prefill_time([16]))
    assert b.execute(_batch(True)).elapsed == pytest.approx(1.05 * m.prefill_time([16]))
    b.step_done()
    b.step_done()  # idempotent: an instance removed after its step ended
    assert host.num_stepping == 1
    # A model without factors never counts (the A10 preset, older profiles).
    plain = SimExecutor(_contended_model(tmp_path, None), host)
    assert plain.execute(_batch(False)).elapsed == pytest.approx(alone)
    assert host.num_stepping == 1


def test_every_step_pays_the_models_serving_overhead(tmp_path):
    """``step_overhead_s`` (the serving loop's own work) is added to every prefill and
    decode step, before the neighbor factor; 0 (the default) adds nothing."""
    import dataclasses

    from llumnix.sim.executor import HostSteps, SimExecutor

    m = _contended_model(tmp_path, {"prefill": 1.05, "decode": 1.2})
    assert m.step_overhead_s == 0.0 and fit_a10_llama7b().step_overhead_s == 0.0
    slow = dataclasses.replace(m, step_overhead_s=0.004)
    host = HostSteps()
    a, b = SimExecutor(slow, host), SimExecutor(slow, host)
    assert a.execute(_batch(False)).elapsed == pytest.approx(m.decode_time(1, 17) + 0.004)
    assert b.execute(_batch(True)).elapsed == pytest.approx(1.05 * (m.prefill_time([16]) + 0.004))
    a.step_done()
    b.step_done()
    assert a.execute(_batch(True)).elapsed == pytest.approx(m.prefill_time([16]) + 0.004)


def test_every_sequence_of_a_step_pays_the_models_per_sequence_overhead():
    """``seq_overhead_s`` is paid once per sequence in the batch, prefill and decode,
    beside the per-step overhead; 0 (the default) adds nothing."""
    import dataclasses

    from llumnix.sim.executor import SimExecutor

    m = fit_a10_llama7b()
    assert m.seq_overhead_s == 0.0
    slow = dataclasses.replace(m, step_overhead_s=0.004, seq_overhead_s=0.0005)
    ex = SimExecutor(slow)
    assert ex.execute(_batch(False, 3)).elapsed == pytest.approx(m.decode_time(3, 3 * 17) + 0.004 + 3 * 0.0005)
    assert ex.execute(_batch(True, 2)).elapsed == pytest.approx(m.prefill_time([16, 16]) + 0.004 + 2 * 0.0005)
    assert SimExecutor(m).execute(_batch(False, 3)).elapsed == pytest.approx(m.decode_time(3, 3 * 17))


def test_a_mixed_step_pays_the_prefill_chunk_and_the_decodes_marginal_cost():
    """Chunked prefill: decodes beside a chunk add their tokens' linear cost and the decode
    model's per-sequence and KV-read terms; the step's fixed cost is paid once. A chunk
    after the first pays prefill(end) - prefill(start), as a cached prefix does."""
    from llumnix.core.batch import ScheduledRequest, SchedulerOutput
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.sim.executor import SimExecutor

    m = fit_a10_llama7b()
    sp = SamplingParams()
    decodes = [ScheduledRequest(f"d{i}", [1], 99, [0], sp, 0, 1) for i in range(3)]
    chunk = ScheduledRequest("c", [1] * 256, 512, [0], sp, 0, 0, sample=False)
    ex = SimExecutor(m)
    alone = ex.execute(SchedulerOutput([chunk], is_prefill=True)).elapsed
    assert alone == pytest.approx(m.prefill_time([768]) - m.prefill_time([512]) + m.prefill_time(()))
    mixed = ex.execute(SchedulerOutput([*decodes, chunk], is_prefill=True, num_decodes=3)).elapsed
    marginal = (m.prefill_time([1, 1, 1]) - m.prefill_time(())) + (m.decode_time(3, 300) - m.decode_time(0, 0))
    assert mixed == pytest.approx(alone + marginal)
    # cheaper than the two steps an unchunked engine would run
    assert alone < mixed < alone + ex.execute(SchedulerOutput(decodes, is_prefill=False)).elapsed
