"""What happens between rescheduling rounds, as pure functions of snapshots: whether a
source keeps migrating to the destination its round paired it with, and when a draining
instance is empty. The simulator and the cluster both decide through these (via
``Llumlet``), so the two cannot drift apart again: they once did, the simulator testing
the destination's freeness and ``max_in``, the cluster only the source and a cap of 16.

A pairing's chain, per the paper: the source migrates request after request while

    source still a source   (terminating, or freeness below the out threshold)
    source holds a request it could give up
    destination still a destination (schedulable, not terminating, freeness above the
                                     in threshold, fewer than max_in other migrations
                                     coming in)

The other migrations in are the caller's to count: right after a commit the destination
may still hold the committed request's reservation until its next step, so its status
cannot tell this chain's migration from another source's. (Leaving the count out let
chains pile onto busy destinations: at 16 simulated instances P99 decode went from 0.19
to 0.34 s.)
"""
from __future__ import annotations

from collections.abc import Collection

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.freeness import freeness
from llumnix.policy.pairing import is_destination, is_source
from llumnix.policy.selection import movable_requests


def keep_migrating(src: InstanceStatus, dst: InstanceStatus, num_in: int, cfg: ReschedulingConfig,
                   fcfg: FreenessConfig, migrating_out: Collection[str] = ()) -> bool:
    """After a migration of the pairing ``src`` -> ``dst`` ends: start the next one?
    ``num_in``: migrations into ``dst`` under way, not counting the one that ended."""
    if not movable_requests(src, migrating_out) or not is_source(src, freeness(src, fcfg), cfg):
        return False
    return num_in < cfg.max_in and is_destination(dst, freeness(dst, fcfg), cfg)


def is_drained(status: InstanceStatus) -> bool:
    """A terminating instance may stop: it holds no request and no migration in or out."""
    return not (status.running or status.waiting or status.num_migrating_out or status.num_migrating_in)
