"""Drives one live migration: the source side of the protocol over a real
transport (any ``KVSender``). Every engine *change* runs at a step boundary of
the source (``src.call``) or the destination (its own ``Destination``);
pre-copy stages read full blocks straight from the cache while the source keeps
decoding (full blocks are never rewritten; the post-stage check catches a
request that was freed, preempted or finished meanwhile, and its copy is
dropped), on the transport's low-priority bulk path. The last stage is gathered
at the pausing boundary and sent on the urgent path.

With prefix caching, the first pre-copy stage's reservation sends the keys of the
request's full blocks: the destination adopts the leading ones it already caches
(their KV never travels) and reserves fresh blocks for the rest, in one round trip.

Downtime is measured from the pausing boundary (right after the request's last
step on the source) to the start of the destination's first step that computes the
request: the install queues it in the destination's inbox (the source need not wait
for that boundary), and once the source has dropped its copy it asks the destination
when that step began. The two ends lie on two machines' clocks, so each side measures
its own part and the install call's one-way delay is taken as half its round trip
less the destination's time inside it::

    source   pause ─── last stage ─── sent ·········· acked   (remove, ask)
    dest.                                   arrived ── queued ── boundary ── first step
    downtime = (sent - pause) + (round trip - (queued - arrived)) / 2 + (first step - arrived)

Invariant after any outcome: the request lives in exactly one place (the
destination after COMMITTED, the source after ABORTED if the source is
alive), and both block pools are exact (the destination frees its
reservation on abort).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from llumnix.core.request import Request, RequestStatus
from llumnix.kv.prefix_cache import sequence_keys
from llumnix.migration import reasons
from llumnix.migration.protocol import MigrationConfig, MigrationPhase, MigrationProtocol, MigrationReport
from llumnix.migration.transport import KVSender, KVSource

P = MigrationPhase
log = logging.getLogger(__name__)


class SourceServer(Protocol):
    instance_id: str
    engine: Any
    llumlet: Any

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any: ...

    def call_until(self, fn: Callable[[], Any], timeout: float) -> Any:
        """``fn`` run on the step thread at every boundary until it returns something other
        than False (InstanceServer.call_until); TimeoutError after ``timeout`` seconds, with
        ``fn`` withdrawn."""
        ...


class Destination(Protocol):
    instance_id: str

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None: ...

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        """Reserve for the full blocks with these keys: (how many leading ones are
        adopted from the cache there, fresh blocks for the rest), or None if refused."""
        ...

    def release(self, request_id: str) -> int: ...

    def install(self, snapshot: Request) -> Any:
        """Queue the request to resume at the destination's next step boundary; raises
        if it cannot resume there (then nothing changed on the destination)."""
        ...

    # It may also offer ``first_step(request_id, timeout_s) -> tuple[float, float] | None``
    # (DestinationEndpoint.first_step): for a running request installed there, (seconds
    # its install call spent there, seconds from the call's arrival to the start of the
    # first step with the request). One that does not (a timing wrapper) leaves each
    # downtime at its commit: the last stage alone.


def migrate(request_id: str, src: SourceServer, dst: Destination, sender: KVSender,
            config: MigrationConfig, now: Callable[[], float] = time.monotonic,
            marks: dict[str, float] | None = None) -> MigrationReport:
    """``marks``: instants before the migration began (the driver's clock), kept on its report."""
    eng = src.engine
    state, first = src.call(lambda: _start(eng, request_id, config, now))
    return _run(request_id, src, dst, sender, config, now, state, first, marks)


def migrate_next(pick: Callable[[], list[str]], src: SourceServer, dst: Destination, sender: KVSender,
                 config: MigrationConfig, now: Callable[[], float] = time.monotonic,
                 marks: dict[str, float] | None = None) -> MigrationReport | None:
    """Migrate the request ``pick`` names (its first), picked at the very source boundary that
    begins its migration and reads its first stage's blocks (``merge_boundaries``): one
    boundary's wait from the order to the first stage, not three (the pick, the start, the
    blocks, each up to a step apart). None if ``pick`` names none."""
    eng = src.engine

    def pick_and_start() -> tuple[str, Any, Any] | None:
        picked = pick()
        return None if not picked else (picked[0], *_start(eng, picked[0], config, now))

    got = src.call(pick_and_start)
    if got is None:
        return None
    request_id, state, first = got
    return _run(request_id, src, dst, sender, config, now, state, first, marks)


def _run(request_id: str, src: SourceServer, dst: Destination, sender: KVSender, config: MigrationConfig,
         now: Callable[[], float], state: tuple[RequestStatus, int] | None, first: _First,
         marks: dict[str, float] | None) -> MigrationReport:
    """The migration from its first source boundary on (``_start``'s ``state`` and ``first``)."""
    eng = src.engine
    proto, preemptions0 = _open(request_id, src, dst, config, now, state, marks)
    if proto.phase.is_done:
        return proto.report()
    src.llumlet.on_migration_started(request_id)
    paused = False
    snapshot: Request | None = None  # taken at the last stage's boundary
    spare: list[int] = []  # reserved ahead for later stages, so they need no reserve round trip
    ahead: _Chunk | _Paused | None = None  # following a prefill: the next stage, read after the last copy
    taken: tuple[float, list[int], Any, Request] | None = None  # the last stage's boundary work, done at a check
    alive = _is_alive(eng, request_id, preemptions0)
    try:
        if isinstance(first, _Paused):
            if proto.phase == P.RESERVE:
                proto.begin_stage([], now())  # nothing to pre-copy: straight to PAUSE
            snapshot = _last_stage(request_id, src, dst, sender, proto, spare, alive, now, first.taken)
            paused = snapshot is not None
        elif isinstance(first, _Chunk):
            ahead = first if proto.phase == P.RESERVE else None  # read at the first boundary: none more
        else:
            _first_stage_with_cache(request_id, eng, dst, proto, first, now)
        while not proto.phase.is_done:
            if proto.is_timed_out(now()):
                proto.abort("timeout", now(), reasons.TIMEOUT)
                break
            if proto.phase == P.RESERVE:  # a pre-copy stage: full blocks, request still running
                got, ahead = ahead or (_next_blocks(request_id, eng, src, proto, alive, now, 0) if config.follow_prefill
                                       else _plain_blocks(request_id, eng, src, proto, alive)), None
                if got is None:
                    _abort_gone(proto, now)
                elif isinstance(got, _Paused):  # behind prompt work: paused right after its first token
                    proto.begin_stage([], now())
                    snapshot = _last_stage(request_id, src, dst, sender, proto, spare, alive, now, got.taken)
                    paused = snapshot is not None
                elif proto.begin_stage(got.blocks, now()) == P.RESERVE:
                    proto.on_reserved(_take(request_id, dst, spare, len(got.blocks), got.need), now())
            elif proto.phase == P.COPY:
                if not sender.send(request_id, proto.stages[-1].dst_block_ids,
                                   KVSource(eng.executor, proto.pending_blocks)):
                    proto.abort("the destination refused the KV", now(), reasons.KV_REFUSED)
                    continue
                proto.marks.setdefault("first_sent", now())  # the first stage's KV written
                if config.follow_prefill:  # the post-stage check is the wait for the next chunk
                    ahead = _next_blocks(request_id, eng, src, proto, alive, now, len(proto.pending_blocks))
                    if ahead is None:
                        _abort_gone(proto, now)
                    elif isinstance(ahead, _Paused):  # nothing is left but the tail: the last stage, now
                        proto.on_copied(now(), request_alive=True, num_unsent_blocks=0)
                        snapshot = _last_stage(request_id, src, dst, sender, proto, spare, alive, now, ahead.taken)
                        paused, ahead = snapshot is not None, None
                    if not isinstance(ahead, _Chunk):
                        continue
                    ok, unsent, prefilling, taken = True, len(ahead.blocks) + ahead.unsent, ahead.is_prefilling, None
                else:
                    ok, unsent, prefilling, taken = src.call(functools.partial(
                        _check_or_pause, eng, request_id, proto, len(spare), alive, now))
                    paused = taken is not None  # an abort from here on resumes it
                if proto.on_copied(now(), request_alive=ok, num_unsent_blocks=unsent,
                                   is_prefilling=prefilling) == P.PAUSE:
                    ahead = None  # the last stage lists the rest itself
                    if taken is None and unsent + 1 > len(spare):
                        spare += dst.try_reserve(request_id, unsent + 1 - len(spare)) or []
            elif proto.phase == P.PAUSE:
                if taken is None:  # else paused at the check's boundary, with room for the rest
                    spare += _top_up(request_id, eng, src, dst, proto, len(spare), alive)
                snapshot = _last_stage(request_id, src, dst, sender, proto, spare, alive, now, taken)
                paused = snapshot is not None
            elif proto.phase == P.COMMIT:
                _commit(request_id, src, dst, proto, snapshot, now)
    except Exception as e:  # noqa: BLE001 - any failure is an abort; the report says why
        proto.abort(f"{type(e).__name__}: {e}", now(), reasons.of_exception(e))
    finally:
        if proto.phase == P.ABORTED:  # paused_at: a last stage that failed after pausing
            _clean_up_abort(request_id, src, dst, paused or proto.paused_at is not None)
        src.llumlet.on_migration_finished(request_id, proto.phase == P.COMMITTED)
    return proto.report()


def _is_alive(eng: Any, request_id: str, preemptions0: int) -> Callable[[], bool]:
    """At a source boundary: whether the request still runs (or is paused) as when its
    migration began, never preempted since."""
    def alive() -> bool:
        st = _state(eng, request_id)
        return st is not None and st[1] == preemptions0 and st[0] in (RequestStatus.RUNNING, RequestStatus.PAUSED)

    return alive


def _open(request_id: str, src: SourceServer, dst: Destination, config: MigrationConfig, now: Callable[[], float],
          state: tuple[RequestStatus, int] | None, marks: dict[str, float] | None) -> tuple[MigrationProtocol, int]:
    """After the migration's first source boundary (``_start``, ``state``): its protocol
    (aborted if the request is gone; with the caller's ``marks``) and the request's
    preemption count then."""
    eng = src.engine
    status0, preemptions0 = state if state is not None else (RequestStatus.RUNNING, 0)
    proto = MigrationProtocol(request_id, src.instance_id, dst.instance_id, config, now(),
                              has_kv=status0 == RequestStatus.RUNNING,
                              bytes_per_block=eng.executor.bytes_per_block)
    proto.marks.update(marks or {})
    if state is None:
        # Picked at one boundary, gone by the next: it finished (or was aborted) between
        # the two. Nothing was started on either side.
        proto.abort(f"the request finished before its migration began ({request_id} is not on "
                    f"{src.instance_id})", now(), reasons.SOURCE_FINISHED)
    return proto, preemptions0


@dataclass(frozen=True)
class _Paused:
    """Following a prefill: ``_pause_at_boundary``'s work, done by ``_next_blocks`` at the
    boundary right after the request's first token, with prompt work waiting there."""
    taken: tuple[float, list[int], Any, Request]


@dataclass(frozen=True)
class _Chunk:
    blocks: list[int]
    """The next pre-copy stage's (full) blocks."""
    need: int
    """Destination blocks the rest of the migration needs, reserved at once."""
    is_prefilling: bool
    unsent: int
    """Blocks of the table after ``blocks``."""


def _next_blocks(request_id: str, eng: Any, src: SourceServer, proto: MigrationProtocol,
                 alive: Callable[[], bool], now: Callable[[], float], offset: int) -> _Chunk | _Paused | None:
    """Following a prefill: the next pre-copy stage, read at a source step boundary
    (``offset``: blocks being copied, not yet counted as sent), or None if the request is
    gone (or the migration timed out). While the request prefills, this waits at the
    boundaries (one a step, on the step thread: ``call_until``) for its next finished
    chunk. At the boundary right after its first token, with prompt work waiting there
    (its next steps would be prefill chunks), the request is paused at once (``_Paused``):
    the last stage sends only the tail; without, its tail is pre-copied while it decodes,
    as in any live migration."""
    def poll() -> _Chunk | _Paused | None | bool:
        if not alive():
            return None
        req = eng.requests[request_id]
        done = proto.num_blocks_done + offset
        if req.output_token_ids and _prompt_work_waits(eng, req):
            taken = _pause_at_boundary(eng, request_id, done, alive, now)
            return None if taken is None else _Paused(taken)
        blocks = eng.blocks_since(request_id, done, full_only=True)
        if not req.output_token_ids and not blocks:
            return False  # its next chunk is computing
        # the whole table (a prompt's blocks are allocated at admission) and a block of growth
        need = len(eng.blocks_since(request_id, done)) + 1
        return _Chunk(blocks, need, not req.output_token_ids, need - 1 - len(blocks))

    try:
        return cast("_Chunk | _Paused | None", src.call_until(poll, proto.time_left(now())))
    except TimeoutError:
        return None


_First = tuple[list[int], list[int], list[int]] | _Paused | _Chunk | None
"""What a migration's first stage starts from, read at its first source boundary (``_start``)."""


def _prompt_work_waits(eng: Any, req: Request) -> bool:
    sched = eng.scheduler
    return bool(sched.waiting) or any(r is not req and not r.output_token_ids for r in sched.running)


def _abort_gone(proto: MigrationProtocol, now: Callable[[], float]) -> None:
    late = proto.is_timed_out(now())
    proto.abort("timeout" if late else "the request finished, was aborted or was preempted", now(),
                reasons.TIMEOUT if late else reasons.SOURCE_FINISHED)


def _plain_blocks(request_id: str, eng: Any, src: SourceServer, proto: MigrationProtocol,
                  alive: Callable[[], bool]) -> _Chunk | None:
    """A live pre-copy stage's full blocks (None: the request is gone)."""
    def read() -> _Chunk | None:
        if not alive():
            return None
        blocks = eng.blocks_since(request_id, proto.num_blocks_done, full_only=True)
        return _Chunk(blocks, len(blocks), False, 0)

    return cast("_Chunk | None", src.call(read))


def _take(request_id: str, dst: Destination, spare: list[int], n: int, need: int) -> list[int] | None:
    """``n`` destination blocks for a stage, from those reserved ahead (``spare``, taken
    in table order) and, if short, a reservation of ``need`` less what is spare."""
    if len(spare) < n:
        more = dst.try_reserve(request_id, max(n, need) - len(spare))
        if more is None:
            return None
        spare += more
    ids = spare[:n]
    del spare[:n]
    return ids


def _after_stage(eng: Any, request_id: str, proto: MigrationProtocol) -> tuple[bool, int, bool]:
    """The post-stage check at a source boundary (request alive): (True, blocks of its
    table not yet sent after this stage, whether it is still prefilling)."""
    unsent = len(eng.blocks_since(request_id, 0)) - proto.num_blocks_done - len(proto.pending_blocks)
    return True, unsent, not eng.requests[request_id].output_token_ids


def _check_or_pause(eng: Any, request_id: str, proto: MigrationProtocol, num_spare: int, alive: Callable[[], bool],
                    now: Callable[[], float]) -> tuple[bool, int, bool, tuple[float, list[int], Any, Request] | None]:
    """The post-stage check at a source boundary, as ``_after_stage`` (``(False, 0, False)``
    if the request is gone), and ``merge_boundaries``: when the next stage is the last and
    the blocks reserved ahead hold the rest, that stage's pause at this very boundary
    (``_pause_at_boundary``'s work), not at a later one after a top-up."""
    if not alive():
        return False, 0, False, None
    ok, unsent, prefilling = _after_stage(eng, request_id, proto)
    if not (proto.config.merge_boundaries and not prefilling and unsent <= num_spare
            and proto.is_last_next(unsent)):
        return ok, unsent, prefilling, None
    done = proto.num_blocks_done + len(proto.pending_blocks)  # this stage's blocks are the destination's now
    return ok, unsent, prefilling, _pause_at_boundary(eng, request_id, done, alive, now)


def _start(eng: Any, request_id: str, config: MigrationConfig, now: Callable[[], float],
           ) -> tuple[tuple[RequestStatus, int] | None, _First]:
    """At the migration's first source boundary: the request's state, and what its first
    stage starts from (``_cache_snapshot``; ``_Paused`` following a prefill whose first
    token is just out with prompt work waiting; else a running request's first stage,
    ``_Chunk``)."""
    state = _state(eng, request_id)
    req = eng.requests.get(request_id)
    follow = config.follow_prefill
    if follow and state is not None and state[0] == RequestStatus.RUNNING and req.output_token_ids \
            and _prompt_work_waits(eng, req):
        taken = _pause_at_boundary(eng, request_id, 0, lambda: True, now)
        assert taken is not None
        return state, _Paused(taken)
    if config.merge_boundaries and not follow and eng.kv.prefix is None and state is not None and state[0] == RequestStatus.RUNNING:
        # the whole table and a block reserved at once, so the post-stage check can pause it
        need = len(eng.kv.block_table(request_id)) + 1
        blocks = eng.blocks_since(request_id, 0, full_only=True)  # _plain_blocks' first, a boundary sooner
        return state, _Chunk(blocks, need, False, need - 1 - len(blocks))
    return state, _cache_snapshot(eng, request_id)


def _cache_snapshot(eng: Any, request_id: str) -> tuple[list[int], list[int], list[int]] | None:
    """With prefix caching, a running request's tokens and full computed blocks (its first
    stage's), read at the migration's first boundary."""
    req = eng.requests.get(request_id)
    if eng.kv.prefix is None or req is None or req.status != RequestStatus.RUNNING:
        return None
    return req.prompt_token_ids, list(req.output_token_ids), eng.blocks_since(request_id, 0, full_only=True)


def _first_stage_with_cache(request_id: str, eng: Any, dst: Destination, proto: MigrationProtocol,
                            got: tuple[list[int], list[int], list[int]] | None, now: Callable[[], float]) -> None:
    """Prefix caching (the source's setting stands for the cluster's): the first pre-copy
    stage, begun with the keys of the request's full computed blocks (``got``: its tokens
    and those blocks, read at the migration's first boundary). The destination adopts the
    leading ones its cache holds, which are never sent, and reserves the rest; one
    boundary on each side, as a plain first stage. The keys are hashed off the step
    thread, from a copy of the tokens taken at the boundary."""
    if got is None or proto.phase != P.RESERVE or not got[2]:
        return  # the loop's first stage finds the request gone, or sends its one partial block
    prompt, output, table = got
    reserved = dst.try_reserve_with_cache(request_id, sequence_keys(prompt, output, len(table), eng.kv.block_size))
    if reserved is not None:
        proto.on_cached(reserved[0])
        if proto.num_blocks_done == len(table) and proto.config.follow_prefill and not output:
            return  # all adopted, still prefilling: the loop waits for its next chunk (never pause mid-prefill)
    if proto.begin_stage(table[proto.num_blocks_done:], now()) == P.RESERVE:  # else all adopted: PAUSE
        proto.on_reserved(None if reserved is None else reserved[1], now())


def _top_up(request_id: str, eng: Any, src: SourceServer, dst: Destination, proto: MigrationProtocol,
            num_spare: int, alive: Callable[[], bool], max_rounds: int = 3) -> list[int]:
    """Reserve, before pausing, enough destination blocks for everything the last stage
    will send: the request kept decoding while the spare blocks were being reserved (a
    reservation waits for the destination's step boundary), and a reservation inside
    the last stage would add that wait to the downtime. One block of margin covers the
    one step that may still run before the pause."""
    def unsent() -> int | None:
        return cast("int | None", src.call(lambda: len(eng.blocks_since(request_id, proto.num_blocks_done))
                                          if alive() else None))

    more: list[int] = []
    growth, now_unsent = 0, unsent()
    for _ in range(max_rounds):
        if now_unsent is None:
            break  # it ended: the last stage finds it gone and aborts, with nothing reserved here
        need = now_unsent + 1 + growth - num_spare - len(more)
        if need <= 0:
            break
        got = dst.try_reserve(request_id, need)
        if got is None:
            break  # the last stage will ask again, or abort
        more += got
        before, now_unsent = now_unsent, unsent()
        growth = max(growth, (now_unsent or 0) - before)  # blocks decoded during one reservation
    return more


def _pause_at_boundary(eng: Any, request_id: str, done: int, alive: Callable[[], bool],
                       now: Callable[[], float]) -> tuple[float, list[int], Any, Request] | None:
    """At a source step boundary: pause the request, list the blocks after the first
    ``done`` (those the destination has, or is being sent), gather them and snapshot it
    (None if it ended)."""
    paused_at = now()  # the request's last step on the source has just ended
    if not alive():
        return None
    eng.pause_request(request_id)
    rest = eng.blocks_since(request_id, done)
    data = eng.executor.gather_blocks(rest) if rest else b""
    return paused_at, rest, data, eng.snapshot_request(request_id)


def _last_stage(request_id: str, src: SourceServer, dst: Destination, sender: KVSender,
                proto: MigrationProtocol, spare: list[int], alive: Callable[[], bool],
                now: Callable[[], float], taken: tuple[float, list[int], Any, Request] | None = None,
                ) -> Request | None:
    """Stop and copy. Everything the source must do happens at ONE step boundary
    (pause, list the rest, gather it, snapshot), so the pause costs no extra
    steps; the destination already holds spare blocks, so no reserve round trip
    is needed unless the request outgrew them. ``taken``: that boundary's work,
    done already (following a prefill). Returns the paused request's snapshot
    (None if it ended before it could be paused)."""
    eng = src.engine
    got = taken if taken is not None else src.call(lambda: _pause_at_boundary(eng, request_id, proto.num_blocks_done, alive, now))
    if got is None:
        proto.on_paused(now(), request_alive=False)
        return None
    paused_at, rest, data, snap = got
    assert isinstance(snap, Request)
    proto.on_paused(paused_at, request_alive=True)
    proto.marks["boundary_done"] = now()
    proto.begin_stage(rest, now())
    ids: list[int] | None = spare[:len(rest)]
    if ids is not None and len(ids) < len(rest):
        more = dst.try_reserve(request_id, len(rest) - len(ids))
        ids = None if more is None else ids + more
    if proto.on_reserved(ids, now()) == P.COPY:
        assert ids is not None
        if rest and not sender.send(request_id, ids, KVSource(eng.executor, rest, data), urgent=True):
            proto.abort("the destination refused the KV", now(), reasons.KV_REFUSED)
        else:
            proto.on_copied(now(), request_alive=True, num_unsent_blocks=0)
            proto.marks["last_copy_done"] = now()
    return snap


def _state(eng: Any, request_id: str) -> tuple[RequestStatus, int] | None:
    req = eng.requests.get(request_id)
    return None if req is None else (req.status, req.num_preemptions)


def _commit(request_id: str, src: SourceServer, dst: Destination, proto: MigrationProtocol,
            snapshot: Request | None, now: Callable[[], float]) -> None:
    eng = src.engine
    if snapshot is not None:  # paused with its KV sent
        sent = now()
        queued = dst.install(snapshot)  # raises -> abort -> resumed on the source
        acked = now()
        if isinstance(queued, float):
            proto.marks["dst_queued"] = queued  # the destination's clock
        proto.on_committed(acked)
        src.call(lambda: eng.remove_request(request_id))
        _await_first_step(request_id, dst, proto, sent, acked)
        return
    # Metadata only: take the queued request off the source first, so it is never in two
    # queues; put it back if the destination will not take it.
    snap = src.call(lambda: eng.remove_request(request_id)
                    if eng.requests.get(request_id) is not None
                    and eng.requests[request_id].status == RequestStatus.WAITING else None)
    if snap is None:
        proto.abort("the queued request was scheduled or ended meanwhile", now(), reasons.SOURCE_FINISHED)
        return
    try:
        dst.install(snap)
    except Exception:
        src.call(lambda: eng.install_request(snap))
        raise
    proto.on_committed(now())


def _await_first_step(request_id: str, dst: Destination, proto: MigrationProtocol, sent: float,
                      acked: float) -> None:
    """End the committed request's downtime at the destination's first step with it (the
    module's diagram), on this side's clock. Unseen (it left first, or the destination
    stopped answering): the report's downtime stays at the commit, a lower bound."""
    first_step = getattr(dst, "first_step", None)
    if first_step is None:
        return
    try:
        got = first_step(request_id, proto.config.timeout_s)
    except Exception as e:  # noqa: BLE001 - committed already; only the measure is lost
        log.warning("migration of %s: no first step from %s: %r", request_id, dst.instance_id, e)
        return
    if got is not None:
        inside, to_step = got
        proto.on_resumed(sent + max(0.0, (acked - sent) - inside) / 2 + to_step)


def _clean_up_abort(request_id: str, src: SourceServer, dst: Destination, paused: bool) -> None:
    # A dead destination's watchdog frees the reservation; the source is what matters here.
    with contextlib.suppress(Exception):
        dst.release(request_id)
    if paused:
        eng = src.engine
        src.call(lambda: eng.resume_request(request_id)
                 if request_id in eng.requests and eng.requests[request_id].status == RequestStatus.PAUSED
                 else None)
