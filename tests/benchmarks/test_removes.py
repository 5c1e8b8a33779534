"""benchmarks/cluster/removes.py's count of a request's moves after its first."""
from __future__ import annotations

from benchmarks.cluster.removes import re_moves

from llumnix.migration.protocol import MigrationReport


def _move(rid: str, src: str, dst: str, start: float, end: float, committed: bool = True) -> MigrationReport:
    return MigrationReport(rid, src, dst, committed, None if committed else "refused", 1, 2, 0, None, end - start,
                           start_time=start, end_time=end)


def test_re_moves_counts_moves_after_the_first_the_ones_back_and_the_stays():
    reports = [_move("a", "i0", "i1", 1.0, 1.1), _move("a", "i1", "i0", 1.13, 1.2),  # back after 30 ms
               _move("a", "i0", "i2", 2.2, 2.3),                                       # on, after 1 s
               _move("b", "i3", "i1", 0.5, 0.6),                                       # moved once
               _move("c", "i0", "i1", 0.1, 0.2, committed=False)]                      # aborted: not a move
    got = re_moves(reports)
    assert (got["migrations"], got["moved"], got["re_moves"], got["back"]) == (4, 2, 2, 1)
    assert [round(s, 3) for s in got["stays"]] == [0.03, 1.0]
