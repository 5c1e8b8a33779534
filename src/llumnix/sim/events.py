"""Simulation events: what happens, when, and to whom.

Each handler returns the events it causes (Vidur style), so the flow of a run can
be read from the handlers alone. Events at the same time run in ``EventKind``
order, then in the order they were scheduled, which makes every run reproducible.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class EventKind(enum.IntEnum):
    """Ordered: at equal times a lower value runs first. Step ends come first so a
    status report or a dispatch at that instant sees the finished step."""

    STEP_END = 0
    """An engine step finished: outputs, then the next step."""
    MIGRATION_STAGE = 1
    """A migration's copy stage (or metadata hand-over) finished."""
    INSTANCE_UP = 2
    """A new instance finished starting and can take requests."""
    ARRIVAL = 3
    """A request reached the gateway."""
    STATUS_REPORT = 4
    """Llumlets report their statuses to the global scheduler (periodic)."""
    RESCHEDULE = 5
    """A rescheduling round: pair sources with destinations, start migrations."""
    SCALING = 6
    """An auto-scaling decision."""


@dataclass(slots=True)
class Event:
    """Not frozen (one is built per step: a frozen dataclass costs twice as much to build);
    nothing changes one once it is pushed."""

    time: float
    kind: EventKind
    target: Any = None
    """Whatever the handler needs: an instance id, a request index, a migration."""
