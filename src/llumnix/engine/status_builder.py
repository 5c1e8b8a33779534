"""Build the InstanceStatus snapshot an engine reports after a step."""
from __future__ import annotations

from typing import TYPE_CHECKING

from llumnix.core.request import Request
from llumnix.core.status import InstanceStatus, RequestBrief

if TYPE_CHECKING:
    from llumnix.engine.engine_core import EngineCore


def _brief(engine: EngineCore, req: Request, *, running: bool, migrating: bool = False) -> RequestBrief:
    return RequestBrief(
        request_id=req.request_id, priority=req.priority,
        num_blocks=engine.kv.num_blocks_of(req.request_id), num_tokens=req.num_tokens,
        arrival_time=req.arrival_time, is_running=running, is_migrating=migrating,
        num_output_tokens=req.num_output_tokens,
    )


def build_status(engine: EngineCore) -> InstanceStatus:
    sched, kv = engine.scheduler, engine.kv
    running = [_brief(engine, r, running=True) for r in sched.running]
    running += [_brief(engine, r, running=True, migrating=True) for r in sched.paused.values()]
    head = sched.head_of_line
    return InstanceStatus(
        instance_id=engine.instance_id,
        timestamp=engine.clock.now(),
        num_total_blocks=kv.num_total_blocks,
        num_used_blocks=kv.num_used_blocks,
        num_watermark_blocks=kv.num_watermark_blocks,
        block_size=kv.block_size,
        max_num_seqs=engine.config.scheduler.max_num_seqs,
        running=tuple(running),
        waiting=tuple(_brief(engine, r, running=False) for r in sched.waiting),
        head_of_line_demand=0 if head is None else kv.num_blocks_for(head.num_tokens),
        num_preemptions=sched.num_preemptions,
        num_reserved_blocks=kv.num_reserved_blocks,
        num_migrating_in=len(kv.reserved_ids()),
        step_id=engine.step_id,
    )
