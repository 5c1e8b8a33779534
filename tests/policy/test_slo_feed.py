"""The slo predictor fed by the engines' own steps (issue 47): a step's shape as its
status carries it, the per-instance fit on the statuses' samples, and the simulator
driving the same road (Llumlet.on_step -> push -> GlobalScheduler.update_status)."""
from __future__ import annotations

import dataclasses

import pytest

from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import StepSample, step_sample
from llumnix.policy import FreenessConfig, GlobalScheduler, Llumlet, ReschedulingConfig, SchedulingConfig
from llumnix.policy.predictor import StepBatch, StepTimeModel, sample_features
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import SystemSpec
from llumnix.sim.runner import RunSpec, make_simulator
from llumnix.sim.workloads import TraceSpec
from tests.engine.helpers import make_engine
from tests.policy.snapshots import inst, run

SLO = SchedulingConfig.from_dict({"dispatch": {"policy": "slo"}})


def _steps(engine, llumlet: Llumlet, seconds: float = 0.02) -> list:
    batches = []
    while engine.has_unfinished_requests():
        engine.step()
        batches.append(engine.last_batch)
        llumlet.on_step(engine.last_batch, seconds)
    return batches


def test_a_whole_prefill_then_decodes_as_samples() -> None:
    eng = make_engine()
    eng.add_request("a", list(range(10)), SamplingParams(max_tokens=3))
    eng.add_request("b", list(range(6)), SamplingParams(max_tokens=3))
    batches = []
    while eng.has_unfinished_requests():
        eng.step()
        batches.append(step_sample(eng.last_batch, 0.01))
    assert batches[0] == StepSample(16, 10 * 10 + 6 * 6, 2, 0, 0, 0.01)
    # the first decode reads each prompt and its first token, and computes its second
    assert batches[1] == StepSample(0, 0, 0, 2, (10 + 1) + (6 + 1), 0.01)
    assert len(batches) == 3


def test_a_chunk_counts_its_attention_over_the_context_before_it() -> None:
    eng = make_engine(chunked=True, max_batched=8)
    eng.add_request("long", list(range(20)), SamplingParams(max_tokens=2))
    first = second = None
    while eng.has_unfinished_requests():
        eng.step()
        s = step_sample(eng.last_batch, 0.01)
        if first is None:
            first = s
        elif second is None:
            second = s
    assert first == StepSample(8, 64, 1, 0, 0, 0.01)
    assert second == StepSample(8, 16 * 16 - 8 * 8, 1, 0, 0, 0.01)


def test_a_mixed_step_counts_decodes_apart_from_the_chunk() -> None:
    eng = make_engine(chunked=True, max_batched=8)
    eng.add_request("short", [1, 2, 3], SamplingParams(max_tokens=5))
    eng.step()  # its prefill
    eng.add_request("long", list(range(20)), SamplingParams(max_tokens=2))
    eng.step()
    s = step_sample(eng.last_batch, 0.01)
    assert eng.last_batch.is_mixed
    assert (s.num_decode_seqs, s.num_context_tokens) == (1, 4)  # 3 prompt + 1 output token read
    assert (s.num_prefill_seqs, s.num_prefill_tokens, s.prefill_attention) == (1, 7, 49)


def test_sample_features_of_a_whole_prompt_are_the_batch_features() -> None:
    s = StepSample(300, 100 * 100 + 200 * 200, 2, 0, 0, 0.1)
    assert sample_features(s) == pytest.approx(StepBatch(prefill_lens=(100, 200)).features)
    d = StepSample(0, 0, 0, 7, 900, 0.1)
    assert sample_features(d) == pytest.approx(StepBatch(num_decode_seqs=7, num_context_tokens=900).features)


def test_push_carries_the_steps_since_the_last_push_once() -> None:
    eng = make_engine()
    ll = Llumlet("i0", eng, ReschedulingConfig(), FreenessConfig(), records_steps=True)
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    batches = _steps(eng, ll)
    first = ll.push(1.0)
    assert [s.seconds for s in first.step_samples] == [0.02] * len(batches) == [0.02] * 4
    assert ll.push(2.0).step_samples == ()  # an event: never twice
    assert ll.report(3.0).step_samples == ()


def _status(iid: str, t: float, samples: tuple[StepSample, ...]):
    return dataclasses.replace(inst(iid, running=[run(f"{iid}-r", 4)]), timestamp=t, step_samples=samples)


def test_each_instance_fits_its_own_model_on_its_samples() -> None:
    gs = GlobalScheduler(SLO)
    assert gs.slo is not None
    gs.add_instance(_status("slow", 0.0, ()))
    gs.add_instance(_status("fast", 0.0, ()))
    slow = tuple(StepSample(0, 0, 0, b, 100 * b, 0.05 + 0.002 * b) for b in range(1, 9)) * 20
    fast = tuple(dataclasses.replace(s, seconds=s.seconds / 4) for s in slow)
    for k in range(8):  # 20 samples a status, as a reader gets them
        gs.update_status(_status("slow", 1.0 + k, slow[20 * k:20 * k + 20]))
        gs.update_status(_status("fast", 1.0 + k, fast[20 * k:20 * k + 20]))
    pred = gs.slo
    assert pred.model("slow").num_observed == pred.model("fast").num_observed == 160
    assert pred.model("slow").decode_s(4, 400) == pytest.approx(0.058, rel=0.05)
    assert pred.model("fast").decode_s(4, 400) == pytest.approx(0.058 / 4, rel=0.05)
    assert pred.steps.num_observed == 0  # the seed stays the seed
    assert len(pred.step_log) == 320
    # each logged prediction was made before its step was fitted: the seed's first
    seed = StepTimeModel()
    assert pred.step_log[0] == (pytest.approx(seed.predict_features(sample_features(slow[0]))), slow[0], "slow")


