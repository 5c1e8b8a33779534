"""The Ray settings of a cluster that `llumnix serve` starts itself."""
from __future__ import annotations

from llumnix.cluster.launcher import local_ray_config


def test_a_started_cluster_reports_no_task_events_unless_the_environment_names_the_setting(monkeypatch):
    monkeypatch.delenv("RAY_task_events_report_interval_ms", raising=False)
    assert local_ray_config() == {"task_events_report_interval_ms": 0}
    monkeypatch.setenv("RAY_task_events_report_interval_ms", "1000")  # the user's choice stands
    assert local_ray_config() == {}
