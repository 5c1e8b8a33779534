"""LlumSched's migration history stays bounded however long the cluster runs (issue 28,
finding 9), while its counts stay exact."""
from __future__ import annotations

import logging

from llumnix.cluster.history import MigrationHistory


def test_the_history_keeps_the_last_reports_and_every_count():
    h = MigrationHistory(maxlen=100)
    for i in range(10_000):
        if i % 4 == 3:
            h.add([{"request_id": f"r{i}", "committed": False, "abort_reason": "refused"}])
        else:
            h.add([{"request_id": f"r{i}", "committed": True, "downtime": None if i % 4 == 2 else 0.01 * (i % 7),
                    "was_queued": i % 4 == 2, "num_blocks": 3, "num_blocks_cached": 1}])
    s = h.summary({"instance-1"})
    assert len(h.reports) == 100 and len(s["recent"]) == 50 and len(s["recent_downtimes_s"]) == 50
    assert (s["committed"], s["aborted"], s["committed_queued"], s["committed_running"]) == (7500, 2500, 2500, 5000)
    assert (s["blocks_sent"], s["blocks_adopted"]) == (22_500, 7500)
    assert s["recent"][-1]["request_id"] == "r9999" and s["in_flight"] == ["instance-1"]
    assert None not in s["recent_downtimes_s"]  # queued migrations have no downtime


def test_every_abort_is_counted_by_reason_past_the_history_kept():
    h = MigrationHistory(maxlen=10)
    for i in range(300):
        if i % 3 == 0:
            h.add([{"request_id": f"r{i}", "committed": False, "abort_code": "refused",
                    "abort_reason": "destination refused to reserve blocks"}])
        elif i % 3 == 1:
            h.add([{"request_id": f"r{i}", "committed": True, "downtime": 0.01}])
        else:  # a failed round of the instance actor: text only
            h.add([{"committed": False, "abort_reason": "RayActorError: The actor died unexpectedly"}])
    s = h.summary(())
    by = s["aborted_by_reason"]
    assert by["refused"] == 100 and by["destination_gone"] == 100
    assert sum(by.values()) == s["aborted"] == 200
    assert set(by) >= {"source_finished", "transport_error", "timeout", "other"}  # every code, 0 or more
    assert s["recent"][-1]["abort_code"] == "destination_gone"  # the text's code, shown with it


def test_each_migration_is_one_log_line_with_its_downtime(caplog):
    caplog.set_level(logging.INFO, logger="llumnix.cluster.history")
    h = MigrationHistory()
    h.add([{"request_id": "r1", "src_instance_id": "instance-0", "dst_instance_id": "instance-1", "committed": True,
            "num_blocks": 4, "num_stages": 2, "duration": 0.05, "downtime": 0.0071},
           {"request_id": "r2", "src_instance_id": "instance-0", "dst_instance_id": "instance-1", "committed": False,
            "abort_reason": "destination has no room"}])
    assert [r.getMessage() for r in caplog.records] == [
        "migration of r1 instance-0 -> instance-1 committed: 4 blocks (0 adopted) in 2 stages in 0.050 s, "
        "downtime 7.1 ms",
        f"migration of r2 instance-0 -> instance-1 aborted ({h.reports[-1]['abort_code']})"]


def test_a_reports_start_marks_are_shown_as_spans():
    h = MigrationHistory()
    marks = {"order_received": 10.0, "dst_read": 10.01, "first_stage": 10.25, "first_reserved": 10.26,
             "first_sent": 10.27, "first_copied": 10.45}
    h.add([{"request_id": "a", "committed": True, "downtime": 0.01, "start_time": 10.2, "marks": marks},
           {"request_id": "b", "committed": True, "was_queued": True, "start_time": 11.0,
            "marks": {"order_received": 10.9}}])
    s = h.summary(())
    a, b = s["recent"]
    assert abs(a["start_wait_s"] - 0.25) < 1e-9 and abs(a["first_stage_s"] - 0.2) < 1e-9
    assert b["start_wait_s"] is None and b["first_stage_s"] is None  # no stage: no span
    assert s["start_wait_s"] == [a["start_wait_s"]]
