"""Migration pairing: sources below the out threshold, destinations above the in
threshold; pair the lowest freeness with the highest, repeatedly. An order whose destination has no room for the source's next request (its blocks, and
``freeness.MIGRATION_GROWTH_BLOCKS`` for what it grows while copied) is left out: the
destination would refuse the reservation (issue 32's H200 run: 28 of 130 migrations
started were refused so).

    freeness:  -inf  0.5   2   |out  in|   40   90   700
               src0  src1  src2          dst2 dst1 dst0
    orders:    (src0, dst0), (src1, dst1), (src2, dst2)

Terminating instances are always sources (their fake request makes F = -inf)
and never destinations. Each instance takes part in at most one new order per
round, and only while its in-flight migrations (``num_migrating_out`` /
``num_migrating_in``) are under the cap. A source needs a request it could give
up (one not already migrating). Unschedulable (unhealthy) instances that are not
terminating take no part.

With ``pairing: fit`` (not the paper's) a source is paired with the freest destination
that has the free blocks the source's next request needs (what its llumlet will select:
the request's blocks if it runs, none if it is queued and moves as metadata), instead
of the freest destination outright, whose reservation may then be refused: freeness is
free blocks *per running request*, so the freest instance is not always the one with
the most free blocks. A source no remaining destination can take is left out this round.

With ``pairing: stable`` (not the paper's) the destination must also stay out of the
source set after taking that request: its freeness with the request's blocks (or, for a
queued request, its prompt's demand) and one more request counted stays at or above the
out threshold. Otherwise the move makes a new source, which gives up its own shortest
request, often the one that just arrived: the paper's selection keeps picking the same
short requests, and at S-L 4.1 3,018 requests made 11,854 moves, 6,407 of them within 5 s
of the request's previous move (``benchmarks/sim/beyond.md``).

With ``pairing: even`` (not the paper's) the destination must stay freer than the source
is: its freeness with the request's demand and one more request counted is above the
source's. The reverse move of the same request would then find its destination (the old
source) less free than its source, so it is never paired: no ping-pong. With triggered
rescheduling (``policy/trigger.py``) the paper's pairing moved the same requests again
within a gap: a destination the move made a source fires a pass at once and gives up its
shortest request, the one that just came (the simulator at the H200 run's sizing, rate
16: 2.9 moves per moved request; ``even`` 1.6, preemptions as low;
``benchmarks/cluster/README.md``, "The trigger's re-moves"). Unlike ``stable`` a source in
worse shape may still tip its destination below the out threshold.

With ``defrag: hol`` (not the paper's; ``policy/defrag.py``) blocked instances are first
paired with a destination that has room for their head-of-line request, and the paper's
pairing runs over the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.defrag import plan_hol_moves
from llumnix.policy.freeness import (
    blocks_for,
    freeness,
    freeness_after,
    queue_aware_freeness,
    room_for_migration,
)
from llumnix.policy.selection import select_requests

MOVE_TESTS = ("stable", "even")
"""Pairings that test each move against the destination's status (``accepts_move``)."""


@dataclass(frozen=True)
class MigrationOrder:
    """Move requests from ``src_instance_id`` to ``dst_instance_id``; the source's llumlet
    picks them and keeps going while it is still a source, or, where the order names its
    request, moves that one only (``policy.rounds.why_not_named``)."""

    src_instance_id: str
    dst_instance_id: str
    request_id: str | None = None
    """The request to move, and the only one, when the rescheduler chose it (rescue by
    migration, ``policy/slo_rescue.py``); None: the source's llumlet selects."""


def is_source(status: InstanceStatus, f: float, cfg: ReschedulingConfig) -> bool:
    return status.is_terminating or f < cfg.out_threshold


def is_destination(status: InstanceStatus, f: float, cfg: ReschedulingConfig) -> bool:
    return status.is_schedulable and not status.is_terminating and f > cfg.in_threshold


def destination_freeness(status: InstanceStatus, cfg: ReschedulingConfig, fcfg: FreenessConfig) -> float:
    """The freeness a destination is judged (and ranked) by: Algorithm 1's, or with
    ``dst_queue: all`` every queued request's demand counted (``queue_aware_freeness``)."""
    return queue_aware_freeness(status, fcfg) if cfg.dst_queue == "all" else freeness(status, fcfg)


def destination_room(status: InstanceStatus, cfg: ReschedulingConfig) -> int:
    """Blocks a running request moving to ``status`` may hold (``room_for_migration``;
    beyond the queue's demand too with ``dst_queue: all``)."""
    return room_for_migration(status, queued=cfg.dst_queue == "all")


