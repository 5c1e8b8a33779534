"""LlumSched's lines to the instances' request channels (``channel.py``): the one road by
which a status reaches LlumSched, as it reaches the gateways (issue 44). Ray calls carry
registration (an instance's handle and role, ``announce.py``) and commands only.

A Ray call costs LlumSched about a millisecond of CPU (1.0-1.2 ms a push, measured); a
status read here about a third of that. The line asks for a status at most twice a
rescheduling round (one a second idle, as every channel): a round decides on statuses
at most half a round old, at a cadence LlumSched sets. With ``urgent_marks`` (triggered
rescheduling) it also gets at once each status whose marks (``policy/trigger.py``:
source, blocked, destination) or lifecycle (terminating, schedulable) differ from the
status before: the one that makes a source comes within the step that made it. Every
status instead would cost per request (an engine reports on each finished request): at
32 clients 0.17 ms a request against 0.005 (``benchmarks/reaction.py``). A status carries
the evicted prefix keys of every status since the last one the line took
(``InstanceServer.newest_status``).

One thread serves every line: a selector over non-blocking sockets, each connection's
bytes cut into frames by a ``ClientEnd``. A line is reopened when it breaks or falls
silent (instances send a status each second even while idle)."""
from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from llumnix.cluster.channel import ClientEnd
from llumnix.core.status import InstanceStatus

log = logging.getLogger(__name__)

CLIENT = "llumsched"
"""The name LlumSched's lines go by on the instances' channels."""


class _Line:
    def __init__(self, instance_id: str, address: tuple[str, int]) -> None:
        self.instance_id, self.address = instance_id, address
        self.sock: socket.socket | None = None
        self.end: ClientEnd | None = None
        self.last_frame_at = 0.0
        self.retry_at = 0.0
        self.failures = 0


class StatusFeed:
    SILENCE_S = 3.0
    """A line silent this long is reopened (an idle instance sends a status each second)."""
    CONNECT_TIMEOUT_S = 2.0

    def __init__(self, token: bytes, on_statuses: Callable[[str, list[InstanceStatus]], None],
                 status_gap_s: float | None = None, urgent_marks: bool = False) -> None:
        self._token, self._on_statuses, self._gap = token, on_statuses, status_gap_s
        self._urgent_marks = urgent_marks
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._todo: queue.SimpleQueue[tuple[str, str, tuple[str, int] | None]] = queue.SimpleQueue()
        self._lines: dict[str, _Line] = {}  # the feed thread's own
        self._live: dict[str, float] = {}
        """Instance id -> when its line last brought a frame (read by any thread)."""
        self._closed = False
        self.num_frames = 0
        threading.Thread(target=self._run, daemon=True, name="status-feed").start()

    def watch(self, instance_id: str, address: tuple[str, int]) -> None:
        """Keep a line open to ``instance_id``'s channel at ``address`` (reopened if it was)."""
        self._todo.put(("watch", instance_id, address))
        self._wake()

    def drop(self, instance_id: str) -> None:
        self._todo.put(("drop", instance_id, None))
        self._wake()

    def is_live(self, instance_id: str) -> bool:
        """The line to ``instance_id`` brought a frame within ``SILENCE_S``."""
        return time.monotonic() - self._live.get(instance_id, -1e9) < self.SILENCE_S

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the feed thread --------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select(timeout=1.0):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._read(key.data)
                self._take_todo()
                self._tend(time.monotonic())
        finally:
            for line in list(self._lines.values()):
                self._close(line)
            self._sel.close()

    def _take_todo(self) -> None:
        while True:
            try:
                what, iid, address = self._todo.get_nowait()
            except queue.Empty:
                return
            if what != "watch" or address is None:
                self._live.pop(iid, None)  # before the line closes: whoever sees it closed sees it dead
            old = self._lines.pop(iid, None)
            if old is not None:
                self._close(old)
            if what == "watch" and address is not None:
                self._lines[iid] = _Line(iid, address)

    def _tend(self, now: float) -> None:
        """Open lines not open yet (after a backoff for those that failed); reopen silent ones."""
        for line in self._lines.values():
            if line.sock is not None and now - line.last_frame_at > self.SILENCE_S:
                log.info("status feed: the line to %s is silent; reopening it", line.instance_id)
                self._close(line)
            if line.sock is None and now >= line.retry_at:
                self._open(line, now)

    def _open(self, line: _Line, now: float) -> None:
        """Connect and prove the token, blocking (at most ``CONNECT_TIMEOUT_S``): the lines
        already open keep their bytes in the kernel meanwhile."""
        end = ClientEnd(self._token, CLIENT, 0, lambda *frame: self._on_frame(line, *frame),
                        f"instance {line.instance_id}", self._gap, self._urgent_marks)
        sock = None
        try:
            sock = socket.create_connection(line.address, timeout=self.CONNECT_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            line.sock, line.end, line.last_frame_at = sock, end, now
            while not end.is_proven:
                data = sock.recv(4096)
                if not data:
                    raise ConnectionError("closed during the handshake")
                reply = end.feed(data)
                if reply:
                    sock.sendall(reply)
            sock.setblocking(False)
            self._sel.register(sock, selectors.EVENT_READ, line)
            line.failures = 0
        except (OSError, ConnectionError, ValueError) as e:
            line.sock = None
            if sock is not None:
                sock.close()
            line.failures += 1
            line.retry_at = now + min(5.0, 0.2 * 2 ** line.failures)
            log.debug("status feed: no line to %s (%s)", line.instance_id, e)

    def _read(self, line: _Line) -> None:
        assert line.sock is not None and line.end is not None
        try:
            data = line.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            line.end.feed(data)
        except BlockingIOError:
            return
        except Exception as e:  # noqa: BLE001 - a broken line (or nonsense on it): reopened by _tend
            log.debug("status feed: the line to %s broke (%s)", line.instance_id, e)
            self._close(line)

    def _on_frame(self, line: _Line, _kind: str, _last: int, _outs: Any, statuses: list[InstanceStatus],
                  _results: Any) -> None:
        now = time.monotonic()
        line.last_frame_at = self._live[line.instance_id] = now
        self.num_frames += 1
        if statuses:
            self._on_statuses(line.instance_id, statuses)

    def _close(self, line: _Line) -> None:
        if line.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(line.sock)
            line.sock.close()
        line.sock, line.end = None, None
