"""The request channel: a gateway's own line to one instance, beside Ray.

A Ray actor call costs about a millisecond of CPU on each side; a request took
three of them (submit to LlumSched, its forward to the instance, an output poll)
and statuses took twenty more a second per instance. On this line a request is
one frame to the instance, and its outputs come back in one frame per engine
step for all of a gateway's requests there, together with the instance's newest
status (what the gateway dispatches on). Ray stays the control plane: membership,
migration, drain, resume.

Frames are a 4-byte length and a pickle, exchanged only after both ends proved
they hold the cluster's token (HMAC over the other's nonce), so nothing is
unpickled from an unauthenticated peer::

    server -> nonce_s    client -> nonce_c, HMAC(token, nonce_s), (client, ack, status_gap_s[, urgent_marks])
    server -> HMAC(token, nonce_c)
    client -> ("add", GenerateRequest) | ("ack", seq)
    server -> ("out", last_seq, [RequestOutput], [InstanceStatus], [(request_id, error)])

Outputs stay in the instance's outbox until acknowledged, so a client that
reconnects (``ack`` in its hello) gets again whatever it may have missed.

Until its proof checks out a connection costs no thread: it waits at the port's ``Gate``
(``net/gate.py``: one selector thread, a deadline from accept, caps per address and in
all that close the oldest stranger, never a newcomer). A client proven gets a reader
and a writer thread.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from llumnix.core.errors import LlumnixError
from llumnix.core.wire import GenerateRequest
from llumnix.net.gate import Challenge, Gate, GateLimits

if TYPE_CHECKING:
    from llumnix.cluster.instance import InstanceServer

log = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
NONCE = 16
MAX_FRAME = 64 << 20
"""The largest frame either end accepts (a batch of outputs is far below it)."""
HELLO_TIMEOUT_S = 5.0
"""A proven client's hello (sent with its proof) arrives within this long."""


def mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, b"llumnix-channel" + nonce, hashlib.sha256).digest()


def pack(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the channel closed")
        got += k
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> Any:
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"a {n}-byte frame is over the channel's limit")
    return pickle.loads(_recv_exact(sock, n))


