"""The simulator's speed guard (benchmarks/sim/speed_guard.py): its verdict on literal
measurements, not a timing."""
from __future__ import annotations

import json

import pytest
from benchmarks.sim import speed_guard
from benchmarks.sim.speed_guard import compare, reference_round, verdict


def result(score: float, num_events: int = 1000, config: str = "short") -> dict[str, float | int | str]:
    return {"config": config, "score": score, "num_events": num_events, "events_per_s": score * 100,
            "events_per_cpu_s": score * 110, "reference_per_s": 110.0}


def test_within_fifteen_percent_passes_and_beyond_regresses():
    assert verdict(100.0, 100.0) == "PASS"
    assert verdict(85.0, 100.0) == "PASS"  # exactly 15% slower: not more than 15%
    assert verdict(84.9, 100.0) == "REGRESSED"
    assert verdict(150.0, 100.0) == "PASS"  # faster never regresses
    assert verdict(94.0, 100.0, tolerance=0.05) == "REGRESSED"


def test_a_record_without_a_positive_score_is_refused():
    with pytest.raises(ValueError, match="positive"):
        verdict(1.0, 0.0)


def test_compare_says_the_ratio_and_when_the_work_changed():
    word, line = compare(result(40.0), result(50.0))
    assert word == "REGRESSED" and "80% of it" in line and "work changed" not in line
    word, line = compare(result(50.0, num_events=1200), result(50.0))
    assert word == "PASS" and "the work changed: 1,200 events, record 1,000" in line


def test_the_reference_workload_is_fixed():
    assert reference_round() == reference_round() == reference_round(2000)
    assert reference_round(100) != reference_round(2000)


def test_main_prints_the_verdict_and_exits_one_on_a_regression(monkeypatch, tmp_path, capsys):
    record = tmp_path / "guard.json"
    record.write_text(json.dumps({"short": result(50.0)}))
    monkeypatch.setattr(speed_guard, "RECORD", record)
    monkeypatch.setattr(speed_guard, "measure", lambda name, src: result(30.0, config=name))
    assert speed_guard.main(["--short"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "REGRESSED"
    monkeypatch.setattr(speed_guard, "measure", lambda name, src: result(49.0, config=name))
    assert speed_guard.main(["--short"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "PASS"


def test_main_without_a_record_for_a_config_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    record = tmp_path / "guard.json"
    record.write_text(json.dumps({"speed": result(50.0, config="speed")}))
    monkeypatch.setattr(speed_guard, "RECORD", record)
    monkeypatch.setattr(speed_guard, "measure", lambda name, src: result(30.0, config=name))
    assert speed_guard.main(["--short"]) == 2
    assert "no record for 'short'" in capsys.readouterr().err
