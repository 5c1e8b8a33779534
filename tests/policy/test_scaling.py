"""Auto-scaling decisions over a window of (time, average normal freeness) samples."""
from __future__ import annotations

import pytest

from llumnix.policy import ScalingConfig, scaling_decision
from tests.policy.snapshots import inst, run, wait

CFG = ScalingConfig(enabled=True, window_s=10, cooldown_s=0, min_instances=1, max_instances=3)
A = inst("a", running=[run(f"x{k}", 5) for k in range(3)])
B = inst("b", running=[run("y", 5)], waiting=[wait(f"q{k}", 16) for k in range(5)])  # fewest running
C = inst("c", running=[run("z0", 5), run("z1", 5)])


@pytest.mark.parametrize("samples,statuses,expected", [
    ([(0, 5.0), (5, 6.0), (10, 7.0)], [A, B], ("out", None)),
    ([(0, 80.0), (5, 90.0), (10, 70.0)], [A, B], ("in", "b")),     # fewest running, not fewest requests
    ([(0, 80.0), (5, 90.0), (10, 70.0)], [A], ("none", None)),     # at min_instances
    ([(0, 5.0), (10, 5.0)], [A, B, C], ("none", None)),            # at max_instances
    ([(0, 5.0), (10, 5.0)], [A, B, inst("t", term=True)], ("none", None)),  # draining ones count to max
    ([(0, 5.0), (10, 5.0)], [A, inst("t", term=True)], ("out", None)),
    ([(0, 80.0), (10, 80.0)], [A, inst("t", term=True)], ("none", None)),  # but not to min, nor as victim
    ([(0, 80.0), (10, 80.0)], [inst("t", term=True), B, A], ("in", "b")),
    ([(0, 30.0), (10, 30.0)], [A, B], ("none", None)),             # inside [10, 60]
    ([(0, 10.0), (10, 10.0)], [A, B], ("none", None)),             # bounds are inclusive
    ([(0, 60.0), (10, 60.0)], [A, B], ("none", None)),
    ([(6, 5.0), (10, 5.0)], [A, B], ("none", None)),               # not a full window yet
    ([], [A, B], ("none", None)),
    # only the last window counts: an old low sample is outside it
    ([(-20, 0.0), (0, 30.0), (10, 30.0)], [A, B], ("none", None)),
    ([(-20, 99.0), (0, 5.0), (10, 5.0)], [A, B], ("out", None)),
])
def test_scaling_decision(samples, statuses, expected):
    """now = 10, window 10 s, bounds [1, 3], band [10, 60]."""
    act = scaling_decision(samples, statuses, CFG, now=10.0, last_action_time=None)
    assert (act.kind, act.instance_id) == expected


@pytest.mark.parametrize("cfg,last,expected", [
    (ScalingConfig(enabled=True, window_s=10, cooldown_s=30), 0.0, "none"),     # in cooldown
    (ScalingConfig(enabled=True, window_s=10, cooldown_s=30), -25.0, "out"),    # cooldown over
    (ScalingConfig(enabled=False, window_s=10), None, "none"),                  # disabled
])
def test_cooldown_and_disabled(cfg, last, expected):
    act = scaling_decision([(0, 1.0), (10, 1.0)], [inst("a")], cfg, now=10.0, last_action_time=last)
    assert act.kind == expected


def test_no_decision_while_a_scaled_out_instance_is_starting():
    low, high = [(0, 1.0), (10, 1.0)], [(0, 99.0), (10, 99.0)]
    for samples in (low, high):
        assert scaling_decision(samples, [A, B], CFG, 10.0, None, num_starting=1).kind == "none"
    assert scaling_decision(low, [A, B], CFG, 10.0, None, num_starting=0).kind == "out"
