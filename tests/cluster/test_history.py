"""LlumSched's migration history stays bounded however long the cluster runs (issue 28,
finding 9), while its counts stay exact."""
from __future__ import annotations

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
