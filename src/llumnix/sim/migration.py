"""Drives one live migration through the shared MigrationProtocol in virtual time.

The protocol decides; this driver performs each action on the two engines and
reports back::

    RESERVE  dst.try_reserve(blocks since the last stage)   refused -> abort
             (with prefix caching the first one is dst.try_reserve_with_cache: the
             leading blocks the destination caches are adopted, never sent)
    COPY     a MIGRATION_STAGE event after handshake + bytes / bandwidth,
             while the source keeps decoding (both sides pay the decode slowdown)
    check    finished or preempted meanwhile -> abort; few blocks left or stage
             limit -> PAUSE; otherwise the next pre-copy stage
    PAUSE    at the source's next step boundary: pause_request
    last     RESERVE + COPY of the rest (+ commit cost)
    COMMIT   src.remove_request -> dst.install_request (the request object moves)
    resumed  the destination's next step that takes the request begins: the downtime,
             as the real driver's, runs from PAUSE to here (the last stage, and the
             wait for the destination's current step to end)

An abort frees the destination's reservation and resumes the request on the source.
"""
from __future__ import annotations

from collections.abc import Callable

from llumnix.core.request import RequestStatus
from llumnix.kv.prefix_cache import sequence_keys
from llumnix.migration.protocol import MigrationConfig, MigrationPhase, MigrationProtocol, MigrationReport
from llumnix.sim.events import Event, EventKind
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import MigrationCost

P = MigrationPhase


