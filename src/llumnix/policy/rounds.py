"""What happens in and between rescheduling rounds, as pure functions of snapshots:
which of a round's pairings start a migration chain (``pairs_to_start``), what an
order that names its request moves (``why_not_named``), whether a source keeps migrating
to the destination its round paired it with (``keep_migrating``), when a draining instance
is empty (``is_drained``) and which scale-in victims may stop (``victims_to_stop``), and a
scaling round (``scaling_round``). The simulator and the
cluster both decide through these (``keep_migrating`` via ``Llumlet``), so the two cannot
drift apart again: they once did, the simulator testing the destination's freeness and
``max_in``, the cluster only the source and a cap of 16
(tests/policy/test_replay.py replays one snapshot sequence through both).

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

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.freeness import freeness
from llumnix.policy.pairing import destination_freeness, is_destination, is_source
from llumnix.policy.selection import movable_requests

if TYPE_CHECKING:
    from llumnix.policy.global_scheduler import GlobalScheduler
    from llumnix.policy.scaling import ScaleAction


def keep_migrating(src: InstanceStatus, dst: InstanceStatus, num_in: int, cfg: ReschedulingConfig,
                   fcfg: FreenessConfig, migrating_out: Collection[str] = (), named: str | None = None) -> bool:
    """After a migration of the pairing ``src`` -> ``dst`` ends: start the next one?
    ``num_in``: migrations into ``dst`` under way, not counting the one that ended.
    ``named``: the request the order named, if it named one (``why_not_named``): then no."""
    if named is not None:
        return False
    if not movable_requests(src, migrating_out) or not is_source(src, freeness(src, fcfg), cfg):
        return False
    return num_in < cfg.max_in and is_destination(dst, destination_freeness(dst, cfg, fcfg), cfg)


def why_not_named(src: InstanceStatus, request_id: str, migrating_out: Collection[str] = ()) -> str | None:
    """Why an order that names ``request_id`` (rescue by migration, ``policy/slo_rescue.py``)
    cannot move it off ``src`` now; None if it can: ``src`` still holds it, running or queued
    (moved as metadata), and it is not migrating already. Such an order moves that request
    and only it: no selection, and no chain follows (``keep_migrating``)."""
    for r in (*src.running, *src.waiting):
        if r.request_id == request_id:
            if r.is_migrating or request_id in migrating_out:
                return f"the named request {request_id} is migrating out of {src.instance_id} already"
            return None
    return f"the named request {request_id} is not on {src.instance_id} any more (finished or aborted)"


def is_drained(status: InstanceStatus) -> bool:
    """A terminating instance may stop: it holds no request and no migration in or out."""
    return not (status.running or status.waiting or status.num_migrating_out or status.num_migrating_in)


def pairs_to_start(pairs: Iterable[tuple[str, str]], migrating: Collection[str],
                   members: Collection[str]) -> list[tuple[str, str]]:
    """Of a round's (source, destination) pairings, those that start a chain: both ends
    still members, and the source not migrating out already (one chain per source)."""
    busy = set(migrating)
    started: list[tuple[str, str]] = []
    for src, dst in pairs:
        if src in busy or src not in members or dst not in members:
            continue
        busy.add(src)
        started.append((src, dst))
    return started


def victims_to_stop(victims: Mapping[str, float], statuses: Mapping[str, InstanceStatus],
                    migrating: Collection[str], now: float, settle_s: float = 0.0) -> list[str]:
    """Scale-in victims (id -> since when terminating) that may stop now: marked at least
    ``settle_s`` ago (so their reports carry the flag), no chain out of them under way,
    and drained by their latest status."""
    return [iid for iid, since in victims.items()
            if iid not in migrating and now - since > settle_s
            and (s := statuses.get(iid)) is not None and is_drained(s)]


def scaling_round(gs: GlobalScheduler, now: float) -> ScaleAction:
    """One auto-scaling round: sample the average freeness, then decide over the window
    (``GlobalScheduler.scaling_decision``: cooldown, bounds, a scale-out still starting)."""
    gs.record_freeness(now)
    return gs.scaling_decision(now)
