"""What LlumSched's history keeps of each report for the dashboard: when it learned of
it, and each report once though a source tells it twice (as it ends, and with its round)."""
from __future__ import annotations

from llumnix.cluster.history import MigrationHistory


def test_recent_reports_carry_when_llumsched_learned_of_them_on_its_wall_clock():
    """A report's own times are on its source's monotonic clock; the dashboard's timeline
    needs a wall-clock time, the same for every report LlumSched took in at once."""
    h = MigrationHistory()
    report = {"request_id": "r", "committed": True, "downtime": 0.01, "end_time": 12.5}
    h.add([report], now=1_800_000_000.0)
    (recent,) = h.summary(())["recent"]
    assert recent["reported_at"] == 1_800_000_000.0 and recent["end_time"] == 12.5
    assert "reported_at" not in report  # the caller's report is not changed


def test_a_report_told_as_it_ends_and_again_with_its_round_counts_once():
    h = MigrationHistory(maxlen=4)
    first = {"request_id": "a", "src_instance_id": "instance-0", "start_time": 1.0, "committed": True, "downtime": 0.01}
    h.add([first])  # as it ended
    h.add([first, {**first, "request_id": "b"}])  # the round's return: a again, and b
    h.add([{"committed": False, "abort_reason": "RayActorError"}] * 2)  # failed rounds: nothing to know them by
    s = h.summary(())
    assert (s["committed"], s["aborted"]) == (2, 2) and [m["request_id"] for m in s["recent"]] == ["a", "b", None, None]
    assert s["recent_downtimes_s"] == [0.01, 0.01]
    for i in range(5):  # the identities kept are bounded as the reports are
        h.add([{**first, "request_id": f"r{i}"}])
    assert len(h._key_set) <= 4
    h.add([first])  # long forgotten: counted again (a report is never that late)
    assert h.summary(())["committed"] == 8
