"""Build the InstanceStatus snapshot an engine reports after a step."""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from llumnix.core.request import Request
from llumnix.core.status import InstanceStatus, RequestBrief, request_brief

if TYPE_CHECKING:
    from llumnix.engine.engine_core import EngineCore


_FIELDS = frozenset(f.name for f in dataclasses.fields(InstanceStatus))
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(InstanceStatus) if f.default is not dataclasses.MISSING}


def _briefs(engine: EngineCore, reqs: Iterable[Request], running: bool, migrating: Collection[str],
            all_migrating: bool, shift: float) -> list[RequestBrief]:
    """``shift``: added to each arrival time, from the engine's clock to the status's (below)."""
    # Once per request per report (the simulator's hottest loop): the token and block
    # counts read directly, not through Request.num_tokens and KVManager.num_blocks_of.
    # Positional parameters only, here and in build_status: CPython 3.11 runs a call with
    # keywords, or to a function with keyword-only parameters, in a C frame of its own.
    table = engine.kv.tables.get
    out: list[RequestBrief] = []
    add = out.append
    for r in reqs:
        rid = r.request_id
        n_out = len(r.output_token_ids)
        blocks = table(rid)
        add(request_brief(rid, r.priority, 0 if blocks is None else len(blocks), len(r.prompt_token_ids) + n_out,
                          r.arrival_time + shift, running, all_migrating or rid in migrating, n_out, r.slo_class))
    return out


def _waiting_briefs(engine: EngineCore, migrating: Collection[str], shift: float) -> tuple[RequestBrief, ...]:
    """The queue's briefs, reused while the queue and the ids flagged migrating are those
    of the last status (briefs are immutable). A queued request's tokens do not change,
    and it holds no blocks (``EngineCore.check_invariants``: none but a reservation,
    which an engine never makes for a request it holds)."""
    sched = engine.scheduler
    if not sched.waiting:
        return ()
    cached = engine.waiting_briefs
    # a set compares equal to the frozenset of its ids: no frozenset built for a hit
    same = migrating if isinstance(migrating, (set, frozenset)) else frozenset(migrating)
    # (the shift between two clocks moves by microseconds between reports: a brief's arrival
    # time is kept to the millisecond)
    if cached is not None and cached[0] == sched.waiting_version and cached[1] == same \
            and abs(cached[3] - shift) < 1e-3:
        return cached[2]
    flagged = frozenset(migrating)
    briefs = tuple(_briefs(engine, sched.waiting, False, flagged, False, shift))
    engine.waiting_briefs = (sched.waiting_version, flagged, briefs, shift)
    return briefs


def build_status(engine: EngineCore, migrating: Collection[str] = (),
                 fields: dict[str, Any] | None = None) -> InstanceStatus:
    """The engine's snapshot. ``migrating``: ids the caller knows are migrating out (a
    paused request always is); ``fields`` set or override InstanceStatus fields the
    engine does not know (the llumlet's terminating and schedulable flags, its id).

    Written into a new InstanceStatus's ``__dict__``, without the frozen ``__init__``'s
    26 guarded attribute writes (one status per instance per report): the same object,
    as InstanceStatus has no ``__post_init__``, and an unknown field still fails."""
    sched, kv = engine.scheduler, engine.kv
    # The engine stamps arrivals on its own clock (monotonic on a cluster); a report's
    # timestamp is the caller's (the wall clock that dispatch runs on, ``core/wire.py:
    # wall_arrival``): the briefs' arrival times are put on the report's clock, so that
    # ``timestamp - arrival_time`` is a wait. Read against the wall, monotonic arrivals made
    # every queued request look decades overdue to the SLO predictor on a real cluster.
    now = engine.clock.now()
    shift = fields["timestamp"] - now if fields and "timestamp" in fields else 0.0
    running = _briefs(engine, sched.running, True, migrating, False, shift)
    if sched.paused:
        running += _briefs(engine, sched.paused.values(), True, (), True, shift)
    status = object.__new__(InstanceStatus)
    state = status.__dict__
    state.update(_DEFAULTS)
    state["extra"] = {} if engine.pacer is None else engine.pacer.counts()  # a paced engine's (engine/pace.py)
    state["instance_id"] = engine.instance_id
    state["timestamp"] = fields["timestamp"] if fields and "timestamp" in fields else now
    total, used, reserved, shared, num_in = kv.status_counts()
    state["num_total_blocks"] = total
    state["num_used_blocks"] = used
    state["num_watermark_blocks"] = kv.num_watermark_blocks
    state["block_size"] = kv.block_size
    state["max_num_seqs"] = engine.config.scheduler.max_num_seqs
    state["running"] = tuple(running)
    state["waiting"] = _waiting_briefs(engine, migrating, shift)
    state["head_of_line_demand"] = sched.head_of_line_demand()
    state["num_preemptions"] = sched.num_preemptions
    state["num_prefix_cache_queries"] = sched.num_prefix_queried_tokens
    state["num_prefix_cache_hits"] = sched.num_prefix_hit_tokens
    state["num_reserved_blocks"] = reserved
    state["num_shared_block_holds"] = shared
    state["num_migrating_in"] = num_in
    state["preempts_for_deadlines"] = sched.preempts_for_deadlines
    state["step_id"] = engine.step_id
    if fields:
        if not _FIELDS.issuperset(fields):
            raise TypeError(f"InstanceStatus has no field {sorted(set(fields) - _FIELDS)[0]!r}")
        state.update(fields)
    return status