class MigrationRun:
    def __init__(self, src: SimInstance, dst: SimInstance, request_id: str, config: MigrationConfig,
                 cost: MigrationCost, now: float,
                 on_done: Callable[[MigrationRun, float], list[Event]]) -> None:
        self.src, self.dst, self.request_id = src, dst, request_id
        self.cost = cost
        self.on_done = on_done
        req = src.engine.requests[request_id]
        self._preemptions = req.num_preemptions
        self._was_waiting = req.status == RequestStatus.WAITING
        self.protocol = MigrationProtocol(
            request_id, src.instance_id, dst.instance_id, config, now,
            has_kv=not self._was_waiting, bytes_per_block=cost.bytes_per_block)
        self._copying = False
        self._first_ids: list[int] | None = None  # the first stage's, reserved with the cache
        self._on_report: Callable[[MigrationReport], None] | None = None
        self._left_unstepped = False  # moved on from the destination before any step there
        src.migrations_out[request_id] = self
        dst.migrations_in[request_id] = self

    # -- checks ------------------------------------------------------------------
    def _alive(self) -> bool:
        """Still on the source, not finished, aborted or preempted since the start."""
        req = self.src.engine.requests.get(self.request_id)
        if req is None or req.num_preemptions != self._preemptions:
            return False
        if self._was_waiting:
            return req.status == RequestStatus.WAITING
        return req.status in (RequestStatus.RUNNING, RequestStatus.PAUSED)

    # -- driving -----------------------------------------------------------------
    def start(self, now: float) -> list[Event]:
        if self.protocol.phase == P.COMMIT:  # queued: metadata only, one handshake
            return [Event(now + self.cost.stage_overhead_s, EventKind.MIGRATION_STAGE, self)]
        self._reserve_with_cache()
        return self._advance(now)

    def _reserve_with_cache(self) -> None:
        """As the real driver's first stage: the destination adopts the leading blocks it
        caches and reserves the rest of the full ones."""
        src_kv = self.src.engine.kv
        if src_kv.prefix is None or self.protocol.phase != P.RESERVE:
            return
        req = self.src.engine.requests[self.request_id]
        full = len(self.src.engine.blocks_since(self.request_id, 0, full_only=True))
        if full:
            keys = sequence_keys(req.prompt_token_ids, req.output_token_ids, full, src_kv.block_size)
            got = self.dst.engine.try_reserve_with_cache(self.request_id, keys)
            if got is not None:
                self.protocol.on_cached(got[0])
                self._first_ids = got[1]

    def _advance(self, now: float) -> list[Event]:
        proto, src, dst, rid = self.protocol, self.src, self.dst, self.request_id
        while True:
            phase = proto.phase
            if phase == P.RESERVE:
                last = proto.is_last_stage
                blocks = src.engine.blocks_since(rid, proto.num_blocks_done, full_only=not last)
                ids, self._first_ids = self._first_ids, None
                if proto.begin_stage(blocks, now) == P.PAUSE:
                    continue  # everything full was adopted (ids is empty)
                if ids is None:
                    ids = dst.engine.try_reserve(rid, len(blocks))
                if proto.on_reserved(ids, now) == P.ABORTED:
                    continue
                self._copying = True
                src.executor.begin_copy()
                dst.executor.begin_copy()
                t = self.cost.stage_time(len(blocks), is_last=last,
                                         num_request_blocks=src.engine.kv.num_blocks_of(rid),
                                         blocking=proto.config.max_stages == 1)
                return [Event(now + t, EventKind.MIGRATION_STAGE, self)]
            if phase == P.PAUSE:
                if src.is_busy:
                    src.at_boundary.append(self._pause)
                    return []
                return self._pause(now)
            if phase == P.COMMIT:
                return self._commit(now)
            return self._finish(now)  # ABORTED (COMMITTED is reached only in _commit)

    def on_stage_done(self, now: float) -> list[Event]:
        proto = self.protocol
        if proto.phase.is_done:
            return []  # aborted from outside while the stage ran
        if proto.phase == P.COMMIT:  # the metadata hand-over of a queued request
            if not self._alive():
                proto.abort("the request was admitted or ended before the hand-over", now)
                return self._finish(now)
            return self._commit(now)
        self._stop_copying()
        if proto.is_timed_out(now):
            proto.abort("timeout", now)
            return self._finish(now)
        alive = self._alive()
        table = self.src.engine.kv.num_blocks_of(self.request_id) if alive else 0
        proto.on_copied(now, request_alive=alive, num_unsent_blocks=max(0, table - proto.num_blocks_done))
        return self._advance(now)

    def _pause(self, now: float) -> list[Event]:
        if self.protocol.phase != P.PAUSE:
            return []
        alive = self._alive()
        if self.protocol.on_paused(now, request_alive=alive) == P.RESERVE:
            self.src.engine.pause_request(self.request_id)
        return self._advance(now)

    def _commit(self, now: float) -> list[Event]:
        src, dst, rid = self.src, self.dst, self.request_id
        # The source's copy is dropped at commit anyway, so the request object itself
        # moves; snapshot_request (a pickle round trip of the token lists, ~0.2 ms per long
        # request) would dominate migration-heavy runs.
        paused = self.protocol.paused_at is not None
        dst.engine.install_request(src.engine.remove_request(rid), self._on_resumed if paused else None)
        self.protocol.on_committed(now)
        src.note_requests_changed()
        dst.note_requests_changed()
        return self._finish(now)

    def _stop_copying(self) -> None:
        if self._copying:
            self._copying = False
            self.src.executor.end_copy()
            self.dst.executor.end_copy()

    def abort(self, reason: str, now: float) -> list[Event]:
        """Abort from outside (an instance going away); a stage in flight is ignored when it ends."""
        self.protocol.abort(reason, now)
        return self._finish(now)

    def _finish(self, now: float) -> list[Event]:
        src, dst, rid = self.src, self.dst, self.request_id
        self._stop_copying()
        if src.migrations_out.get(rid) is not self:
            return []  # already finished
        del src.migrations_out[rid]
        del dst.migrations_in[rid]
        if self.protocol.phase == P.ABORTED:
            dst.engine.release_reservation(rid)
            req = src.engine.requests.get(rid)
            if req is not None and req.status == RequestStatus.PAUSED:
                src.engine.resume_request(rid)
        events = src.wake(now) + dst.wake(now)
        return events + self.on_done(self, now)

    def on_report(self, record: Callable[[MigrationReport], None]) -> None:
        """Hand the final report to ``record``: now, or once the destination's first step
        with the committed request begins (its downtime is known then)."""
        if self.protocol.is_final or self._left_unstepped:
            record(self.protocol.report())
        else:
            self._on_report = record

    def _on_resumed(self, now: float | None) -> None:
        if now is None:
            self._left_unstepped = True
        else:
            self.protocol.on_resumed(now)
        if self._on_report is not None:
            record, self._on_report = self._on_report, None
            record(self.protocol.report())

    @property
    def is_done(self) -> bool:
        return self.protocol.phase.is_done


class OrderInFlight:
    """A migration order on its way to its source (``ClusterConfig.migration_start_s``):
    a MIGRATION_STAGE event's target, as a stage is; ``arrive(now)`` starts the migration."""

    __slots__ = ("arrive",)

    def __init__(self, arrive: Callable[[float], list[Event]]) -> None:
        self.arrive = arrive

    def on_stage_done(self, now: float) -> list[Event]:
        return self.arrive(now)
