"""The speed work's two tools: metrics_same (are two simulate outputs the same run?) and
speed_pair's run order and medians. Literal inputs, no simulation."""
from __future__ import annotations

import json
import math

from benchmarks.sim import metrics_same, speed_pair


def record(**over):
    r = {"system": "llumnix", "trace": "M-M", "rate": 7.6, "seed": 0,
         "decode": {"p99": 0.25, "mean": math.nan}, "migrations": [{"downtime": 0.013}],
         "sim": {"num_events": 100, "wall_s": 2.0, "events_per_s": 50.0, "cpu_s": 1.5}}
    for k, v in over.items():
        r[k] = v
    return r


def test_timing_and_nan_are_not_differences():
    before = {"records": [record()]}
    after = {"records": [record(sim={"num_events": 100, "wall_s": 9.0, "events_per_s": 11.1, "cpu_s": 7.0})]}
    diffs, n_records, n_fields = metrics_same.compare(before, after)
    assert diffs == [] and n_records == 1 and n_fields == 8  # 4 keys, 2 decode, 1 migration, num_events


def test_any_metric_change_is_reported_with_its_path():
    before = {"records": [record()]}
    after = {"records": [record(decode={"p99": 0.2500001, "mean": math.nan}, migrations=[])]}
    diffs, _, _ = metrics_same.compare(before, after)
    assert any(".decode.p99" in d for d in diffs)
    assert any(".migrations: 1 items, then 0" in d for d in diffs)
    work = {"records": [record(sim={"num_events": 101, "wall_s": 2.0, "events_per_s": 50.0, "cpu_s": 1.5})]}
    assert any(".sim.num_events" in d for d in metrics_same.compare(before, work)[0])


def test_a_missing_record_is_a_difference(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"records": [record(), record(seed=1)]}))
    b.write_text(json.dumps({"records": [record()]}))
    assert metrics_same.main([str(a), str(b)]) == 1
    assert metrics_same.main([str(a), str(a)]) == 0


def test_pairs_alternate_which_arm_goes_first():
    assert speed_pair.order(3) == ["base", "new", "new", "base", "base", "new"]
    runs = [{"arm": a, "x": v} for a, v in zip(speed_pair.order(2), [10.0, 12.0, 13.0, 11.0], strict=True)]
    s = speed_pair.summary(runs, "x")
    assert (s["base"]["median"], s["new"]["median"], s["ratio"]) == (10.5, 12.5, 12.5 / 10.5)
    assert (s["base"]["min"], s["new"]["max"]) == (10.0, 13.0)
