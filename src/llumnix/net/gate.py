"""The gate of every port we open: connections wait here until they prove the cluster's
token, and a stranger costs a socket and a few dozen bytes, never a thread.

One selector thread per listening socket accepts, sends each connection its challenge and
reads the answer, on non-blocking sockets. Only a connection whose answer proves the token
leaves the gate, to its server's ``on_proven`` (which may give it threads). Before that:

- a deadline absolute from accept (``deadline_s``): a trickle of bytes does not extend it;
- at most ``max_per_peer`` unauthenticated connections from one address and ``max_pending``
  in all: past either cap the *oldest* one (of that address, or of all) is closed to make
  room, never the newcomer, so a peer of ours always has its answer read however many
  strangers wait (they cannot fill a slot it needs: it is the newest);
- out of file descriptors, the oldest waiting connection is closed too;
- one warning line per ``LOG_EVERY_S`` at most when a cap closes connections (with counts).
"""
from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0
"""The gate's warnings (a cap hit, answers that prove nothing) at most this often each."""
_ACCEPTS_PER_WAKE = 256
"""Accepts before the gate reads answers again: a flood of connects cannot starve them."""
_PAUSE_S = 0.1
"""Out of file descriptors with nothing to close: accepts pause this long."""


@dataclass(frozen=True)
class GateLimits:
    deadline_s: float = 5.0
    """An unauthenticated connection is closed this long after accept, however it trickles."""
    max_pending: int = 1024
    """Unauthenticated connections held at once, from all addresses (past it the oldest is closed)."""
    max_per_peer: int = 64
    """Unauthenticated connections held at once from one address (past it its oldest is closed)."""

    def __post_init__(self) -> None:
        if self.deadline_s <= 0 or self.max_pending < 1 or self.max_per_peer < 1:
            raise ValueError(f"gate limits must be positive: {self}")


@dataclass(frozen=True)
class Challenge:
    """One connection's handshake as the gate runs it: send ``greeting``, read exactly
    ``answer_size`` bytes, and ``check`` them: the reply owed to a peer that proved the
    token (``on_proven`` sends it), or None for one that did not (closed at once)."""

    greeting: bytes
    answer_size: int
    check: Callable[[bytes], bytes | None]


class _Pending:
    __slots__ = ("sock", "peer", "host", "deadline", "challenge", "buf")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float, challenge: Challenge) -> None:
        self.sock, self.peer, self.deadline, self.challenge = sock, peer, deadline, challenge
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self.buf = bytearray()