class ClientEnd:
    """A client's side of one connection, as bytes: the handshake, then whole frames.
    ``feed`` it what came; it returns what to send back (the hello, once) and hands each
    frame's fields to ``on_frame``. The gateway's asyncio link and LlumSched's status feed
    both speak through it. Raises ConnectionError on a bad proof or an oversized frame."""

    def __init__(self, token: bytes, client: str, ack: int, on_frame: Callable[..., None], peer: str,
                 status_gap_s: float | None = None, urgent_marks: bool = False) -> None:
        self._token, self._client, self._ack, self._on_frame, self._peer = token, client, ack, on_frame, peer
        self._gap = status_gap_s
        """How often a status alone may come (None: the instance's busy report interval)."""
        self._urgent_marks = urgent_marks
        """A status whose rescheduling marks changed comes at once, gap or not (LlumSched's
        triggered rescheduling, ``policy/trigger.py``)."""
        self._buf = bytearray()
        self._nonce = os.urandom(NONCE)
        self._hello_sent = False
        self.is_proven = False

    def feed(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        reply = b"" if self.is_proven else self._handshake(buf)
        if self.is_proven:
            self._frames(buf)
        return reply

    @property
    def is_empty(self) -> bool:
        """No partial frame waits for more bytes."""
        return not self._buf

    def _handshake(self, buf: bytearray) -> bytes:
        """The server's nonce, then its proof of the token."""
        reply = b""
        if not self._hello_sent:
            if len(buf) < NONCE:
                return reply
            server_nonce = bytes(buf[:NONCE])
            del buf[:NONCE]
            hello = (self._client, self._ack, self._gap) + ((True,) if self._urgent_marks else ())
            reply = self._nonce + mac(self._token, server_nonce) + pack(hello)
            self._hello_sent = True
        if len(buf) < 32:
            return reply
        proof = bytes(buf[:32])
        del buf[:32]
        if not hmac.compare_digest(proof, mac(self._token, self._nonce)):
            raise ConnectionError(f"{self._peer}'s channel failed to prove the cluster token")
        self.is_proven = True
        return reply

    def _frames(self, buf: bytearray) -> None:
        pos, end, size = 0, len(buf), HEADER.size
        try:
            while end - pos >= size:
                (n,) = HEADER.unpack_from(buf, pos)
                if n > MAX_FRAME:
                    raise ConnectionError(f"a {n}-byte frame from {self._peer} is over the channel's limit")
                if end - pos - size < n:
                    break
                frame = pickle.loads(bytes(buf[pos + size:pos + size + n]))
                pos += size + n
                self._on_frame(*frame)
        finally:
            del buf[:pos]


class ChannelServer:
    """The instance's end: one listening socket behind a ``Gate`` (``limits``); per proven
    client connection a reader thread (adds and acks) and a writer thread (outputs,
    statuses, add results)."""

    def __init__(self, server: InstanceServer, token: bytes, add: Callable[[GenerateRequest], Future[Any]],
                 host: str = "127.0.0.1", heartbeat_s: float = 1.0, status_gap_s: float | None = None,
                 limits: GateLimits | None = None) -> None:
        self._server, self._token, self._add = server, token, add
        self._heartbeat_s = heartbeat_s
        self._status_gap_s = server.status_interval_s if status_gap_s is None else status_gap_s
        sock = socket.create_server((host, 0), backlog=socket.SOMAXCONN)
        self.address: tuple[str, int] = (host, sock.getsockname()[1])
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._clients: dict[str, int] = {}
        self._lock = threading.Lock()
        self.gate = Gate(f"request channel {host}:{self.address[1]}", sock, self._challenge, self._proven, limits)

    def has_client(self, client: str) -> bool:
        """A line of ``client``'s is open (past the handshake)."""
        return self._clients.get(client, 0) > 0

    def close(self) -> None:
        self._closed.set()
        self.gate.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)

    def _challenge(self) -> Challenge:
        """Our nonce; the answer is the client's nonce and its proof over ours."""
        token, nonce = self._token, os.urandom(NONCE)

        def check(answer: bytes) -> bytes | None:
            peer_nonce, proof = answer[:NONCE], answer[NONCE:]
            return mac(token, peer_nonce) if hmac.compare_digest(proof, mac(token, nonce)) else None

        return Challenge(nonce, NONCE + 32, check)

    def _proven(self, conn: socket.socket, _peer: Any, reply: bytes) -> None:
        threading.Thread(target=self._serve, args=(conn, reply), daemon=True, name="channel-conn").start()

    def _hello(self, conn: socket.socket, reply: bytes) -> tuple[str, int, float, bool]:
        """Our proof out, the client's hello in (it sent it with its own proof)."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(HELLO_TIMEOUT_S)
        conn.sendall(reply)
        client, ack, gap, *rest = _recv_frame(conn)
        conn.settimeout(None)
        urgent = bool(rest and rest[0])
        if urgent:
            self._server.track_marks()
        return str(client), int(ack), self._status_gap_s if gap is None else float(gap), urgent

    def _serve(self, conn: socket.socket, reply: bytes) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            if self._closed.is_set():
                return
            client, ack, gap, urgent = self._hello(conn, reply)
            writer = _Writer(self._server, conn, client, ack, self._heartbeat_s, gap, urgent)
            threading.Thread(target=writer.run, daemon=True, name="channel-writer").start()
            with self._lock:
                self._clients[client] = self._clients.get(client, 0) + 1
            try:
                self._read(conn, client, writer)
            finally:
                writer.stop()
                with self._lock:
                    self._clients[client] -= 1
        except (OSError, ConnectionError, EOFError, pickle.UnpicklingError, ValueError):
            pass  # the client went away (or spoke nonsense): its outbox waits for a reconnect
        finally:
            with self._lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def _read(self, conn: socket.socket, client: str, writer: _Writer) -> None:
        while not self._closed.is_set():
            kind, arg = _recv_frame(conn)
            if kind == "add":
                fut = self._add(arg)
                # done already: the status its command made due may be out, so do not wait for the next
                fut.add_done_callback(functools.partial(writer.added, arg.request_id, fut.done()))
            elif kind == "ack":
                self._server.ack_outputs(client, int(arg))


class _Writer:
    """Sends one client its outputs as the engine publishes them (a frame per step at
    most), the newest status, and the results of its adds; a status at least every
    heartbeat, so silence means a dead line.

    A status alone goes at most every ``status_gap_s`` (the engine's busy report
    interval): an engine also reports after every add and every finished request, and a
    gateway that forwarded each would wake for every request of every other client in the
    cluster. Outputs and refused adds go at once, with the newest status if there is one;
    with ``urgent_marks`` so does a status whose rescheduling marks changed."""

    def __init__(self, server: InstanceServer, conn: socket.socket, client: str, ack: int,
                 heartbeat_s: float, status_gap_s: float, urgent_marks: bool = False) -> None:
        self._server, self._conn, self._client = server, conn, client
        self._sent, self._status_sent = ack, -1
        self._status_at = -1e9
        self._heartbeat_s, self._status_gap_s = heartbeat_s, status_gap_s
        self._urgent_marks = urgent_marks
        self._results: list[tuple[str, BaseException | None]] = []
        self._urgent = False
        """A refused add waits in ``_results``: send now."""
        self._stopped = False

    def added(self, request_id: str, at_once: bool, fut: Future[Any]) -> None:
        """An add's result. A refusal goes out at once; a success rides on the next frame,
        which the add itself makes due within a step (commands are followed by a status:
        ``InstanceServer._deliver``): one frame a request fewer, for both ends."""
        err = fut.exception()
        if err is not None and not isinstance(err, (LlumnixError, RuntimeError, TimeoutError)):
            err = RuntimeError(f"{type(err).__name__}: {err}")  # what surely unpickles

        def note() -> None:
            self._results.append((request_id, err))
            self._urgent = self._urgent or at_once or err is not None

        self._server.notify_readers(note, wake=at_once or err is not None)

    def stop(self) -> None:
        self._stopped = True
        self._server.notify_readers(lambda: None)

    def run(self) -> None:
        server = self._server
        try:
            while not self._stopped:
                hold = self._status_at + self._status_gap_s - time.monotonic()
                marks_after = self._status_sent if hold > 0 and self._urgent_marks else None
                last, outs, _ = server.wait_outputs(
                    self._client, self._sent, hold if hold > 0 else self._heartbeat_s,
                    status_after=None if hold > 0 else self._status_sent,
                    wake=lambda: self._urgent or self._stopped, marks_after=marks_after)
                if hold > 0 and not (outs or self._urgent or self._stopped
                                     or (marks_after is not None and server.marks_seq > marks_after)):
                    continue  # the gap is over: a status may go now
                results = server.notify_readers(self._take_results, wake=False)
                seq, status = server.newest_status(self._status_sent)
                if status is None and not (outs or results) and server.statuses:
                    status = server.statuses[-1][1]  # a heartbeat: the newest again
                self._conn.sendall(pack(("out", last, outs, [] if status is None else [status], results)))
                self._sent, self._status_sent = last, seq
                if status is not None:
                    self._status_at = time.monotonic()
        except (OSError, RuntimeError):  # the client went away, or the engine stopped
            with contextlib.suppress(OSError):
                self._conn.shutdown(socket.SHUT_RDWR)

    def _take_results(self) -> list[tuple[str, BaseException | None]]:
        results, self._results, self._urgent = self._results, [], False
        return results
