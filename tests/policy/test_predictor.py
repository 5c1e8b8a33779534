"""The latency predictor (policy/predictor.py): its error against the simulator's latency
models, online fitting from step reports, output lengths."""
from __future__ import annotations

import random

import pytest

from llumnix.policy.predictor import A10_LLAMA7B_SERVING, OutputLengths, StepBatch, StepTimeModel
from llumnix.sim.latency import a10_llama7b_serving
from llumnix.sim.profile import TableLatencyModel


def _true_time(model, b: StepBatch) -> float:
    if b.prefill_lens:
        return model.prefill_time(b.prefill_lens) + model.step_overhead_s + model.seq_overhead_s * len(b.prefill_lens)
    return (model.decode_time(b.num_decode_seqs, b.num_context_tokens) + model.step_overhead_s
            + model.seq_overhead_s * b.num_decode_seqs)


def _random_batches(rng: random.Random, n: int) -> list[StepBatch]:
    out = []
    for _ in range(n):
        if rng.random() < 0.3:
            out.append(StepBatch(prefill_lens=tuple(rng.randint(8, 3000) for _ in range(rng.randint(1, 3)))))
        else:
            b = rng.randint(1, 96)
            out.append(StepBatch(num_decode_seqs=b, num_context_tokens=b * rng.randint(16, 400)))
    return out


def _errors(pred: StepTimeModel, model, batches: list[StepBatch]) -> list[float]:
    return sorted(abs(pred.predict(b) / _true_time(model, b) - 1) for b in batches)


def test_fit_of_the_a10_model_is_within_one_percent() -> None:
    model = a10_llama7b_serving()
    errs = _errors(StepTimeModel.from_latency(model), model, _random_batches(random.Random(0), 500))
    assert errs[len(errs) // 2] < 0.005 and errs[-1] < 0.01


def test_default_seed_is_the_a10_serving_fit() -> None:
    fitted = StepTimeModel.from_latency(a10_llama7b_serving()).coef
    assert fitted == pytest.approx(list(A10_LLAMA7B_SERVING), rel=0.01)


def _slow_cpu_profile() -> TableLatencyModel:
    """A measured-profile-like table (prefill superlinear, decode bilinear), far from the A10."""
    a10 = a10_llama7b_serving()
    return TableLatencyModel(
        prefill_tokens=(16, 64, 256, 1024, 4096), prefill_s=(0.02, 0.05, 0.17, 0.75, 3.6),
        decode_batch=(1, 8, 32, 128), decode_context=(0, 4096, 16384, 65536),
        decode_s=((0.015, 0.02, 0.03, 0.08), (0.03, 0.036, 0.05, 0.1), (0.06, 0.07, 0.09, 0.15),
                  (0.2, 0.21, 0.24, 0.33)),
        migration=a10.migration, step_overhead_s=0.004, seq_overhead_s=0.0002)


def test_online_fit_follows_a_machine_unlike_its_seed() -> None:
    """Seeded with the A10 fit and fed the steps of a 3x-slower table model, RLS gets its
    P50 error under 10% and P90 under 25% (the issue's goals for the real engine)."""
    profile = _slow_cpu_profile()
    rng = random.Random(1)
    pred = StepTimeModel()
    test = _random_batches(random.Random(2), 400)
    before = _errors(pred, profile, test)
    for b in _random_batches(rng, 600):
        pred.observe(b, _true_time(profile, b))
    after = _errors(pred, profile, test)
    assert before[len(before) // 2] > 0.4  # the seed is far off: the fit is the model's doing
    assert after[len(after) // 2] < 0.10 and after[int(len(after) * 0.9)] < 0.25
    assert pred.num_observed == 600


def test_observe_ignores_a_non_positive_time() -> None:
    pred = StepTimeModel()
    coef = list(pred.coef)
    pred.observe(StepBatch(num_decode_seqs=4, num_context_tokens=400), 0.0)
    assert pred.coef == coef and pred.num_observed == 0


@pytest.mark.parametrize("bad", [dict(coef=(1.0, 2.0)), dict(forgetting=0.0), dict(forgetting=1.5)])
def test_bad_model_settings(bad: dict) -> None:
    with pytest.raises(ValueError):
        StepTimeModel(**bad)


def test_output_lengths_prior_then_empirical() -> None:
    lengths = OutputLengths(prior_mean=200, min_samples=10)
    assert lengths.mean == 200 and lengths.remaining(50) == 150 and lengths.remaining(190) == 50  # a quarter
    for n in [100] * 10 + [400] * 10:
        lengths.observe(n)
    assert lengths.mean == 250
    assert lengths.remaining(150) == 250  # only the 400-token ones ran past 150
    assert lengths.remaining(0) == 250


def test_shortcuts_agree_with_predict() -> None:
    pred = StepTimeModel.from_latency(a10_llama7b_serving())
    for b in _random_batches(random.Random(3), 50):
        short = pred.prefill_s(b.prefill_lens) if b.prefill_lens else pred.decode_s(b.num_decode_seqs,
                                                                                      b.num_context_tokens)
        assert short == pytest.approx(pred.predict(b), rel=1e-12)
