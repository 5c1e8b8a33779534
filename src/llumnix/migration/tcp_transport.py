"""KV transfer over TCP: length-prefixed frames read into preallocated buffers,
each connection authenticated by an HMAC challenge over a per-cluster token so
nothing else can write KV into an instance.

Frame (after the handshake)::

    | header_len u32 | header JSON | payload (header["nbytes"] bytes) |   ->
    <-  | 1 byte: 1 = written, 0 = refused |
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

_U32 = struct.Struct("!I")
_NONCE = 32


class TransportError(RuntimeError):
    """The peer is gone, refused us, or spoke out of turn."""


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


def _mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, nonce, hashlib.sha256).digest()


# A receiver handler gets the header and the payload (valid only during the call)
# and returns whether it wrote the blocks.
Handler = Callable[[dict[str, Any], memoryview], bool]


class KVReceiver:
    """Listens on ``host:port`` (0 = any free port) and hands each frame to ``handler``."""

    def __init__(self, token: bytes, handler: Handler, host: str = "127.0.0.1", port: int = 0) -> None:
        self._token = token
        self._handler = handler
        self._sock = socket.create_server((host, port))
        self.address = self._sock.getsockname()[:2]
        self._buffer = bytearray(0)  # grown once, reused: no allocation per stage
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="kv-receiver").start()

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                nonce = os.urandom(_NONCE)
                conn.sendall(nonce)
                if not hmac.compare_digest(_recv_bytes(conn, 32), _mac(self._token, nonce)):
                    return  # not one of ours: drop without a word
                conn.sendall(b"\x01")
                while True:
                    (hlen,) = _U32.unpack(_recv_bytes(conn, 4))
                    header = json.loads(_recv_bytes(conn, hlen))
                    n = int(header["nbytes"])
                    with self._lock:
                        if len(self._buffer) < n:
                            self._buffer = bytearray(n)
                        view = memoryview(self._buffer)[:n]
                        _recv_exact(conn, view)
                        ok = self._handler(header, view)
                    conn.sendall(b"\x01" if ok else b"\x00")
            except (TransportError, OSError, ValueError, KeyError):
                return


class KVSender:
    """One authenticated connection to a receiver; ``send`` blocks until acknowledged."""

    def __init__(self, address: tuple[str, int], token: bytes, timeout: float = 30.0) -> None:
        self._sock = socket.create_connection(address, timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = _recv_bytes(self._sock, _NONCE)
        self._sock.sendall(_mac(token, nonce))
        if _recv_bytes(self._sock, 1) != b"\x01":
            raise TransportError("the receiver refused the handshake")

    def send(self, header: dict[str, Any], payload: bytes | memoryview) -> bool:
        h = json.dumps({**header, "nbytes": len(payload)}).encode()
        try:
            self._sock.sendall(_U32.pack(len(h)) + h)
            self._sock.sendall(payload)
            return _recv_bytes(self._sock, 1) == b"\x01"
        except OSError as e:
            raise TransportError(f"KV send failed: {e}") from e

    def close(self) -> None:
        self._sock.close()
