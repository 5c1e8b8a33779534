"""Rescue by migration: requests predicted to miss their class's objective where they are
move to an instance where they meet it.

Beside the freeness pairing (``policy/pairing.py``), not instead of it, over instances not
already in one of its orders; at most one rescue order per instance a round:

* TTFT: a queued request whose time waited plus its predicted wait there
  (``SLOPredictor.ttft_queued``) breaks its TTFT objective, while on another instance
  (``ttft``, the request joining its queue) it would meet it, moves there (a queued
  request moves as metadata: nothing to copy). The order names it.
* TPOT: an instance whose running requests' predicted TPOT (``tpot_now``) breaks the
  tightest objective among their classes gives up the request the selection rule
  (``rescheduling.selection``) picks on its status (with the paper's, the lowest
  priority first: a batch request that slows the interactive ones, "the requests
  hurting it") to the instance, among those with the
  room to reserve it whose own requests (and the moved one) still meet their TPOT
  objectives after it joins, with the lowest predicted TPOT. The order names it.

The ablation switch is ``scheduling.slo.rescue``. Every rescue order names its request, and
the simulator and the serving cluster alike move that request and that one only: no
selection, and no chain of the freeness rule follows it (chains after rescues cost goodput:
issue 47, benchmarks/slo/README.md). One rule decides it for both (``policy.rounds.
why_not_named`` and ``keep_migrating``, through ``Llumlet.select_for_order``;
``sim/policy_bridge.py``, ``cluster/migration_source.py``): a request no longer at the
source, or migrating already, is not moved, and on the cluster the order ends with one
report saying why (LlumSched's migration log, abort code ``source_finished``).
"""
from __future__ import annotations

from collections.abc import Collection

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import ReschedulingConfig
from llumnix.policy.pairing import MigrationOrder, demand_of, destination_room
from llumnix.policy.selection import select_requests
from llumnix.policy.slo_predict import SLOPredictor, is_overdue

MAX_QUEUED_LOOKED_AT = 8
"""Queued requests per instance a round looks at (service order): bounds a round's work."""


def rescue_orders(views: list[InstanceStatus], predictor: SLOPredictor, now: float, cfg: ReschedulingConfig,
                  taken: Collection[str] = ()) -> list[MigrationOrder]:
    """Rescue orders over ``views``, none touching an instance in ``taken``."""
    live = [v for v in views if v.is_schedulable and not v.is_terminating and v.instance_id not in taken]
    busy: set[str] = set()
    orders = ttft_rescues(live, predictor, now, cfg, busy)
    return orders + tpot_rescues([v for v in live if v.instance_id not in busy], predictor, now, cfg)


def ttft_rescues(live: list[InstanceStatus], predictor: SLOPredictor, now: float, cfg: ReschedulingConfig,
                 busy: set[str]) -> list[MigrationOrder]:
    """TTFT rescues; the instances they use are added to ``busy``."""
    orders: list[MigrationOrder] = []
    for src in live:
        if not src.waiting or src.num_migrating_out >= cfg.max_out or src.instance_id in busy:
            continue
        load = predictor.load(src)
        i = -1  # q's place in load.queued, which leaves out the overdue (served last)
        for q in src.waiting[:MAX_QUEUED_LOOKED_AT]:
            if is_overdue(q, src.timestamp, predictor.overdue_limits, predictor.slo):
                continue
            i += 1
            if q.is_migrating:
                continue
            budget = predictor.slo.class_of(q.slo_class, q.priority).ttft_s - (now - q.arrival_time)
            if budget <= 0 or predictor.ttft_queued(load, i) <= budget:
                continue  # too late to save, or it holds where it is
            dst = _meets_ttft(live, predictor, q.num_tokens, q.priority, budget, {src.instance_id, *busy}, cfg)
            if dst is not None:
                orders.append(MigrationOrder(src.instance_id, dst, q.request_id))
                busy.update((src.instance_id, dst))
                break
    return orders


def _meets_ttft(live: list[InstanceStatus], predictor: SLOPredictor, tokens: int, priority: int, budget: float,
                skip: set[str], cfg: ReschedulingConfig) -> str | None:
    """The instance where a request of ``tokens`` would see its first token soonest, if within ``budget``."""
    best: tuple[float, str] | None = None
    for dst in live:
        if dst.instance_id in skip or dst.num_migrating_in >= cfg.max_in:
            continue
        t = predictor.ttft(predictor.load(dst), tokens, priority)
        if t <= budget and (best is None or t < best[0]):
            best = (t, dst.instance_id)
    return None if best is None else best[1]


def tpot_rescues(live: list[InstanceStatus], predictor: SLOPredictor, now: float,
                 cfg: ReschedulingConfig) -> list[MigrationOrder]:
    at_risk: list[tuple[float, InstanceStatus]] = []
    for v in live:
        load = predictor.load(v)
        if load.tightest_tpot_s is None or v.num_migrating_out >= cfg.max_out:
            continue
        ratio = predictor.tpot_now(load, now) / load.tightest_tpot_s
        if ratio > 1.0:
            at_risk.append((ratio, v))
    at_risk.sort(key=lambda x: (-x[0], x[1].instance_id))
    sources = {v.instance_id for _, v in at_risk}
    dsts = [v for v in live if v.instance_id not in sources and v.num_migrating_in < cfg.max_in]
    orders: list[MigrationOrder] = []
    for _, src in at_risk:
        ids = select_requests(src, cfg.selection, 1)
        if not ids:
            continue
        brief = next(r for r in (*src.running, *src.waiting) if r.request_id == ids[0])
        need = demand_of(src, ids[0]) if brief.is_running else 0
        moved_tpot = predictor.slo.class_of(brief.slo_class, brief.priority).tpot_s
        best: tuple[float, int] | None = None
        for i, dst in enumerate(dsts):
            if need > destination_room(dst, cfg):
                continue
            load = predictor.load(dst)
            tpot = predictor.tpot(load, brief.num_tokens, now)
            limit = moved_tpot if load.tightest_tpot_s is None else min(moved_tpot, load.tightest_tpot_s)
            if tpot <= limit and (best is None or tpot < best[0]):
                best = (tpot, i)
        if best is not None:
            orders.append(MigrationOrder(src.instance_id, dsts.pop(best[1]).instance_id, ids[0]))
    return orders
