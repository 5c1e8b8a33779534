"""A trivial stand-in scheduling system for simulator tests that must not depend on
the policy package: round-robin or least-loaded dispatch, and migration from the
fullest to the emptiest instance. Not a Llumnix policy; just enough to drive the loop."""
from __future__ import annotations

from llumnix.core.status import InstanceStatus


class StandInPolicy:
    scaling_interval_s = 0.0
    track_reactions = False

    def __init__(self, dispatch: str = "least-loaded", enable_migration: bool = False,
                 migrate_gap_blocks: int = 50) -> None:
        self.mode = dispatch
        self.enable_migration = enable_migration
        self.gap = migrate_gap_blocks
        self.statuses: dict[str, InstanceStatus] = {}
        self.sent: dict[str, int] = {}
        self.num_reports = 0

    def bind(self, clock):
        self._now = clock.now

    def make_llumlet(self, instance_id, engine):
        return None

    def add_instance(self, inst) -> None:
        self.sent[inst.instance_id] = 0
        self.statuses[inst.instance_id] = inst.engine.get_status()

    def remove_instance(self, inst) -> None:
        self.sent.pop(inst.instance_id, None)
        self.statuses.pop(inst.instance_id, None)

    def report(self, inst) -> bool:
        self.num_reports += 1
        self.statuses[inst.instance_id] = inst.engine.get_status()
        return False

    def on_order(self, src_id, dst_id):
        return None

    @staticmethod
    def _load(s: InstanceStatus) -> int:
        return s.num_used_blocks + sum(-(-w.num_tokens // s.block_size) for w in s.waiting)

    def dispatch(self, request_id, num_prompt_tokens, arrival_time, priority, prompt_token_ids=None, slo_class=None):
        if not self.sent:
            return None
        if self.mode == "round-robin":
            iid = min(self.sent, key=lambda k: (self.sent[k], k))
        else:
            iid = min(self.statuses, key=lambda k: (self._load(self.statuses[k]), k))
        self.sent[iid] += 1
        return iid

    def pair_migrations(self):
        if len(self.statuses) < 2:
            return []
        order = sorted(self.statuses, key=lambda k: self._load(self.statuses[k]))
        lo, hi = order[0], order[-1]
        if self._load(self.statuses[hi]) - self._load(self.statuses[lo]) < self.gap:
            return []
        return [(hi, lo)]

    def select_request(self, src, dst):
        running = src.engine.scheduler.running
        if not running:
            return None
        return min(running, key=lambda r: (r.num_tokens, r.request_id)).request_id

    def keep_migrating(self, src, dst):
        return False

    def is_drained(self, inst):
        return not inst.engine.requests and not inst.migrations_in

    def on_migration_started(self, src, request_id):
        pass

    def on_migration_finished(self, src, request_id, committed):
        pass

    def scale(self, num_active):
        return "none", None

    def on_terminating(self, inst):
        pass
