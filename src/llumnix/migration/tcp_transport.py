"""KV transfer over TCP, each connection authenticated by an HMAC challenge over
a per-cluster token so nothing else can write KV into an instance.

A sender holds two connections: *bulk* (pre-copy stages, sent by a niced
``SCHED_IDLE``, optionally paced thread; received by one like it) and *urgent* (the last
stage, at normal priority on both ends). Payloads go from views of the source's
cache straight into the socket and from the socket straight into the reserved
blocks (``kv_io``), so a CPU cache is copied only by the kernel.

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


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise TransportError("peer closed the connection")
        got += n


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
                conn.settimeout(None)  # idle between migrations; a dead peer closes the socket
                while True:
                    (hlen,) = _U32.unpack(_recv_bytes(conn, 4))
                    conn.settimeout(self._options.timeout_s)
                    header = json.loads(_recv_bytes(conn, hlen))
                    conn.sendall(b"\x01" if self._frame(conn, header) else b"\x00")
                    conn.settimeout(None)
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
            for p in pieces:
                _recv_exact(conn, p)
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
            return sock
        except OSError as e:
            raise TransportError(f"cannot connect to {address}: {e}") from e

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool:
        header = {"request_id": request_id, "block_ids": dst_block_ids}
        with self._lock:
            if urgent:
                return self._send(self._urgent, header, src.views(), None)
            pacer = Pacer(self._options.bulk_rate_bytes_per_s)
            return self._worker.run(lambda: self._send(
                self._bulk, header, split(src.views(), self._options.chunk_bytes), pacer))

    def send_raw(self, header: dict[str, Any], payload: bytes | memoryview) -> bool:
        """One frame of arbitrary bytes on the urgent connection (tests of the receiver's checks)."""
        with self._lock:
            return self._send(self._urgent, header, [memoryview(payload)], None)

    def _send(self, sock: socket.socket, header: dict[str, Any], views: list[memoryview], pacer: Pacer | None) -> bool:
        h = json.dumps({**header, "nbytes": sum(len(v) for v in views)}).encode()
        try:
            sock.sendall(_U32.pack(len(h)) + h)
            for v in views:
                sock.sendall(v)
                if pacer is not None:
                    pacer.sent(len(v))
            return _recv_bytes(sock, 1) == b"\x01"
        except OSError as e:
            raise TransportError(f"KV send failed: {e}") from e

    def close(self) -> None:
        self._worker.close()
        for s in (self._urgent, self._bulk):
            s.close()


KVSender = TCPSender  # the name the first version exported
