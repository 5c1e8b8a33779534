"""A latency predictor: an instance's step time as a function of its batch, fitted online,
and from it a request's TTFT and TPOT on a candidate instance (pure; no numpy, no torch).

Step time is linear in seven features of the batch (``StepBatch.features``)::

    t = a * is_prefill + b * is_decode + c * prefill_tokens + d * sum(prompt_len^2)
        + e * num_seqs + f * context_tokens + g * sqrt(num_seqs)

which holds the simulator's parametric model exactly (its serving overheads included:
the fixed one folds into a and b, the per-sequence one into e; g is 0 there) and
approximates a measured profile (``sim/profile.py``). The square root is the engines'
batching gain: a real engine's step grows faster over its first few sequences than
over the next (kernels that switch with the row count, weights read once for the whole
batch). On the CPU engine (SmolLM2, ``auto`` weights) a decode step is 39 ms at one
sequence, 83 ms at four and 98 ms at eight; linear in the sequences, the best fit in
hindsight of a run missed by 8% at P50 and 21% at P90, with the root 5% and 15%
(benchmarks/slo/README.md, "The predictor's seventh feature").

``StepTimeModel`` starts from a seed (a latency model's fit, ``from_latency``, or the
A10/LLaMA-7B serving fit) and follows the engine's own step reports by recursive least
squares on relative error, with forgetting, so it tracks a machine that is slower (or
busier) than its calibration.
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from math import sqrt
from operator import mul
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llumnix.core.status import StepSample

_SCALE = (1.0, 1.0, 1e-3, 1e-6, 1e-2, 1e-4, 1e-1)
"""Feature scales (tokens in thousands, squares in millions...): a well-conditioned RLS."""

_CLIP_LOW, _CLIP_HIGH = 1.0 / 3.0, 3.0
"""The measured-to-predicted ratio a step teaches the fit at most (``observe_features``)."""

A10_LLAMA7B_SERVING = (0.01231, 0.03549, 0.20239, 0.00523, 0.02833, 0.01727, -0.000024)
"""Coefficients of ``a10-llama7b-serving`` (sim/calibration.py's fit, 7 ms serving overhead per
step) on the scaled features: the seed where no latency model is given (a test keeps it
equal to the simulator's fit)."""


class LatencyLike(Protocol):
    """What ``from_latency`` reads (``sim.latency.LatencyModel`` has it)."""

    @property
    def step_overhead_s(self) -> float: ...

    @property
    def seq_overhead_s(self) -> float: ...

    def prefill_time(self, seq_lens: Sequence[int]) -> float: ...

    def decode_time(self, batch_size: int, num_context_tokens: int) -> float: ...


@dataclass(frozen=True)
class StepBatch:
    """One engine step's batch, as the step report gives it."""

    prefill_lens: tuple[int, ...] = ()
    """Tokens computed per prefilling sequence (a prefill step; empty for a decode step)."""
    num_decode_seqs: int = 0
    num_context_tokens: int = 0
    """Context tokens the decoding sequences read."""

    @property
    def features(self) -> tuple[float, ...]:
        pre = 1.0 if self.prefill_lens else 0.0
        tokens = float(sum(self.prefill_lens))
        square = float(sum(n * n for n in self.prefill_lens))
        seqs = float(len(self.prefill_lens) + self.num_decode_seqs)
        raw = (pre, 1.0 - pre, tokens, square, seqs, float(self.num_context_tokens), sqrt(seqs))
        return tuple(x * s for x, s in zip(raw, _SCALE, strict=True))


def sample_features(s: StepSample) -> tuple[float, ...]:
    """``StepBatch.features`` of a step report (a chunk's attention counted as its work)."""
    pre = 1.0 if s.num_prefill_seqs else 0.0
    seqs = float(s.num_prefill_seqs + s.num_decode_seqs)
    raw = (pre, 1.0 - pre, float(s.num_prefill_tokens), float(s.prefill_attention), seqs,
           float(s.num_context_tokens), sqrt(seqs))
    return tuple(x * k for x, k in zip(raw, _SCALE, strict=True))


class StepTimeModel:
    """Step time from the batch; ``observe`` follows measured steps (RLS with forgetting)."""

    def __init__(self, coef: Sequence[float] = A10_LLAMA7B_SERVING, *, forgetting: float = 0.995,
                 prior_weight: float = 100.0) -> None:
        if len(coef) != len(_SCALE):
            raise ValueError(f"need {len(_SCALE)} coefficients, got {len(coef)}")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0, 1]")
        self.coef = [float(c) for c in coef]
        self.forgetting = forgetting
        n = len(coef)
        # The inverse information of the seed: small = trusted (it moves only after many
        # steps disagree with it).
        self._p = [[(1.0 / prior_weight if i == j else 0.0) for j in range(n)] for i in range(n)]
        self.num_observed = 0
        self.mixes = False
        """Its engine mixes prefills into decode steps (chunked prefill): seen in a step report."""

    @classmethod
    def from_latency(cls, model: LatencyLike, **kwargs: float) -> StepTimeModel:
        """The least-squares fit (relative error) of a latency model over a grid of batches."""
        samples: list[tuple[StepBatch, float]] = []
        for lens in ((16,), (64,), (256,), (512,), (1024,), (2048,), (4096,), (128, 128), (512, 256, 64)):
            t = model.prefill_time(lens) + model.step_overhead_s + model.seq_overhead_s * len(lens)
            samples.append((StepBatch(prefill_lens=lens), t))
        for batch in (1, 4, 16, 32, 64, 128):
            for ctx in (16, 1024, 4096, 8192, 16384):
                t = model.decode_time(batch, batch + ctx) + model.step_overhead_s + model.seq_overhead_s * batch
                samples.append((StepBatch(num_decode_seqs=batch, num_context_tokens=batch + ctx), t))
        return cls(least_squares([b.features for b, _ in samples], [t for _, t in samples]), **kwargs)

    def predict(self, batch: StepBatch) -> float:
        return max(0.0, sum(c * x for c, x in zip(self.coef, batch.features, strict=True)))

    # predict() of a prefill-only or decode-only batch, written out: dispatch asks these per
    # candidate and per queued request
    def prefill_s(self, lens: Sequence[int]) -> float:
        if not lens:
            return 0.0
        a, _, c, d, e, _, g = self.coef
        n = len(lens)
        t = (a + c * _SCALE[2] * sum(lens) + d * _SCALE[3] * sum(k * k for k in lens) + e * _SCALE[4] * n
             + g * _SCALE[6] * sqrt(n))
        return max(0.0, t)

    def decode_s(self, num_seqs: int, num_context_tokens: int) -> float:
        _, b, _, _, e, f, g = self.coef
        return max(0.0, b + e * _SCALE[4] * num_seqs + f * _SCALE[5] * num_context_tokens
                   + g * _SCALE[6] * sqrt(num_seqs))

    def predict_features(self, features: Sequence[float]) -> float:
        t: float = sum(map(mul, self.coef, features))
        return max(0.0, t)

    def mixed_s(self, lens: Sequence[int], num_decode_seqs: int, num_context_tokens: int) -> float:
        """predict() of one step that prefills ``lens`` beside ``num_decode_seqs`` decodes."""
        a, _, c, d, e, f, g = self.coef
        seqs = len(lens) + num_decode_seqs
        t = (a + c * _SCALE[2] * sum(lens) + d * _SCALE[3] * sum(n * n for n in lens)
             + e * _SCALE[4] * seqs + f * _SCALE[5] * num_context_tokens + g * _SCALE[6] * sqrt(seqs))
        return max(0.0, t)

    def observe(self, batch: StepBatch, seconds: float) -> None:
        self.observe_features(batch.features, seconds)

    def observe_features(self, features: Sequence[float], seconds: float) -> None:
        """One measured step: an RLS update on error relative to the predicted time (features
        and target over it: a step's noise grows with its time; relative to the measured time,
        as first written, the fit sat 50% under noisy steps on a loaded CPU), the target's ratio
        to the prediction clipped to [1/3, 3] (one stalled step, 20x its kind, no longer lifts
        the next hundred predictions), older steps discounted by ``forgetting``. Replayed over
        1,914 steps of a CPU cluster at load average 20 on 2 cores (benchmarks/slo/README.md):
        P50 / P90 / signed median 56% / 84% / -52% relative to the measured time, 50% / 167% /
        +6% relative to the prediction, 48% / 92% / -21% clipped."""
        if seconds <= 0:
            return
        # written for speed (the simulator fits one per step): map(mul) and plain zips, a
        # quarter of the generator sums' and strict zips' time
        predicted: float = sum(map(mul, self.coef, features))
        inv = 1.0 / (predicted if predicted > 0 else seconds)
        x = [v * inv for v in features]
        p = self._p
        px = [sum(map(mul, row, x)) for row in p]
        denom = self.forgetting + sum(map(mul, x, px))
        err = min(max(seconds * inv, _CLIP_LOW), _CLIP_HIGH) - sum(map(mul, self.coef, x))
        gain = [v / denom for v in px]
        self.coef = [c + g * err for c, g in zip(self.coef, gain, strict=False)]
        inv_lam = 1.0 / self.forgetting
        self._p = [[(a - g * b) * inv_lam for a, b in zip(row, px, strict=False)]
                   for row, g in zip(p, gain, strict=False)]
        self.num_observed += 1

    def copy(self) -> StepTimeModel:
        """An independent model with this one's coefficients and confidence (a new
        instance's start)."""
        twin = StepTimeModel(self.coef, forgetting=self.forgetting)
        twin._p = [list(row) for row in self._p]
        twin.mixes = self.mixes
        return twin


