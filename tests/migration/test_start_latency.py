"""From a migration order to its first stage: the source's boundaries on the way
(``driver.migrate_next``: the pick, the start and the first stage's blocks at one), and the
marks the report keeps of that path (``calibrate_info_path`` reads them)."""
from __future__ import annotations

import time

from llumnix.core.sampling_params import SamplingParams
from llumnix.migration import MigrationConfig
from llumnix.migration.driver import migrate, migrate_next
from tests.migration.test_live_migration import PROMPT, Pair, reference


class Boundaries:
    """A source server whose step-boundary calls are timed (when each one's answer came)."""

    def __init__(self, server):
        self._server = server
        self.answered: list[float] = []

    def __getattr__(self, name):
        return getattr(self._server, name)

    def call(self, fn, timeout=30.0):
        try:
            return self._server.call(fn, timeout)
        finally:
            self.answered.append(time.monotonic())

    def call_until(self, fn, timeout):
        try:
            return self._server.call_until(fn, timeout)
        finally:
            self.answered.append(time.monotonic())

    def before(self, t: float) -> int:
        return sum(a <= t for a in self.answered)


def test_the_pick_starts_the_migration_and_its_first_stage_at_one_boundary():
    """Two source boundaries in all: the pick with the start and the first stage's blocks;
    the post-stage check with the pause (the whole table and a block reserved ahead)."""
    params = SamplingParams(max_tokens=100)
    # 50 ms a step: a block of 4 tokens in 0.2 s, so the first stage leaves the last stage's 1-2
    with Pair(slow_s=0.05) as pair:
        pair.add("x", PROMPT, params)
        time.sleep(0.05)
        src = Boundaries(pair.src)
        picks = []

        def pick():
            picks.append(pair.src.engine.requests["x"].num_output_tokens)  # on the step thread
            return ["x"]

        rep = migrate_next(pick, src, pair.endpoint, pair.sender, MigrationConfig(max_stages=3),
                           marks={"order_received": time.monotonic()})
        assert rep is not None and rep.committed, rep
        assert len(picks) == 1
        m = rep.marks
        assert m["order_received"] <= rep.start_time <= m["first_stage"] <= m["first_reserved"] \
            <= m["first_sent"] <= m["paused"] <= m["first_copied"] <= m["boundary_done"]
        assert rep.num_stages == 2 and rep.downtime is not None
        assert src.before(m["first_stage"]) == 1  # no second boundary before the first stage began
        assert src.before(m["paused"]) == 1  # paused at the next: its post-stage check
        assert src.before(m["boundary_done"]) == 2
        assert pair.collect("x") == reference(PROMPT, params)
        assert sorted(i for i, _ in pair.tokens["x"]) == list(range(1, params.max_tokens + 1))
        pair.check_drained()


def test_a_named_migration_begins_its_first_stage_at_its_first_boundary():
    """``migrate`` (a request named off the step thread) reads the request and the first
    stage's blocks at one boundary, as ``migrate_next``; the caller's marks are kept."""
    with Pair() as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=150))
        time.sleep(0.05)
        src = Boundaries(pair.src)
        rep = migrate("x", src, pair.endpoint, pair.sender, MigrationConfig(), marks={"dst_read": 1.0})
        assert rep.committed, rep
        assert rep.marks["dst_read"] == 1.0  # the caller's marks are kept
        assert src.before(rep.marks["first_stage"]) == 1
        pair.collect("x")
        pair.check_drained()


def test_nothing_picked_starts_nothing():
    with Pair() as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=40))
        time.sleep(0.03)
        assert migrate_next(lambda: [], pair.src, pair.endpoint, pair.sender, MigrationConfig()) is None
        assert pair.src.call(lambda: set(pair.src.llumlet.migrating_out)) == set()
        assert pair.endpoint.num_reservations() == 0
        pair.collect("x")
        pair.check_drained()


def test_the_old_way_takes_a_boundary_for_each():
    """``merge_boundaries`` false, the benchmarks' baseline: the request at one
    boundary, its first stage's blocks at the next; the post-stage check, the top-up's
    reading and the pause at three more."""
    with Pair(slow_s=0.05) as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=150))
        time.sleep(0.05)
        src = Boundaries(pair.src)
        rep = migrate("x", src, pair.endpoint, pair.sender, MigrationConfig(merge_boundaries=False))
        assert rep.committed, rep
        assert src.before(rep.start_time) == 1 and src.before(rep.marks["first_stage"]) == 2
        assert rep.num_stages == 2 and src.before(rep.marks["boundary_done"]) >= 5
        pair.collect("x")
        pair.check_drained()
