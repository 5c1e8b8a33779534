"""Llumlet: the per-instance agent's logic beside one engine (no I/O, no clock).

It adds to the engine's snapshot what only it knows (terminating, schedulable,
which requests are migrating out), picks the requests to migrate, and tells
the driver whether a source should keep migrating: the paper's source migrates
request after request until it is no longer a source.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from llumnix.core.status import MAX_STEP_SAMPLES, InstanceStatus, RequestBrief, StepSample, step_sample
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.freeness import freeness, room_for_migration, room_for_queued
from llumnix.policy.pairing import MOVE_TESTS, accepts_move, demand_of
from llumnix.policy.rounds import is_drained, keep_migrating, why_not_named
from llumnix.policy.selection import select_requests

if TYPE_CHECKING:
    from llumnix.core.batch import SchedulerOutput


def flag_status(status: InstanceStatus, migrating: Collection[str] = (), **fields: Any) -> InstanceStatus:
    """A snapshot with ``migrating`` request ids flagged and ``fields`` set: what an
    engine's ``snapshot(migrating, fields)`` returns, for engines (and test fakes) that
    build their snapshot first. EngineCore builds it in one pass."""
    def flag(briefs: tuple[RequestBrief, ...]) -> tuple[RequestBrief, ...]:
        return tuple(dataclasses.replace(r, is_migrating=True) if r.request_id in migrating else r
                     for r in briefs)

    return dataclasses.replace(status, running=flag(status.running), waiting=flag(status.waiting),
                               **fields)


class EngineLike(Protocol):
    def snapshot(self, migrating: Collection[str], fields: dict[str, Any]) -> InstanceStatus:
        """The engine's snapshot with ``migrating`` ids flagged and ``fields`` set. Two
        positional arguments, not ``get_status``'s keywords: one call per instance per
        status round, and in CPython 3.11 a call that spreads a dict into keywords costs
        about 5,000 instructions more than passing the dict."""
        ...

    def shared_blocks(self, request_ids: Collection[str]) -> dict[str, int]:
        """Per request, the blocks of its table that other requests hold too (selection
        ``freed``)."""
        ...

    def take_evicted_prefix_keys(self) -> list[bytes]:
        """Prefix-cache keys evicted since the last call."""
        ...

    def running_near_end(self, num_tokens: int) -> set[str]:
        """Running requests with fewer than ``num_tokens`` output tokens left to make
        (``rescheduling.min_tokens_left``)."""
        ...


class Llumlet:
    def __init__(self, instance_id: str, engine: EngineLike, rescheduling: ReschedulingConfig,
                 freeness_cfg: FreenessConfig, *, records_steps: bool = False) -> None:
        self.instance_id = instance_id
        self.engine = engine
        self.rescheduling = rescheduling
        self.freeness_cfg = freeness_cfg
        self.is_terminating = False
        """Set by scale-in: the fake request of infinite usage drains the instance."""
        self.is_schedulable = True
        """Cleared when the instance is unhealthy: no dispatch, no migration into it."""
        self.migrating_out: set[str] = set()
        self.records_steps = records_steps
        """Whether whoever steps the engine hands each step to ``on_step`` (the ``slo``
        policy's predictor is fitted on them)."""
        self._steps: deque[StepSample] = deque(maxlen=MAX_STEP_SAMPLES)

    def on_step(self, batch: SchedulerOutput, seconds: float) -> None:
        """One executed step and the seconds it held the engine: on the next push."""
        self._steps.append(step_sample(batch, seconds))

    def report(self, now: float, **fields: Any) -> InstanceStatus:
        """The engine's snapshot plus what only the llumlet knows, stamped ``now``."""
        return self.engine.snapshot(self.migrating_out, {
            "instance_id": self.instance_id, "timestamp": now, "is_terminating": self.is_terminating,
            "is_schedulable": self.is_schedulable, "num_migrating_out": len(self.migrating_out), **fields})

    def push(self, now: float) -> InstanceStatus:
        """The report for the global scheduler: ``report`` plus the prefix-cache keys the
        engine evicted since the previous push and the steps recorded since (``on_step``).
        Only the one path that delivers reports to the global scheduler may call it (any
        other caller would swallow these events). ``report``'s call written out: one per
        instance per status round."""
        fields: dict[str, Any] = {
            "instance_id": self.instance_id, "timestamp": now, "is_terminating": self.is_terminating,
            "is_schedulable": self.is_schedulable, "num_migrating_out": len(self.migrating_out),
            "evicted_prefix_keys": tuple(self.engine.take_evicted_prefix_keys())}
        if self._steps:
            fields["step_samples"] = tuple(self._steps)
            self._steps.clear()
        return self.engine.snapshot(self.migrating_out, fields)

    def freeness(self, now: float) -> float:
        return freeness(self.report(now), self.freeness_cfg)

    def select_requests_to_migrate(self, now: float, max_n: int = 1,
                                   dst: InstanceStatus | None = None) -> list[str]:
        """Request ids to migrate next, by the configured selection policy, never one
        already migrating. ``dst``: the destination's latest status; with
        ``queued_moves: fits`` a queued request goes only where it starts at once (without
        ``dst`` that cannot be known, and no queued request is given up); with
        ``pairing: stable`` (``even``) nothing is picked if taking the request would make ``dst``
        a source (no freer than this source);
        with ``dst`` no running request is picked that ``dst`` has no room to reserve for."""
        room = None
        if self.rescheduling.queued_moves == "fits":
            room = 0 if dst is None else room_for_queued(dst)
        status = self.report(now)
        shared = None
        if self.rescheduling.selection == "freed":
            shared = self.engine.shared_blocks([r.request_id for r in status.running])
        exclude: Collection[str] = self.migrating_out
        if self.rescheduling.min_tokens_left:
            exclude = self.migrating_out | self.engine.running_near_end(self.rescheduling.min_tokens_left)
        picks = select_requests(status, self.rescheduling.selection, max_n, exclude=exclude,
                                hol_first=self.rescheduling.defrag == "hol", dst_room=room, shared=shared,
                                dst_free=None if dst is None else room_for_migration(dst))
        # with pairing: stable or even the next move passes the first's test (pairing.py)
        cfg, fcfg = self.rescheduling, self.freeness_cfg
        if (cfg.pairing in MOVE_TESTS and dst is not None and picks
                and not accepts_move(freeness(status, fcfg), dst, demand_of(status, picks[0]), cfg, fcfg)):
            return []
        return picks

    def select_for_order(self, now: float, named: str | None = None,
                         dst: InstanceStatus | None = None) -> tuple[list[str], str | None]:
        """An order's first move, at the source: the request it names, if it names one and
        may move it (``policy.rounds.why_not_named``; else none, and why), or the one the
        selection picks (``select_requests_to_migrate``). The simulator and the cluster
        both start an order here."""
        if named is None:
            return self.select_requests_to_migrate(now, 1, dst), None
        why = why_not_named(self.report(now), named, self.migrating_out)
        return ([], why) if why is not None else ([named], None)

    @property
    def reads_destination(self) -> bool:
        """Selection needs the destination's status (``queued_moves: fits``, ``pairing: stable``
        or ``even``)."""
        return self.rescheduling.queued_moves != "any" or self.rescheduling.pairing in MOVE_TESTS

    def should_keep_migrating(self, now: float, dst: InstanceStatus, num_in: int, named: str | None = None) -> bool:
        """After a migration to ``dst`` (its latest status; ``num_in`` other migrations
        coming in there) ends: migrate the next request there? (``policy.rounds.
        keep_migrating``: the one rule of the simulator and the cluster; never after the
        request an order ``named``)."""
        return keep_migrating(self.report(now), dst, num_in, self.rescheduling, self.freeness_cfg,
                              self.migrating_out, named)

    def is_drained(self, now: float) -> bool:
        """Terminating and empty: the instance may stop (``policy.rounds.is_drained``)."""
        return self.is_terminating and is_drained(self.report(now))

    def on_migration_started(self, request_id: str) -> None:
        self.migrating_out.add(request_id)

    def on_migration_finished(self, request_id: str, committed: bool) -> None:
        """Committed or aborted, the request is no longer migrating out of here."""
        self.migrating_out.discard(request_id)
