"""Build the InstanceStatus snapshot an engine reports after a step."""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from llumnix.core.request import Request
from llumnix.core.status import InstanceStatus, RequestBrief

if TYPE_CHECKING:
    from llumnix.engine.engine_core import EngineCore


_FIELDS = frozenset(f.name for f in dataclasses.fields(InstanceStatus))
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(InstanceStatus) if f.default is not dataclasses.MISSING}


def _new_status(values: dict[str, Any]) -> InstanceStatus:
    """``InstanceStatus(**values)`` without the frozen ``__init__``'s 26 guarded
    attribute writes (a third of the cost; one status per instance per report). The
    same object: InstanceStatus has no ``__post_init__``, and unknown names still fail."""
    if not _FIELDS.issuperset(values):
        raise TypeError(f"InstanceStatus has no field {sorted(set(values) - _FIELDS)[0]!r}")
    status = object.__new__(InstanceStatus)
    state = status.__dict__
    state.update(_DEFAULTS)
    state["extra"] = {}
    state.update(values)
    return status


def _briefs(engine: EngineCore, reqs: Iterable[Request], *, running: bool,
            migrating: Collection[str] = (), all_migrating: bool = False) -> list[RequestBrief]:
    # Once per request per report (the simulator's hottest loop): the token and block
    # counts read directly, not through Request.num_tokens and KVManager.num_blocks_of.
    table = engine.kv.tables.get
    out: list[RequestBrief] = []
    add = out.append
    for r in reqs:
        rid = r.request_id
        n_out = len(r.output_token_ids)
        blocks = table(rid)
        add(RequestBrief(rid, r.priority, 0 if blocks is None else len(blocks), len(r.prompt_token_ids) + n_out,
                         r.arrival_time, running, all_migrating or rid in migrating, n_out))
    return out


def _waiting_briefs(engine: EngineCore, migrating: Collection[str]) -> tuple[RequestBrief, ...]:
    """The queue's briefs, reused while the queue and the ids flagged migrating are those
    of the last status (briefs are immutable). A queued request's tokens do not change,
    and it holds no blocks (``EngineCore.check_invariants``: none but a reservation,
    which an engine never makes for a request it holds)."""
    sched = engine.scheduler
    if not sched.waiting:
        return ()
    flagged = frozenset(migrating)
    cached = engine.waiting_briefs
    if cached is not None and cached[0] == sched.waiting_version and cached[1] == flagged:
        return cached[2]
    briefs = tuple(_briefs(engine, sched.waiting, running=False, migrating=flagged))
    engine.waiting_briefs = (sched.waiting_version, flagged, briefs)
    return briefs


def build_status(engine: EngineCore, *, migrating: Collection[str] = (), **fields: Any) -> InstanceStatus:
    """The engine's snapshot. ``migrating``: ids the caller knows are migrating out (a
    paused request always is); ``fields`` set or override InstanceStatus fields the
    engine does not know (the llumlet's terminating and schedulable flags, its id)."""
    sched, kv = engine.scheduler, engine.kv
    running = _briefs(engine, sched.running, running=True, migrating=migrating)
    if sched.paused:
        running += _briefs(engine, sched.paused.values(), running=True, all_migrating=True)
    values: dict[str, Any] = {
        "instance_id": engine.instance_id,
        "timestamp": engine.clock.now(),
        "num_total_blocks": kv.num_total_blocks,
        "num_used_blocks": kv.num_used_blocks,
        "num_watermark_blocks": kv.num_watermark_blocks,
        "block_size": kv.block_size,
        "max_num_seqs": engine.config.scheduler.max_num_seqs,
        "running": tuple(running),
        "waiting": _waiting_briefs(engine, migrating),
        "head_of_line_demand": sched.head_of_line_demand(),
        "num_preemptions": sched.num_preemptions,
        "num_prefix_cache_queries": sched.num_prefix_queried_tokens,
        "num_prefix_cache_hits": sched.num_prefix_hit_tokens,
        "num_reserved_blocks": kv.num_reserved_blocks,
        "num_shared_block_holds": kv.num_shared_block_holds,
        "num_migrating_in": len(kv.reserved_ids()),
        "step_id": engine.step_id,
    }
    values.update(fields)
    return _new_status(values)
