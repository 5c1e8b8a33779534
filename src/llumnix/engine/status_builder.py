"""Build the InstanceStatus snapshot an engine reports after a step."""
from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from llumnix.core.request import Request
from llumnix.core.status import InstanceStatus, RequestBrief

if TYPE_CHECKING:
    from llumnix.engine.engine_core import EngineCore


def _briefs(engine: EngineCore, reqs: Iterable[Request], *, running: bool,
            migrating: Collection[str] = (), all_migrating: bool = False) -> list[RequestBrief]:
    blocks = engine.kv.num_blocks_of
    return [RequestBrief(r.request_id, r.priority, blocks(r.request_id), r.num_tokens, r.arrival_time,
                         running, all_migrating or r.request_id in migrating, len(r.output_token_ids))
            for r in reqs]


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
        "waiting": tuple(_briefs(engine, sched.waiting, running=False, migrating=migrating)),
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
    return InstanceStatus(**values)
