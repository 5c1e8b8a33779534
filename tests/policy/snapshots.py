"""Literal snapshot builders for the policy tests (block size 16, 100 blocks by default)."""
from __future__ import annotations

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy import FreenessConfig

BS = 16
NO_HEADROOM = FreenessConfig(headroom_tokens={})


def run(rid: str, blocks: int, tokens: int | None = None, prio: int = 0, t: float = 0.0,
        migrating: bool = False) -> RequestBrief:
    return RequestBrief(rid, prio, blocks, blocks * BS if tokens is None else tokens, t, True, migrating)


def wait(rid: str, tokens: int, prio: int = 0, t: float = 0.0, migrating: bool = False) -> RequestBrief:
    return RequestBrief(rid, prio, 0, tokens, t, False, migrating)


def inst(iid: str, total: int = 100, running=(), waiting=(), hol: int | None = None, ts: float = 0.0,
         term: bool = False, sched: bool = True, reserved: int = 0, mig_in: int = 0,
         mig_out: int = 0) -> InstanceStatus:
    """``hol`` defaults to the first queued request's blocks, as an engine reports it."""
    used = sum(r.num_blocks for r in running) + reserved
    if hol is None:
        hol = -(-waiting[0].num_tokens // BS) if waiting else 0
    return InstanceStatus(
        instance_id=iid, timestamp=ts, num_total_blocks=total, num_used_blocks=used,
        num_watermark_blocks=1, block_size=BS, max_num_seqs=64, running=tuple(running),
        waiting=tuple(waiting), head_of_line_demand=hol, num_reserved_blocks=reserved,
        num_migrating_in=mig_in, num_migrating_out=mig_out, is_terminating=term, is_schedulable=sched)
