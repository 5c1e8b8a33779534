"""The co-running slowdown estimators of `llumnix bench migration`."""
from __future__ import annotations

import bisect
import random
import statistics

import pytest

from llumnix.bench.migration_bench import _mean_step, _step_time


def _log(durations: list[float], gap: float = 0.0) -> list[tuple[float, float, int]]:
    t, out = 0.0, []
    for d in durations:
        out.append((t, t + d, 4))
        t += d + gap
    return out


def test_step_time_counts_straddling_steps_by_fraction():
    log = _log([0.2] * 10)  # steps at [0, 0.2), [0.2, 0.4), ...
    assert _step_time(log, 0.1, 0.5) == pytest.approx(0.2)
    assert _step_time(log, 0.0, 2.0) == pytest.approx(0.2)
    assert _step_time(log, 5.0, 6.0) is None  # no steps there


def test_step_time_counts_the_gaps_between_steps():
    # the co-running requests wait through a stall at the boundary too
    assert _step_time(_log([0.2] * 10, gap=0.05), 0.0, 2.5) == pytest.approx(0.25)


def test_step_time_ignores_idle_steps():
    log = [(0.0, 0.2, 4), (0.2, 0.4, 0), (0.4, 0.6, 4)]
    assert _step_time(log, 0.0, 0.6) == pytest.approx(0.3)


def test_a_short_window_reads_a_slowdown_from_variable_steps_alone():
    # Steps of 0.15 or 0.35 s and no migration anywhere: the plain mean of the steps
    # overlapping a 0.5 s window, against the 2.5 s before it, reads a slowdown (a short
    # window is likelier to overlap a long step). This is why the benchmark's control
    # uses the same window lengths as the migration it is compared with.
    rng = random.Random(7)
    full = _log([rng.choice((0.15, 0.35)) for _ in range(20000)])
    starts = [s for s, _, _ in full]
    short, equal = [], []
    for k in range(1500):
        start = 5.5 + 2.9 * k
        # the steps near the windows (a step lasts at most 0.35 s): the same means as
        # over the whole log, without scanning 20,000 steps per window
        log = full[bisect.bisect_left(starts, start - 6.0):bisect.bisect_right(starts, start + 1.0)]
        before = _mean_step(log, start - 2.5, start)
        short.append(_mean_step(log, start, start + 0.5) / before)
        equal.append(before / _mean_step(log, start - 5.0, start - 2.5))
    assert statistics.median(short) > 1.03
    assert abs(statistics.median(equal) - 1) < 0.01