class ThrottledWarning:
    """A warning logged at most every ``LOG_EVERY_S``, counting the times it was held back."""

    def __init__(self) -> None:
        self._at = -1e9
        self._held = 0

    def __call__(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._at < LOG_EVERY_S:
            self._held += 1
            return
        held, self._held, self._at = self._held, 0, now
        log.warning(msg + (f" ({held} more like it in the last {LOG_EVERY_S:.0f} s)" if held else ""), *args)


class Gate:
    """Takes connections on ``listener`` (its own from now on) for a server called ``name``:
    ``challenge()`` makes each one's handshake; ``on_proven(sock, peer, reply)`` gets each that
    proved the token, its socket blocking again (it owns it from then on, and sends ``reply``)."""

    def __init__(self, name: str, listener: socket.socket, challenge: Callable[[], Challenge],
                 on_proven: Callable[[socket.socket, Any, bytes], None], limits: GateLimits | None = None) -> None:
        self.name, self.limits = name, limits or GateLimits()
        self._listener, self._challenge, self._on_proven = listener, challenge, on_proven
        self._pending: dict[socket.socket, _Pending] = {}  # in accept order: the oldest first
        self._by_peer: dict[str, dict[socket.socket, _Pending]] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        listener.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sel.register(listener, selectors.EVENT_READ, listener)
        self._paused_until = 0.0
        self._closed = False
        self._warn_cap, self._warn_fds, self._warn_proof = ThrottledWarning(), ThrottledWarning(), ThrottledWarning()
        self.num_proven = 0
        self.num_refused = 0
        """Answers that did not prove the token."""
        self.num_expired = 0
        """Connections closed at the deadline."""
        self.num_evicted = 0
        """Connections closed to make room (a cap, or out of file descriptors)."""
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"{name}-gate")
        self._thread.start()

    @property
    def num_pending(self) -> int:
        """Connections waiting for their answer now."""
        return len(self._pending)

    def close(self) -> None:
        """Stop accepting and close every connection still at the gate."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self._listener.close()

    # -- the gate thread --------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select(self._timeout(time.monotonic())):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    elif key.data is self._listener:
                        self._accept_some()
                    else:
                        self._read(key.data)
                now = time.monotonic()
                self._expire(now)
                if self._paused_until and now >= self._paused_until:
                    self._paused_until = 0.0
                    self._sel.register(self._listener, selectors.EVENT_READ, self._listener)
        except Exception:  # a bug here would leave the port deaf: say so loudly
            log.exception("%s: the gate stopped", self.name)
            raise
        finally:
            for p in list(self._pending.values()):
                self._drop(p)
            with contextlib.suppress(OSError):
                self._listener.close()
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _timeout(self, now: float) -> float | None:
        due = [self._paused_until] if self._paused_until else []
        if self._pending:
            due.append(next(iter(self._pending.values())).deadline)
        return max(0.0, min(due) - now) if due else None

    def _accept_some(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: make room, or wait a little
                if self._pending:
                    self._warn_fds("%s: cannot accept (%s); closing the oldest unauthenticated connections "
                                   "to make room", self.name, e.strerror)
                    self._evict(next(iter(self._pending.values())))
                    continue
                self._warn_fds("%s: cannot accept (%s); pausing accepts", self.name, e.strerror)
                self._sel.unregister(self._listener)
                self._paused_until = time.monotonic() + _PAUSE_S
                return
            self._admit(sock, peer)

    def _admit(self, sock: socket.socket, peer: Any) -> None:
        p = _Pending(sock, peer, time.monotonic() + self.limits.deadline_s, self._challenge())
        same = self._by_peer.get(p.host)
        if same is not None and len(same) >= self.limits.max_per_peer:
            self._warn_cap("%s: %d unauthenticated connections from %s (the cap per address); closing the "
                           "oldest to make room", self.name, len(same), p.host)
            self._evict(next(iter(same.values())))
        if len(self._pending) >= self.limits.max_pending:
            self._warn_cap("%s: %d unauthenticated connections (the cap); closing the oldest to make room",
                           self.name, len(self._pending))
            self._evict(next(iter(self._pending.values())))
        try:
            sock.setblocking(False)
            if sock.send(p.challenge.greeting) != len(p.challenge.greeting):
                raise OSError("the greeting did not fit the send buffer")
        except OSError:
            sock.close()
            return
        self._pending[sock] = p
        self._by_peer.setdefault(p.host, {})[sock] = p
        self._sel.register(sock, selectors.EVENT_READ, p)

    def _read(self, p: _Pending) -> None:
        try:
            data = p.sock.recv(p.challenge.answer_size - len(p.buf))  # never past the answer
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(p)
            return
        p.buf += data
        if len(p.buf) < p.challenge.answer_size:
            return
        self._forget(p)
        reply = p.challenge.check(bytes(p.buf))
        if reply is None:
            self.num_refused += 1
            self._warn_proof("%s: a peer without the cluster's token was refused (%s)", self.name, p.host)
            p.sock.close()
            return
        self.num_proven += 1
        try:
            p.sock.setblocking(True)
            self._on_proven(p.sock, p.peer, reply)
        except Exception:  # noqa: BLE001 - one peer's failure must not stop the gate
            log.exception("%s: serving a connection from %s failed", self.name, p.host)
            p.sock.close()

    def _expire(self, now: float) -> None:
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                return
            self.num_expired += 1
            self._drop(p)

    def _evict(self, p: _Pending) -> None:
        self.num_evicted += 1
        self._drop(p)

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()

    def _forget(self, p: _Pending) -> None:
        """Take ``p`` off the gate's books (its socket stays open)."""
        if self._pending.pop(p.sock, None) is None:
            return
        same = self._by_peer[p.host]
        del same[p.sock]
        if not same:
            del self._by_peer[p.host]
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(p.sock)