def test_a_status_seen_again_fits_nothing() -> None:
    gs = GlobalScheduler(SLO)
    assert gs.slo is not None
    gs.add_instance(_status("i0", 0.0, ()))
    samples = (StepSample(0, 0, 0, 4, 400, 0.03),) * 5
    gs.update_status(_status("i0", 1.0, samples))
    gs.update_status(_status("i0", 1.0, samples))  # a channel's heartbeat resends the newest
    assert gs.slo.model("i0").num_observed == 5
    gs.remove_instance("i0")
    assert gs.slo.model("i0").num_observed == 0  # a new instance under the old id starts from the seed


def test_the_simulator_fits_the_predictor_on_every_step_it_runs() -> None:
    """The same road in the simulator: each SimInstance step reaches its llumlet, each push
    the predictor; the model seeded from the run's latency model stays within a few percent."""
    spec = RunSpec(SystemSpec("slo", "slo", enable_migration=True), TraceSpec("small", "S-S", num_requests=120),
                   10.0, 0, ClusterConfig(num_instances=2, num_blocks=120, max_model_len=4096),
                   "a10-llama7b-serving")
    sim = make_simulator(spec)
    sim.run()
    pred = sim.policy.gs.slo
    num_steps = sum(i.executor.num_steps for i in sim.cluster.instances.values())
    observed = sum(pred.model(i).num_observed for i in sim.cluster.instances)
    assert num_steps > 500 and observed >= 0.95 * num_steps  # all but those after the last push
    errs = sorted(abs(p / s.seconds - 1) for p, s, _ in pred.step_log)
    assert errs[len(errs) // 2] < 0.02 and errs[int(0.9 * len(errs))] < 0.05


def test_every_slo_record_carries_the_step_time_error() -> None:
    from llumnix.sim.runner import run_one

    r = run_one(RunSpec(SystemSpec("slo", "slo"), TraceSpec("small", "S-S", num_requests=60), 8.0, 0,
                        ClusterConfig(num_instances=2, num_blocks=120, max_model_len=4096), "a10-llama7b-serving"))
    err = r["slo_predictor"]
    assert err["num_steps"] > 100 and 0.0 <= err["step_rel_error_p50"] <= err["step_rel_error_p90"] < 0.05


def test_mixed_step_shortcut_agrees_with_the_features() -> None:
    m = StepTimeModel()
    s = StepSample(30, 10 * 10 + 20 * 20, 2, 5, 700, 1.0)
    assert m.mixed_s((10, 20), 5, 700) == pytest.approx(m.predict_features(sample_features(s)), rel=1e-12)


def test_an_engine_that_mixes_prefills_into_decodes_gets_one_mixed_step_for_the_ttft() -> None:
    from llumnix.policy.slo_predict import InstanceLoad

    gs = GlobalScheduler(SLO)
    assert gs.slo is not None
    pred = gs.slo
    gs.add_instance(_status("i0", 0.0, ()))
    m = pred.model("i0")
    load = InstanceLoad(4, 400, ((0, 50),), 100, (), None, 16, m)
    step = m.decode_s(4, 400)
    assert pred.ttft(load, 30, 0) == pytest.approx(step / 2 + m.prefill_s((30,)) + m.prefill_s((50,)))
    gs.update_status(_status("i0", 1.0, (StepSample(0, 0, 0, 4, 400, 0.03),)))
    assert not m.mixes
    gs.update_status(_status("i0", 2.0, (StepSample(50, 2500, 1, 4, 400, 0.05),)))
    assert m.mixes
    step = m.decode_s(4, 400)
    assert pred.ttft(load, 30, 0) == pytest.approx(step / 2 + m.mixed_s((50, 30), 4, 400))


def test_one_stalled_step_does_not_lift_the_next_predictions() -> None:
    m = StepTimeModel()
    feats = [sample_features(StepSample(0, 0, 0, b, 100 * b, 0.0)) for b in range(1, 9)]
    rng = __import__("random").Random(0)
    # 1,000 steps to converge: with the square-root feature, one, the sequences and the root
    # are near-collinear over 1-8 sequences, and the fit settles along them slowly (300
    # steps: within 5%; 1,000: 0.5%)
    for _ in range(1000):
        b = rng.randrange(8)
        m.observe_features(feats[b], 0.02 + 0.005 * (b + 1))
    before = m.predict_features(feats[3])
    assert before == pytest.approx(0.04, rel=0.02)
    m.observe_features(feats[3], 0.9)  # stalled 20x (a loaded machine): taught as 3x at most
    assert m.predict_features(feats[3]) < before * 1.05  # unclipped: +14%
