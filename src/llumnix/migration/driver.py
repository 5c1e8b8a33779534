"""Drives one live migration: the source side of the protocol over a real
transport. Every engine touch runs at a step boundary of the source
(``src.call``) or the destination (its own ``Destination`` implementation);
copies travel while the source keeps decoding.

Invariant after any outcome: the request lives in exactly one place (the
destination after COMMITTED, the source after ABORTED if the source is
alive), and both block pools are exact (the destination frees its
reservation on abort).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from llumnix.core.request import Request, RequestStatus
from llumnix.migration.protocol import MigrationConfig, MigrationPhase, MigrationProtocol, MigrationReport
from llumnix.migration.tcp_transport import KVSender

P = MigrationPhase


class SourceServer(Protocol):
    instance_id: str
    engine: Any
    llumlet: Any

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any: ...


class Destination(Protocol):
    instance_id: str

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None: ...

    def release(self, request_id: str) -> int: ...

    def install(self, snapshot: Request) -> None: ...


def migrate(request_id: str, src: SourceServer, dst: Destination, sender: KVSender,
            config: MigrationConfig, now: Callable[[], float] = time.monotonic) -> MigrationReport:
    eng = src.engine
    start = src.call(lambda: _state(eng, request_id))
    if start is None:
        raise KeyError(f"{request_id} is not on {src.instance_id}")
    status0, preemptions0 = start
    proto = MigrationProtocol(request_id, src.instance_id, dst.instance_id, config, now(),
                              has_kv=status0 == RequestStatus.RUNNING,
                              bytes_per_block=eng.executor.bytes_per_block)
    src.llumlet.on_migration_started(request_id)
    paused = False

    def alive() -> bool:
        st = _state(eng, request_id)
        return st is not None and st[1] == preemptions0 and st[0] in (RequestStatus.RUNNING, RequestStatus.PAUSED)

    try:
        while not proto.phase.is_done:
            if proto.is_timed_out(now()):
                proto.abort("timeout", now())
                break
            if proto.phase == P.RESERVE:
                full_only = not proto.is_last_stage
                blocks = src.call(lambda fo=full_only: eng.blocks_since(request_id, proto.num_blocks_sent,
                                                                         full_only=fo) if alive() else [])
                if proto.begin_stage(blocks, now()) == P.RESERVE:
                    proto.on_reserved(dst.try_reserve(request_id, len(blocks)), now())
            elif proto.phase == P.COPY:
                data = src.call(lambda: bytes(eng.executor.gather_blocks(proto.pending_blocks)))
                if not sender.send({"request_id": request_id, "block_ids": proto.stages[-1].dst_block_ids},
                                   data):
                    proto.abort("the destination refused the KV", now())
                    continue
                ok, unsent = src.call(lambda: (alive(), len(eng.blocks_since(request_id, 0)) -
                                               proto.num_blocks_sent - len(proto.pending_blocks))
                                      if alive() else (False, 0))
                proto.on_copied(now(), request_alive=ok, num_unsent_blocks=unsent)
            elif proto.phase == P.PAUSE:
                paused = src.call(lambda: _pause_if_alive(eng, request_id, alive))
                proto.on_paused(now(), request_alive=paused)
            elif proto.phase == P.COMMIT:
                _commit(request_id, src, dst, proto, paused, now)
    except Exception as e:  # noqa: BLE001 - any failure is an abort; the report says why
        proto.abort(f"{type(e).__name__}: {e}", now())
    finally:
        if proto.phase == P.ABORTED:
            _clean_up_abort(request_id, src, dst, paused)
        src.llumlet.on_migration_finished(request_id, proto.phase == P.COMMITTED)
    return proto.report()


def _state(eng: Any, request_id: str) -> tuple[RequestStatus, int] | None:
    req = eng.requests.get(request_id)
    return None if req is None else (req.status, req.num_preemptions)


def _pause_if_alive(eng: Any, request_id: str, alive: Callable[[], bool]) -> bool:
    if not alive():
        return False
    eng.pause_request(request_id)
    return True


def _commit(request_id: str, src: SourceServer, dst: Destination, proto: MigrationProtocol,
            paused: bool, now: Callable[[], float]) -> None:
    eng = src.engine
    if paused:
        snap = src.call(lambda: eng.snapshot_request(request_id))
        dst.install(snap)  # raises -> abort -> resumed on the source
        proto.on_committed(now())
        src.call(lambda: eng.remove_request(request_id))
        return
    # Metadata only: take the queued request off the source first, so it is never in two
    # queues; put it back if the destination will not take it.
    snap = src.call(lambda: eng.remove_request(request_id)
                    if eng.requests.get(request_id) is not None
                    and eng.requests[request_id].status == RequestStatus.WAITING else None)
    if snap is None:
        proto.abort("the queued request was scheduled or ended meanwhile", now())
        return
    try:
        dst.install(snap)
    except Exception:
        src.call(lambda: eng.install_request(snap))
        raise
    proto.on_committed(now())


def _clean_up_abort(request_id: str, src: SourceServer, dst: Destination, paused: bool) -> None:
    # A dead destination's watchdog frees the reservation; the source is what matters here.
    with contextlib.suppress(Exception):
        dst.release(request_id)
    if paused:
        eng = src.engine
        src.call(lambda: eng.resume_request(request_id)
                 if request_id in eng.requests and eng.requests[request_id].status == RequestStatus.PAUSED
                 else None)
