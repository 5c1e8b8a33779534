"""The KV transport interface every backend (tcp, gloo, ray) implements.

The source hands a sender the blocks to move (``KVSource``) and the
destination's block ids; the sender returns once the destination has written
them (True) or refused them (False), and raises ``TransportError`` when the
peer is gone. Pre-copy stages are *bulk*: they overlap decoding, so they run
on a low-priority thread and may be paced. The last stage is *urgent*: the
request is paused, so it goes at once, at normal priority.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from llumnix.migration.kv_io import block_views, gather, lower_thread_priority

T = TypeVar("T")
TRANSPORTS = ("tcp", "gloo", "ray")


class TransportError(RuntimeError):
    """The peer is gone, refused us, or spoke out of turn."""


@dataclass(frozen=True)
class TransportOptions:
    bulk_nice: int = 19
    """OS nice value of the threads that copy pre-copy stages (0 = normal priority)."""
    bulk_idle: bool = True
    """Also run those threads in Linux's ``SCHED_IDLE`` class: only on a core that
    would otherwise idle (stronger than nice 19, which still takes time slices). On
    two busy CPU instances the co-running decode slowdown was a median of +5.6% over
    six runs against +8.5% over three at nice 19 (run medians 2.2-10.5% against
    7.8-9.5%; benchmarks/results/migration-bulk-idle-ab.json, measured before the
    transport's vectored calls and with the benchmark's earlier estimator; now
    +3.0% pooled over three runs, migration-gil-ab.json). A copy starved for ``timeout_s``
    aborts its migration, and the request stays where it was."""
    bulk_rate_bytes_per_s: float | None = None
    """Pace pre-copy stages to at most this many bytes per second (None: as fast as allowed)."""
    timeout_s: float = 30.0
    """Any single send, receive or acknowledgement waits at most this long."""
    chunk_bytes: int = 1 << 20
    """Bulk copies go out in pieces of about this size (the pacing unit)."""
    max_connections: int = 256
    """A TCP receiver serves at most this many authenticated connections at once (each
    source holds two), a thread each; further ones are closed once they prove the token.
    Connections not yet authenticated never take one of these slots (``net/gate.py``)."""
    handshake_timeout_s: float = 5.0
    """A TCP connection that has not authenticated within this long of its accept is
    closed, however slowly it trickles bytes."""
    max_pending_handshakes: int = 1024
    """Unauthenticated connections a TCP receiver holds at once; past it the oldest is closed."""
    max_handshakes_per_peer: int = 64
    """Unauthenticated connections from one address held at once; past it its oldest is closed."""

    def lower_bulk_thread(self) -> None:
        """Give the calling thread, one dedicated to bulk copies, the bulk priority."""
        lower_thread_priority(self.bulk_nice, self.bulk_idle)


@dataclass
class KVSource:
    """Blocks to send from the source's cache; ``data`` if already gathered."""

    executor: Any
    block_ids: list[int]
    data: memoryview | bytes | None = None

    @property
    def nbytes(self) -> int:
        return len(self.data) if self.data is not None else len(self.block_ids) * self.executor.bytes_per_block

    def views(self) -> list[memoryview]:
        """Pieces in gather order: views of the cache itself where possible."""
        if self.data is not None:
            return [memoryview(self.data)]
        return block_views(self.executor, self.block_ids) or [gather(self.executor, self.block_ids)]

    def contiguous(self) -> memoryview:
        return memoryview(self.data) if self.data is not None else gather(self.executor, self.block_ids)


class KVSender(Protocol):
    name: str

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool: ...

    def close(self) -> None: ...


class BulkWorker:
    """One long-lived low-priority thread that runs bulk copies; callers wait with a timeout."""

    def __init__(self, options: TransportOptions, name: str) -> None:
        self._options = options
        self._jobs: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self._cv = threading.Condition()
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name=name).start()

    def run(self, fn: Callable[[], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise TransportError("transport closed")
            self._jobs.append((fn, fut))
            self._cv.notify()
        try:
            return fut.result(self._options.timeout_s * 4)
        except concurrent.futures.TimeoutError as e:
            raise TransportError("bulk copy timed out") from e

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        self._options.lower_bulk_thread()
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                fn, fut = self._jobs.pop(0)
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                    fut.set_exception(e)


class Pacer:
    """Sleeps so that bytes go out at no more than ``rate`` per second."""

    def __init__(self, rate: float | None) -> None:
        self._rate = rate
        self._start = time.monotonic()
        self._sent = 0

    def sent(self, n: int) -> None:
        if not self._rate:
            return
        self._sent += n
        ahead = self._sent / self._rate - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)


def split(views: list[memoryview], chunk: int) -> list[memoryview]:
    """The same bytes as pieces of at most ``chunk`` bytes (for pacing)."""
    out: list[memoryview] = []
    for v in views:
        out.extend(v[i:i + chunk] for i in range(0, len(v), chunk))
    return out


@dataclass(frozen=True)
class KVLimits:
    """A destination cache's geometry: what one write into it can cover at most. A sink
    may expose it as ``kv_limits``; receivers then refuse, unread, any frame beyond it."""

    num_blocks: int
    """Blocks in the cache; block ids run from 0 to ``num_blocks - 1``."""
    bytes_per_block: int
    """Bytes of one block across all layers (K and V)."""


class KVSink(Protocol):
    """The destination side every receiver writes through (``DestinationEndpoint``).
    It may also have a ``kv_limits`` attribute (``KVLimits``), which bounds the frames a
    receiver reads for it."""

    def begin_write(self, request_id: str, block_ids: list[int], nbytes: int) -> list[memoryview] | None:
        """Writable pieces (in gather order) for the payload, or None: refused.
        Only blocks reserved for this very request are ever handed out."""
        ...

    def end_write(self, request_id: str, block_ids: list[int], pieces: list[memoryview], ok: bool) -> bool:
        """The payload is in ``pieces`` (if ``ok``); finish the write and release the request's guard."""
        ...

    def write(self, request_id: str, block_ids: list[int], data: memoryview | bytes) -> bool:
        """A whole payload already in memory (gloo, ray): validate and scatter it."""
        ...
