"""The destination side of migration for one instance: reservations, KV writes
into reserved blocks (from any transport), installs through an inbox, the moment
an installed request's first step here begins (where its downtime ends), and a
watchdog that frees reservations a dead or stuck source never committed.

A request's reservation moves through::

    reserved ──write*──► claimed for install ──(next step boundary)──► running
        │                                                    install failed: freed
        └── released (abort, or the watchdog) ──► freed

Writes land without waiting for a step boundary: reserved blocks belong to no
running request, so the forward pass never touches them. A per-request guard
keeps them from being freed or installed under a write in flight, and a claimed
or released request takes no more writes, so a sender can never write into
blocks that were handed to someone else.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from llumnix.core.errors import InvalidRequestError, UnknownRequestError
from llumnix.core.request import Request
from llumnix.migration.kv_io import block_views, is_viewable, scatter, scratch
from llumnix.migration.tcp_transport import KVReceiver
from llumnix.migration.transport import BulkWorker, KVLimits, TransportOptions

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class DestinationEndpoint:
    def __init__(self, server: Any, token: bytes, *, reservation_timeout_s: float = 30.0,
                 host: str = "127.0.0.1", now: Callable[[], float] = time.monotonic,
                 options: TransportOptions | None = None) -> None:
        self.server = server
        self.instance_id: str = server.instance_id
        self.options = options or TransportOptions()
        self._now = now
        self._timeout = reservation_timeout_s
        self._token = token
        self._host = host
        self._reserved_at: dict[str, float] = {}
        self._writing: dict[str, int] = {}
        self._closed_to_writes: set[str] = set()  # claimed for install, or being released
        self._cv = threading.Condition()
        self.installed_at: dict[str, float] = {}
        """request id -> when it joined this instance's batch (monotonic; recent ones)."""
        self.failed_installs: dict[str, str] = {}
        self._arrived: dict[str, tuple[float, float]] = {}
        """Running requests installed here -> (when their install call arrived, when it
        was queued), until their source asks ``first_step``."""
        self._first_steps: dict[str, float | None] = {}
        """Running requests installed here -> when their first step here began (None:
        they left before one), until their source asks."""
        self.receiver = KVReceiver(token, self, host=host, options=self.options)
        self._gloo: list[Any] = []
        self._bulk: BulkWorker | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._watchdog, daemon=True, name=f"reaper-{self.instance_id}").start()

    @property
    def address(self) -> tuple[str, int]:
        return self.receiver.address

    @property
    def kv_limits(self) -> KVLimits:
        """This cache's geometry: the receiver refuses, unread, frames no reservation could take."""
        eng = self.server.engine
        return KVLimits(eng.kv.num_total_blocks, eng.executor.bytes_per_block)

    def close(self) -> None:
        self._stop.set()
        self.receiver.close()
        for g in self._gloo:
            g.close()
        if self._bulk is not None:
            self._bulk.close()

    # -- the Destination protocol --------------------------------------------------
    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        return self._reserve(request_id, lambda eng: eng.try_reserve(request_id, num_blocks))

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        return self._reserve(request_id, lambda eng: eng.try_reserve_with_cache(request_id, keys))

    def _reserve(self, request_id: str, op: Callable[[Any], _T | None]) -> _T | None:
        """``op(engine)`` at the step boundary, unless the request is being installed or
        released; a successful op that leaves it holding a reservation here (re)starts
        the watchdog's clock."""
        eng = self.server.engine
        with self._cv:
            if request_id in self._closed_to_writes:
                return None
        got, reserved = self.server.call(lambda: (op(eng), eng.kv.is_reserved(request_id)))
        if got is not None and reserved:
            with self._cv:
                self._reserved_at[request_id] = self._now()
        return got  # type: ignore[no-any-return]

    def release(self, request_id: str) -> int:
        eng = self.server.engine
        with self._cv:
            if not self._close_to_writes(request_id):
                return 0  # being installed: no longer ours to free
            self._reserved_at.pop(request_id, None)
        try:
            return int(self.server.call(lambda: eng.release_reservation(request_id)))
        finally:
            with self._cv:
                self._closed_to_writes.discard(request_id)

    def install(self, snapshot: Request) -> float:
        """Check the request can resume here, claim its reservation and queue it for the
        next step boundary (the inbox); returns when it was queued. From then on it is
        schedulable: the next step takes it, and nothing can free its blocks."""
        rid = snapshot.request_id
        eng = self.server.engine
        arrived = self._now()
        with self._cv:
            if rid in eng.requests:
                raise InvalidRequestError(f"request {rid} is already here")
            if snapshot.num_computed_tokens > 0:
                if not eng.kv.is_reserved(rid):
                    raise UnknownRequestError(f"no reservation for {rid}")
                need, have = eng.kv.num_blocks_for(snapshot.num_computed_tokens), eng.kv.num_blocks_of(rid)
                if have < need:
                    raise InvalidRequestError(f"{rid}: {have} blocks reserved, {need} needed")
            if not self._close_to_writes(rid):
                raise InvalidRequestError(f"{rid} is already being installed or released")
            self._reserved_at.pop(rid, None)
            self._first_steps.pop(rid, None)
        fut = self.server.run_at_boundary(lambda: self._install_now(snapshot))
        queued_at = self._now()
        err = fut.exception() if fut.done() else None
        if err is not None:  # the step thread is gone
            with self._cv:
                self._closed_to_writes.discard(rid)
            raise err
        if snapshot.num_computed_tokens > 0:
            with self._cv:
                self._arrived[rid] = (arrived, queued_at)
                _bound(self._arrived)
        return queued_at

    def first_step(self, request_id: str, timeout_s: float) -> tuple[float, float] | None:
        """For a running request installed here: (seconds from its install call's arrival
        to the call's return, seconds from that arrival to the start of its first step
        here), this instance's clock; waits up to ``timeout_s`` for that step. None if it
        left first, or no step took it in time. Asked once, by its source."""
        with self._cv:
            if request_id not in self._arrived:
                return None
            self._cv.wait_for(lambda: request_id in self._first_steps, timeout_s)
            arrived, queued = self._arrived.pop(request_id)
            stepped = self._first_steps.pop(request_id, None)
        return None if stepped is None else (queued - arrived, stepped - arrived)

    def _on_first_step(self, request_id: str, now: float | None) -> None:
        """The engine's hook (on the step thread): the request's first step here begins."""
        with self._cv:
            self._first_steps[request_id] = None if now is None else self._now()
            _bound(self._first_steps)
            self._cv.notify_all()

    def _install_now(self, snapshot: Request) -> None:
        eng, rid = self.server.engine, snapshot.request_id
        try:
            hook = (lambda t: self._on_first_step(rid, t)) if snapshot.num_computed_tokens > 0 else None
            eng.install_request(snapshot, on_first_step=hook)
            self.installed_at[rid] = self._now()
        except Exception as e:  # noqa: BLE001 - checked before the claim; never expected
            log.error("install of %s failed at the boundary: %r; its reservation is freed", rid, e)
            self.failed_installs[rid] = repr(e)
            eng.release_reservation(rid)
            self._on_first_step(rid, None)
        finally:
            with self._cv:
                self._closed_to_writes.discard(rid)
            _bound(self.installed_at)

    def num_reservations(self) -> int:
        with self._cv:
            return len(self._reserved_at)

    # -- KV in (the KVSink every transport writes through) ---------------------------
    def _open_write(self, request_id: str, block_ids: list[int], nbytes: int) -> bool:
        """Count a write into ``request_id``'s reserved blocks as in progress (an install
        waits for none to be), if the blocks are its reservation and the size fits."""
        eng = self.server.engine
        with self._cv:
            if request_id in self._closed_to_writes or not eng.kv.is_reserved(request_id) \
                    or not set(block_ids) <= set(eng.kv.block_table(request_id)) \
                    or nbytes != len(block_ids) * eng.executor.bytes_per_block:
                return False
            self._writing[request_id] = self._writing.get(request_id, 0) + 1
            if request_id in self._reserved_at:  # a reservation being written to is alive (one
                self._reserved_at[request_id] = self._now()  # followed prefill: reserved once, written per chunk)
            return True

    def _close_write(self, request_id: str) -> None:
        with self._cv:
            self._writing[request_id] -= 1
            if not self._writing[request_id]:
                del self._writing[request_id]
            self._cv.notify_all()

    def begin_write(self, request_id: str, block_ids: list[int], nbytes: int) -> list[memoryview] | None:
        if not self._open_write(request_id, block_ids, nbytes):
            return None
        views = block_views(self.server.engine.executor, block_ids)
        return views if views is not None else [scratch(nbytes)]

    def end_write(self, request_id: str, block_ids: list[int], pieces: list[memoryview], ok: bool) -> bool:
        eng = self.server.engine
        try:
            if ok and not is_viewable(eng.executor):  # a scratch buffer: scatter it once
                scatter(eng.executor, block_ids, pieces[0])
            return ok
        finally:
            self._close_write(request_id)

    def write(self, request_id: str, block_ids: list[int], data: memoryview | bytes, *,
              urgent: bool = True) -> bool:
        if not urgent:  # a pre-copy stage: scatter on the low-priority bulk thread
            if self._bulk is None:
                self._bulk = BulkWorker(self.options, f"kv-bulk-write-{self.instance_id}")
            return self._bulk.run(lambda: self.write(request_id, block_ids, data))
        if not self._open_write(request_id, block_ids, len(data)):
            return False
        try:
            scatter(self.server.engine.executor, block_ids, data)
            return True
        finally:
            self._close_write(request_id)

    def accept_gloo(self, pair_id: str, offer: Any) -> dict[str, dict[str, bytes]]:
        """Form the two-rank gloo groups a source offers (its rendezvous halves) and serve
        its KV writes; the answer is this side's halves, for the source."""
        from llumnix.migration.gloo_transport import GlooReceiver

        self._gloo = [g for g in self._gloo if g.is_alive]
        receiver = GlooReceiver(pair_id, offer, self, self._token, self.options, local_host=self._host)
        self._gloo.append(receiver)
        return receiver.answer

    # -- internals ---------------------------------------------------------------------
    def _close_to_writes(self, request_id: str) -> bool:
        """Refuse further writes to ``request_id`` and wait out the ones in flight
        (caller holds ``_cv``). False if someone else already closed it."""
        if request_id in self._closed_to_writes:
            return False
        self._closed_to_writes.add(request_id)
        deadline = time.monotonic() + self.options.timeout_s
        while self._writing.get(request_id):
            if not self._cv.wait(max(0.0, deadline - time.monotonic())):
                break  # a receiver stuck past its own socket timeout: its peer is gone
        return True

    def _watchdog(self) -> None:
        while not self._stop.wait(min(1.0, self._timeout / 4)):
            now = self._now()
            with self._cv:
                stale = [r for r, t in self._reserved_at.items() if now - t > self._timeout]
            for rid in stale:
                try:
                    if self.release(rid):
                        log.warning("freed the reservation of %s: its source never committed", rid)
                except Exception:  # noqa: BLE001 - the instance is stopping
                    log.debug("watchdog release failed", exc_info=True)


def _bound(records: dict[str, Any], most: int = 1024) -> None:
    """Keep the ``most`` newest of ``records`` (a source that died never asks for its)."""
    while len(records) > most:
        records.pop(next(iter(records)))
