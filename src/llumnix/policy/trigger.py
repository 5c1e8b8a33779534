"""Triggered rescheduling: which status starts a rescheduling pass at once, and when the
passes run. Pure: the caller passes each status, the clock's ``now``, and keeps the marks.

A status is marked by the pairing's own tests (``policy/pairing.py``), on that one status
alone (so the cost per status is one freeness, whatever the request rate):

    SOURCE       terminating, or freeness below the out threshold; and a request it could
                 give up, and fewer than max_out migrations out      (pairing takes it)
    BLOCKED      its head-of-line request cannot be admitted          (``defrag.is_blocked``)
    DESTINATION  schedulable, not terminating, (destination) freeness above the in
                 threshold, fewer than max_in migrations in            (pairing takes it)

A mark that appears (absent from the instance's previous status) triggers a pass: a new
source or a blocked queue wants a destination now; a new destination matters only while
some instance holds SOURCE or BLOCKED. A mark that stays triggers nothing: the periodic
sweep (``PassTimer``) retries pairings that found no partner. A source's chain ending
shows as its migrations out dropping under max_out: SOURCE appears again.

Passes are spaced by at least ``min_gap_s`` (a burst of triggers is one pass), and a sweep
runs every ``sweep_interval_s`` whatever happens::

    trigger ---+  +-- trigger   trigger
               v  v             v
    time ---|--P--.--P---------P--------S--------
               |<--->| min_gap_s         (S: sweep, sweep_interval_s after the last one)
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.defrag import is_blocked
from llumnix.policy.freeness import freeness
from llumnix.policy.pairing import destination_freeness, has_movable, is_destination, is_source


class Marks(enum.IntFlag):
    NONE = 0
    SOURCE = 1
    BLOCKED = 2
    DESTINATION = 4


WANTS_DESTINATION = Marks.SOURCE | Marks.BLOCKED


def marks_of(status: InstanceStatus, cfg: ReschedulingConfig, fcfg: FreenessConfig) -> Marks:
    """What pairing would make of ``status`` (see the module docstring)."""
    marks = Marks.NONE
    f = freeness(status, fcfg)
    if is_source(status, f, cfg) and status.num_migrating_out < cfg.max_out and has_movable(status):
        marks |= Marks.SOURCE
    if not status.is_terminating and is_blocked(status):
        marks |= Marks.BLOCKED
    if status.num_migrating_in < cfg.max_in and not marks & Marks.SOURCE:
        fd = f if cfg.dst_queue == "head" else destination_freeness(status, cfg, fcfg)
        if is_destination(status, fd, cfg):
            marks |= Marks.DESTINATION
    return marks


def should_trigger(old: Marks, new: Marks, any_wants_destination: bool) -> bool:
    """A pass is due now: ``new`` (an instance's marks from its latest status) has SOURCE or
    BLOCKED that ``old`` (from its previous one) lacked, or a new DESTINATION while some
    instance (``any_wants_destination``, this one's new marks included) waits for one."""
    appeared = new & ~old
    if appeared & WANTS_DESTINATION:
        return True
    return bool(appeared & Marks.DESTINATION) and any_wants_destination


@dataclass
class PassTimer:
    """When rescheduling passes run: a triggered pass at most every ``min_gap_s``, a full
    sweep every ``sweep_interval_s`` (the backstop). ``min_gap_s`` None: no triggered
    passes (sweeps only, the old fixed rounds)."""

    sweep_interval_s: float
    min_gap_s: float | None
    last_pass: float = -math.inf
    last_sweep: float = -math.inf
    triggered: bool = False

    def start(self, now: float) -> None:
        """The first sweep one interval from ``now``."""
        self.last_sweep = now

    def on_trigger(self) -> None:
        if self.min_gap_s is not None:
            self.triggered = True

    def due(self, now: float) -> str | None:
        """``"sweep"`` (a full round), ``"pass"`` (a triggered rescheduling pass) or None;
        the caller runs it and reports back with ``ran``."""
        if now >= self.last_sweep + self.sweep_interval_s:
            return "sweep"
        if self.triggered and self.min_gap_s is not None and now >= self.last_pass + self.min_gap_s:
            return "pass"
        return None

    def ran(self, what: str, now: float) -> None:
        """A sweep also counts as a pass (it reschedules), and answers any trigger before it."""
        self.last_pass, self.triggered = now, False
        if what == "sweep":
            self.last_sweep = now

    def wait_s(self, now: float) -> float:
        """How long the caller may sleep before something is due (0: due now)."""
        at = self.last_sweep + self.sweep_interval_s
        if self.triggered and self.min_gap_s is not None:
            at = min(at, self.last_pass + self.min_gap_s)
        return max(0.0, at - now)


class Reactions:
    """The marks of every instance's latest status, the triggers they make, and the
    reaction time of each first migration out of a new source: from the status that made
    the move possible (the later of the source's SOURCE and its destination's DESTINATION
    appearing, their ``timestamp``s: the end of the engine steps they report) to the order.
    One status and O(1) bookkeeping per ``on_status``."""

    def __init__(self, cfg: ReschedulingConfig, fcfg: FreenessConfig) -> None:
        self._cfg, self._fcfg = cfg, fcfg
        self.marks: dict[str, Marks] = {}
        self._wanting: set[str] = set()
        """Instances whose marks hold SOURCE or BLOCKED."""
        self._source_since: dict[str, float] = {}
        """A source not ordered a migration yet -> its status's timestamp when SOURCE appeared."""
        self._destination_since: dict[str, float] = {}
        self.num_triggers = 0

    def on_status(self, status: InstanceStatus) -> bool:
        """Take an instance's latest status (as the caller keeps it): a pass is due now."""
        iid = status.instance_id
        old = self.marks.get(iid, Marks.NONE)
        new = self.marks[iid] = marks_of(status, self._cfg, self._fcfg)
        if new == old:
            return False
        if new & WANTS_DESTINATION:
            self._wanting.add(iid)
        else:
            self._wanting.discard(iid)
        _track(self._source_since, iid, old, new, Marks.SOURCE, status.timestamp)
        _track(self._destination_since, iid, old, new, Marks.DESTINATION, status.timestamp)
        fire = should_trigger(old, new, bool(self._wanting))
        self.num_triggers += fire
        return fire

    def on_order(self, src_id: str, dst_id: str, now: float) -> float | None:
        """A migration out of ``src_id`` into ``dst_id`` ordered at ``now``: the reaction
        time if it is the first out of ``src_id`` since it became a source, else None."""
        since = self._source_since.pop(src_id, None)
        if since is None:
            return None
        return max(0.0, now - max(since, self._destination_since.get(dst_id, since)))

    def remove(self, instance_id: str) -> None:
        self.marks.pop(instance_id, None)
        self._wanting.discard(instance_id)
        self._source_since.pop(instance_id, None)
        self._destination_since.pop(instance_id, None)


def _track(since: dict[str, float], iid: str, old: Marks, new: Marks, mark: Marks, t: float) -> None:
    if new & mark and not old & mark:
        since[iid] = t
    elif old & mark and not new & mark:
        since.pop(iid, None)