def has_movable(status: InstanceStatus) -> bool:
    """The instance holds a request it could give up (one not migrating already)."""
    return any(not r.is_migrating for r in (*status.running, *status.waiting))


def pair_migrations(statuses: list[InstanceStatus], cfg: ReschedulingConfig,
                    fcfg: FreenessConfig) -> list[MigrationOrder]:
    live = [s for s in statuses if s.is_schedulable or s.is_terminating]
    if cfg.defrag == "hol":
        moves = plan_hol_moves(live, cfg)
        used = {iid for pair in moves for iid in pair}
        rest = [s for s in live if s.instance_id not in used]
        return [MigrationOrder(a, b) for a, b in moves] + _paper_pairs(rest, cfg, fcfg)
    return _paper_pairs(live, cfg, fcfg)


def _paper_pairs(live: list[InstanceStatus], cfg: ReschedulingConfig,
                 fcfg: FreenessConfig) -> list[MigrationOrder]:
    f = {s.instance_id: freeness(s, fcfg) for s in live}
    fd = f if cfg.dst_queue == "head" else {s.instance_id: destination_freeness(s, cfg, fcfg) for s in live}
    srcs = sorted((s for s in live if is_source(s, f[s.instance_id], cfg)
                   and s.num_migrating_out < cfg.max_out and has_movable(s)),
                  key=lambda s: (f[s.instance_id], s.instance_id))
    src_ids = {s.instance_id for s in srcs}
    dsts = sorted((s for s in live if s.instance_id not in src_ids and is_destination(s, fd[s.instance_id], cfg)
                   and s.num_migrating_in < cfg.max_in),
                  key=lambda s: (-fd[s.instance_id], s.instance_id))
    # in_threshold >= out_threshold and terminating instances are never destinations,
    # so the two lists are disjoint.
    if cfg.pairing == "paper":
        # A move the destination has no room to reserve is refused there (and ends the
        # chain): the order is left out, the pairing otherwise the paper's.
        return [MigrationOrder(src.instance_id, dst.instance_id) for src, dst in zip(srcs, dsts, strict=False)
                if _next_move(src, cfg)[0] <= destination_room(dst, cfg)]
    orders: list[MigrationOrder] = []
    for src in srcs:
        need, demand = _next_move(src, cfg)
        for i, dst in enumerate(dsts):
            if need > destination_room(dst, cfg):
                continue
            if not accepts_move(f[src.instance_id], dst, demand, cfg, fcfg):
                continue
            orders.append(MigrationOrder(src.instance_id, dst.instance_id))
            del dsts[i]
            break
    return orders


def _next_move(status: InstanceStatus, cfg: ReschedulingConfig) -> tuple[int, int]:
    """For the request ``status``'s llumlet would give up next: the blocks a destination must
    reserve for it (its KV blocks if it runs, 0 if it is queued: it moves as metadata) and
    the blocks it will need there (its KV blocks, or its prompt's demand); (0, 0) if none."""
    ids = select_requests(status, cfg.selection, 1, hol_first=cfg.defrag == "hol")
    if not ids:
        return 0, 0
    r = _brief(status, ids[0])
    demand = _demand(r, status.block_size)
    return (demand if r.is_running else 0), demand


def _brief(status: InstanceStatus, request_id: str) -> RequestBrief:
    return next(r for r in (*status.running, *status.waiting) if r.request_id == request_id)


def _demand(r: RequestBrief, block_size: int) -> int:
    return r.num_blocks if r.is_running else blocks_for(r.num_tokens, block_size)


def demand_of(status: InstanceStatus, request_id: str) -> int:
    """Blocks the request will need on a destination: its KV blocks if it runs, its
    prompt's demand if it is queued."""
    return _demand(_brief(status, request_id), status.block_size)


def stays_destination(dst: InstanceStatus, demand: int, cfg: ReschedulingConfig,
                       fcfg: FreenessConfig) -> bool:
    """``dst``'s freeness with ``demand`` more blocks and one more request is not below the
    out threshold: taking the request does not make it a source."""
    return freeness_after(dst, fcfg, demand) >= cfg.out_threshold


def accepts_move(src_freeness: float, dst: InstanceStatus, demand: int, cfg: ReschedulingConfig,
                 fcfg: FreenessConfig) -> bool:
    """Whether the pairing lets a source of freeness ``src_freeness`` move a request of
    ``demand`` blocks to ``dst``: ``stable``, if ``dst`` stays out of the source set;
    ``even``, if ``dst`` stays freer than the source was (so the move can never be undone
    by the reverse move); paper and fit, always."""
    if cfg.pairing == "stable":
        return stays_destination(dst, demand, cfg, fcfg)
    if cfg.pairing == "even":
        return freeness_after(dst, fcfg, demand) > src_freeness
    return True
