"""What LlumSched remembers of past migrations: full counts, and the last ``HISTORY``
reports (a long-running cluster's memory and ``/admin/cluster`` stay bounded)."""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

HISTORY = 1000
"""Migration reports (and scaling events) kept; the counts are kept in full."""


class MigrationHistory:
    def __init__(self, maxlen: int = HISTORY) -> None:
        self.reports: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.num_committed = self.num_committed_queued = self.num_aborted = 0
        self.num_blocks_sent = self.num_blocks_adopted = 0

    def add(self, reports: Iterable[dict[str, Any]]) -> None:
        for m in reports:
            if m.get("committed"):
                self.num_committed += 1
                self.num_committed_queued += bool(m.get("was_queued"))
                self.num_blocks_sent += int(m.get("num_blocks", 0))
                self.num_blocks_adopted += int(m.get("num_blocks_cached", 0))
            else:
                self.num_aborted += 1
            self.reports.append(m)

    def summary(self, in_flight: Iterable[str]) -> dict[str, Any]:
        """``/admin/cluster``'s migrations. A queued request moves as metadata and never
        stalls: its migrations are counted apart, and only running ones have a downtime."""
        downtimes = [m["downtime"] for m in self.reports if m.get("committed") and m.get("downtime") is not None]
        recent = list(self.reports)[-50:]
        return {"committed": self.num_committed,
                "committed_running": self.num_committed - self.num_committed_queued,
                "committed_queued": self.num_committed_queued,
                "aborted": self.num_aborted,
                "in_flight": sorted(in_flight),
                "blocks_sent": self.num_blocks_sent,
                "blocks_adopted": self.num_blocks_adopted,
                "downtime_s": downtimes[-20:],
                "recent_downtimes_s": downtimes,
                "recent": [{k: m.get(k) for k in ("request_id", "src_instance_id", "dst_instance_id", "committed",
                                                  "abort_reason", "end_time")} for m in recent]}
