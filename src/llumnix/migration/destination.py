"""The destination side of migration for one instance: reservations, the KV
receiver that writes incoming blocks at a step boundary, installs, and a
watchdog that frees reservations a dead or stuck source never committed."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from llumnix.core.request import Request
from llumnix.migration.tcp_transport import KVReceiver


class DestinationEndpoint:
    def __init__(self, server: Any, token: bytes, *, reservation_timeout_s: float = 30.0,
                 host: str = "127.0.0.1", now: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.instance_id: str = server.instance_id
        self._now = now
        self._timeout = reservation_timeout_s
        self._reserved_at: dict[str, float] = {}
        self._lock = threading.Lock()
        # Held while KV is written, and by release/install: blocks are never freed or
        # handed to a running request under a write in flight.
        self._kv_lock = threading.Lock()
        self.receiver = KVReceiver(token, self._on_kv, host=host)
        self._stop = threading.Event()
        threading.Thread(target=self._watchdog, daemon=True, name=f"reaper-{self.instance_id}").start()

    @property
    def address(self) -> tuple[str, int]:
        return self.receiver.address

    def close(self) -> None:
        self._stop.set()
        self.receiver.close()

    # -- the Destination protocol --------------------------------------------------
    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        eng = self.server.engine
        got = self.server.call(lambda: eng.try_reserve(request_id, num_blocks))
        if got is not None:
            with self._lock:
                self._reserved_at[request_id] = self._now()
        return got

    def release(self, request_id: str) -> int:
        with self._lock:
            self._reserved_at.pop(request_id, None)
        eng = self.server.engine
        with self._kv_lock:
            return self.server.call(lambda: eng.release_reservation(request_id))

    def install(self, snapshot: Request) -> None:
        eng = self.server.engine
        with self._kv_lock:
            self.server.call(lambda: eng.install_request(snapshot))
        with self._lock:
            self._reserved_at.pop(snapshot.request_id, None)

    # -- KV in ---------------------------------------------------------------------
    def _on_kv(self, header: dict[str, Any], payload: memoryview) -> bool:
        rid, ids = str(header["request_id"]), [int(b) for b in header["block_ids"]]
        eng = self.server.engine
        # Written without waiting for a step boundary: reserved blocks belong to no
        # running request, so the forward pass never touches them; the lock keeps
        # them reserved until the write is done. Only blocks reserved for this very
        # request are accepted, so a sender cannot overwrite anyone else's KV.
        with self._kv_lock:
            if not eng.kv.is_reserved(rid) or not set(ids) <= set(eng.kv.block_table(rid)):
                return False
            eng.executor.scatter_blocks(ids, payload)
            return True

    def _watchdog(self) -> None:
        while not self._stop.wait(min(1.0, self._timeout / 4)):
            now = self._now()
            with self._lock:
                stale = [r for r, t in self._reserved_at.items() if now - t > self._timeout]
            for rid in stale:
                self.release(rid)
