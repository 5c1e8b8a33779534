"""LlumSched's rescheduling passes: when they run (the periodic round, and between rounds
the passes that statuses trigger, at least ``trigger_gap_s`` apart: ``policy/trigger.py``),
the migration rounds they start on the source instances, those rounds' reports and the
reaction time from a status that makes a source to its first migration."""
from __future__ import annotations

import threading
import time
from typing import Any

import ray

from llumnix.cluster.history import MigrationHistory, ReactionHistogram
from llumnix.cluster.llumsched_state import SchedState
from llumnix.policy import SchedulingConfig
from llumnix.policy.rounds import pairs_to_start
from llumnix.policy.trigger import PassTimer, Reactions


class Rescheduler:
    def __init__(self, state: SchedState, cfg: SchedulingConfig, interval_s: float) -> None:
        self._state = state
        gap = cfg.rescheduling.trigger_gap_s if cfg.rescheduling.enabled else None
        self.timer = PassTimer(interval_s, gap)
        self._wake = threading.Event()
        self.reactions = Reactions(cfg.rescheduling, cfg.freeness)
        self.reaction = ReactionHistogram()
        """From the step that made an instance a source to the first migration out of it."""
        self.migrations = MigrationHistory()
        self.num_passes = 0

    @property
    def is_triggered(self) -> bool:
        return self.timer.min_gap_s is not None

    def next_due(self) -> str:
        """Sleep until a triggered pass or the periodic round is due; which one."""
        timer = self.timer
        while True:
            with self._state.lock:
                now = time.time()
                what = timer.due(now)
                if what is not None:
                    timer.ran(what, now)  # a trigger during the pass asks for another
                    return what
                wait = timer.wait_s(now)
            self._wake.wait(wait)  # a trigger lost between wait and clear is still in the timer
            self._wake.clear()

    def run_pass(self) -> None:
        st = self._state
        with st.lock:
            self.num_passes += 1
            self._reap_finished()
            orders = st.gs.reschedule(time.time())
            named = {(o.src_instance_id, o.dst_instance_id): o.request_id for o in orders}  # a rescue names one
            for src_id, dst_id in pairs_to_start(named, st.in_flight, st.handles):
                st.in_flight[src_id] = st.handles[src_id].migrate_out.remote(
                    dst_id, st.handles[dst_id], None, named[(src_id, dst_id)])
                reaction = self.reactions.on_order(src_id, dst_id, time.time())
                if reaction is not None:
                    self.reaction.observe(reaction)

    def on_status(self, instance_id: str) -> None:
        """After a status of ``instance_id`` was taken (caller holds the lock): wake the
        rescheduler if it makes a source, a blocked queue or a destination one waits for."""
        gs = self._state.gs
        if not gs.cluster.in_decode_pool(instance_id):
            self.reactions.remove(instance_id)  # PD: rescheduling pairs only within the decode pool
            return
        status = gs.statuses.get(instance_id)
        if status is not None and self.reactions.on_status(status):
            self.timer.on_trigger()
            self._wake.set()

    def on_report(self, report: dict[str, Any]) -> None:
        """One migration of a round still under way, as it ends (caller holds the lock)."""
        self.migrations.add([report], time.time())

    def remove(self, instance_id: str) -> None:
        """A gone instance (caller holds the lock)."""
        self.reactions.remove(instance_id)
        self._state.in_flight.pop(instance_id, None)

    def _reap_finished(self) -> None:
        in_flight = self._state.in_flight
        done = [k for k, ref in in_flight.items() if ray.wait([ref], timeout=0)[0]]
        for k in done:
            try:
                reports = ray.get(in_flight.pop(k))
            except Exception as e:  # noqa: BLE001 - a dead source: recorded as a failed round
                reports = [{"committed": False, "abort_reason": repr(e), "src_instance_id": k}]
            self.migrations.add(reports, time.time())

    def info(self) -> dict[str, Any]:
        return {"num_passes": self.num_passes, "num_triggers": self.reactions.num_triggers,
                "trigger_gap_s": self.timer.min_gap_s, "reaction": self.reaction.summary()}
