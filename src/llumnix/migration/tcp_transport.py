"""KV transfer over TCP, each connection authenticated by an HMAC challenge over
a per-cluster token so nothing else can write KV into an instance.

A sender holds two connections: *bulk* (pre-copy stages, sent by a niced
``SCHED_IDLE``, optionally paced thread; received by one like it) and *urgent* (the last
stage, at normal priority on both ends). Payloads go from views of the source's
cache straight into the socket and from the socket straight into the reserved
blocks (``kv_io``), so a CPU cache is copied only by the kernel.

After the handshake every socket is in blocking mode with its timeouts kept by the
kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``) rather than by Python's poll-then-call
loop, and payloads move by vectored calls (``sendmsg`` / ``recvmsg_into`` with
``MSG_WAITALL``, up to ``IOV_MAX`` views each): a copy thread takes the GIL once per
thousand views, not once per view or partial read, so it seldom wakes up holding
the lock an engine's step thread needs (a copy thread at idle priority that is
preempted holding it stalls the step thread until it runs again).

Handshake, then frames::

    <- nonce (32 bytes)     -> HMAC(token, nonce)     <- 1     -> b"B" | b"U"
    -> | header_len u32 | header JSON | payload (header["nbytes"] bytes) |
    <- | 1 byte: 1 = written, 0 = refused |
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import threading
from typing import Any

from llumnix.migration.transport import (
    BulkWorker,
    KVSink,
    KVSource,
    Pacer,
    TransportError,
    TransportOptions,
    split,
)

__all__ = ["KVReceiver", "KVSender", "TCPSender", "TransportError"]

_U32 = struct.Struct("!I")
_NONCE = 32
_BULK, _URGENT = b"B", b"U"


def _kernel_timeout(sock: socket.socket, seconds: float | None) -> None:
    """Blocking mode, with sends and receives timed out by the kernel after ``seconds``
    (None: never). A timed-out call raises ``OSError`` (EAGAIN), as a Python timeout
    would."""
    sock.settimeout(None)
    sec = 0.0 if seconds is None else max(seconds, 1e-3)
    tv = struct.pack("ll", int(sec), int((sec - int(sec)) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


_IOV_MAX = 1024  # Linux's limit on buffers per sendmsg / recvmsg


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    _recv_views(sock, [view])


def _recv_views(sock: socket.socket, views: list[memoryview]) -> None:
    """Fill ``views`` in order from the stream, a thousand views per call (MSG_WAITALL:
    one call per thousand unless a timeout or a signal cuts it short)."""
    views = _bytes_views(views)
    i = 0
    while i < len(views):
        n = sock.recvmsg_into(views[i:i + _IOV_MAX], 0, socket.MSG_WAITALL)[0]
        if n == 0:
            raise TransportError("peer closed the connection")
        i = _advance(views, i, n)


def _send_views(sock: socket.socket, views: list[memoryview]) -> None:
    """Write ``views`` in order to the stream, a thousand views per call."""
    views = _bytes_views(views)
    i = 0
    while i < len(views):
        i = _advance(views, i, sock.sendmsg(views[i:i + _IOV_MAX]))


def _bytes_views(views: list[memoryview]) -> list[memoryview]:
    """The non-empty views as flat byte views (so lengths count bytes)."""
    return [memoryview(v).cast("B") for v in views if memoryview(v).nbytes]


def _advance(views: list[memoryview], i: int, n: int) -> int:
    """Account ``n`` bytes moved from ``views[i:]``: the index of the first view not
    finished, that view trimmed to what is left of it."""
    while n and n >= len(views[i]):
        n -= len(views[i])
        i += 1
    if n:
        views[i] = views[i][n:]
    return i


def _batches(views: list[memoryview], max_bytes: int) -> list[list[memoryview]]:
    """``views`` (none longer than ``max_bytes``) in lists of about ``max_bytes``."""
    out: list[list[memoryview]] = [[]]
    size = 0
    for v in views:
        if out[-1] and size + len(v) > max_bytes:
            out.append([])
            size = 0
        out[-1].append(v)
        size += len(v)
    return [b for b in out if b]


def _recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_exact(sock, memoryview(buf))
    return bytes(buf)


def _drain(sock: socket.socket, n: int) -> None:
    scratch = memoryview(bytearray(min(n, 1 << 20) or 1))
    while n > 0:
        k = min(n, len(scratch))
        _recv_exact(sock, scratch[:k])
        n -= k


def _mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, nonce, hashlib.sha256).digest()


class KVReceiver:
    """Listens on ``host:port`` (0 = any free port) and writes each frame through ``sink``."""

    def __init__(self, token: bytes, sink: KVSink, host: str = "127.0.0.1", port: int = 0,
                 options: TransportOptions | None = None) -> None:
        self._token = token
        self._sink = sink
        self._options = options or TransportOptions()
        self._sock = socket.create_server((host, port))
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="kv-receiver").start()

    def close(self) -> None:
        """Stop listening and drop every open connection (as a dying process would)."""
        self._closed = True
        self._sock.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="kv-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self._options.timeout_s)
                nonce = os.urandom(_NONCE)
                conn.sendall(nonce)
                if not hmac.compare_digest(_recv_bytes(conn, 32), _mac(self._token, nonce)):
                    return  # not one of ours: drop without a word
                conn.sendall(b"\x01")
                if _recv_bytes(conn, 1) == _BULK:
                    self._options.lower_bulk_thread()
                while True:
                    _kernel_timeout(conn, None)  # idle between migrations; a dead peer closes the socket
                    (hlen,) = _U32.unpack(_recv_bytes(conn, 4))
                    _kernel_timeout(conn, self._options.timeout_s)
                    header = json.loads(_recv_bytes(conn, hlen))
                    conn.sendall(b"\x01" if self._frame(conn, header) else b"\x00")
        except (TransportError, OSError, ValueError, KeyError):
            return
        finally:
            with self._lock:
                self._conns.discard(conn)

    def _frame(self, conn: socket.socket, header: dict[str, Any]) -> bool:
        rid, ids, n = str(header["request_id"]), [int(b) for b in header["block_ids"]], int(header["nbytes"])
        pieces = self._sink.begin_write(rid, ids, n)
        if pieces is None:
            _drain(conn, n)
            return False
        ok = False
        try:
            _recv_views(conn, pieces)
            ok = True
        finally:
            ok = self._sink.end_write(rid, ids, pieces, ok)
        return ok


class TCPSender:
    """Two authenticated connections to one receiver; ``send`` blocks until acknowledged."""

    name = "tcp"

    def __init__(self, address: tuple[str, int], token: bytes, options: TransportOptions | None = None) -> None:
        self._options = options or TransportOptions()
        self._urgent = self._connect(address, token, _URGENT)
        self._bulk = self._connect(address, token, _BULK)
        self._worker = BulkWorker(self._options, "kv-bulk-send")
        self._lock = threading.Lock()

    def _connect(self, address: tuple[str, int], token: bytes, kind: bytes) -> socket.socket:
        try:
            sock = socket.create_connection(address, timeout=self._options.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = _recv_bytes(sock, _NONCE)
            sock.sendall(_mac(token, nonce))
            if _recv_bytes(sock, 1) != b"\x01":
                raise TransportError("the receiver refused the handshake")
            sock.sendall(kind)
            _kernel_timeout(sock, self._options.timeout_s)
            return sock
        except OSError as e:
            raise TransportError(f"cannot connect to {address}: {e}") from e

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool:
        header = {"request_id": request_id, "block_ids": dst_block_ids}
        with self._lock:
            if urgent:
                return self._send(self._urgent, header, src.views(), None)
            rate = self._options.bulk_rate_bytes_per_s
            if not rate:
                return self._worker.run(lambda: self._send(self._bulk, header, src.views(), None))
            pacer = Pacer(rate)
            return self._worker.run(lambda: self._send(
                self._bulk, header, split(src.views(), self._options.chunk_bytes), pacer))

    def send_raw(self, header: dict[str, Any], payload: bytes | memoryview) -> bool:
        """One frame of arbitrary bytes on the urgent connection (tests of the receiver's checks)."""
        with self._lock:
            return self._send(self._urgent, header, [memoryview(payload)], None)

    def _send(self, sock: socket.socket, header: dict[str, Any], views: list[memoryview], pacer: Pacer | None) -> bool:
        h = json.dumps({**header, "nbytes": sum(memoryview(v).nbytes for v in views)}).encode()
        try:
            sock.sendall(_U32.pack(len(h)) + h)
            if pacer is None:
                _send_views(sock, views)
            else:  # a paced copy goes out a chunk at a time
                for chunk in _batches(views, self._options.chunk_bytes):
                    _send_views(sock, chunk)
                    pacer.sent(sum(len(v) for v in chunk))
            return _recv_bytes(sock, 1) == b"\x01"
        except OSError as e:
            raise TransportError(f"KV send failed: {e}") from e

    def close(self) -> None:
        self._worker.close()
        for s in (self._urgent, self._bulk):
            s.close()


KVSender = TCPSender  # the name the first version exported
