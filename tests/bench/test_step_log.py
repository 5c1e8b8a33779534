"""Step-log statistics (bench/step_log.py) on hand-made logs."""
from __future__ import annotations

import pytest

from llumnix.bench.step_log import neighbor_effect, overlap_fraction


def test_neighbor_effect_splits_steps_by_what_the_other_instance_was_doing():
    # Instance 0 decodes batch-1 steps of 50 ms alone for 0.5 s (the last one 20% covered:
    # neither side), then 60 ms steps while instance 1 steps the whole time; its 300 ms
    # prefill is left out. Instance 1's last step (100 ms, batch 1) runs alone.
    a = [(0.05 * i, 0.05 * i + 0.05, 1) for i in range(10)]
    a += [(0.5 + 0.06 * i, 0.56 + 0.06 * i, 1) for i in range(10)]
    a += [(1.1, 1.4, 1)]
    b = [(0.49, 1.11, 2), (1.5, 1.6, 1)]
    assert overlap_fraction(a[0], sorted(b), [s for s, _, _ in sorted(b)]) == 0.0
    assert overlap_fraction(a[12], sorted(b), [s for s, _, _ in sorted(b)]) == pytest.approx(1.0)
    assert overlap_fraction((1.05, 1.15, 1), b, [s for s, _, _ in b]) == pytest.approx(0.6)
    out = neighbor_effect([a, b])
    assert out["alone"]["1"] == {"median_s": pytest.approx(0.05), "count": 9 + 1}
    assert out["busy"]["1"]["count"] == 10
    assert out["ratio_by_batch"]["1"] == pytest.approx(1.2)
    assert "2" not in out["ratio_by_batch"]  # too few steps of batch 2 on either side