def least_squares(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float]:
    """Coefficients minimizing the relative squared error (normal equations, Gauss-Jordan)."""
    n = len(rows[0])
    a = [[0.0] * (n + 1) for _ in range(n)]
    for row, y in zip(rows, targets, strict=True):
        x = [v / y for v in row]
        for i in range(n):
            for j in range(n):
                a[i][j] += x[i] * x[j]
            a[i][n] += x[i]
    for i in range(n):
        a[i][i] += 1e-12  # a feature no sample excites keeps a zero coefficient
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[piv] = a[piv], a[col]
        for r in range(n):
            if r != col and a[col][col]:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] if a[i][i] else 0.0 for i in range(n)]


class OutputLengths:
    """The output-length estimate: what a request that made ``k`` tokens will still make,
    from the lengths of finished requests (a prior mean until enough have finished)."""

    def __init__(self, prior_mean: int = 256, window: int = 2000, min_samples: int = 50) -> None:
        self.prior_mean = prior_mean
        self._seen: deque[int] = deque(maxlen=window)
        self._min = min_samples
        self._sorted: list[int] | None = None
        self._tail_sums: list[int] = []
        """Sums of the sorted lengths from each index on (rebuilt after an observation)."""

    def observe(self, num_output_tokens: int) -> None:
        self._seen.append(num_output_tokens)
        self._sorted = None

    @property
    def mean(self) -> float:
        return sum(self._seen) / len(self._seen) if len(self._seen) >= self._min else float(self.prior_mean)

    def remaining(self, made: int) -> float:
        """E[L - made | L > made]: empirical when enough finished requests ran longer,
        else the prior's mean less what was made, at least a quarter of it."""
        if self._sorted is None:  # once per batch of observations, not per question
            self._sorted = sorted(self._seen)
            sums = [0] * (len(self._sorted) + 1)
            for i in range(len(self._sorted) - 1, -1, -1):
                sums[i] = sums[i + 1] + self._sorted[i]
            self._tail_sums = sums
        i = bisect.bisect_right(self._sorted, made)
        n = len(self._sorted) - i
        if n >= self._min:
            return (self._tail_sums[i] - made * n) / n
        m = self.mean
        return max(m - made, m / 4)
