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

A receiver bounds what a peer can make it hold. Before the handshake: nothing but a
socket at the port's ``Gate`` (``net/gate.py``: one selector thread, a deadline from
accept, caps per address and in all that close the oldest stranger, never a newcomer).
After it: a capped number of connections (a thread each), and headers and payloads no
larger than the destination cache's geometry could take; a frame beyond them closes the
connection unread. Cluster instances bind the node's address (``migration_host``), so sources
on other hosts can connect.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import threading
import time
from typing import Any

from llumnix.migration.transport import (
    BulkWorker,
    KVLimits,
    KVSink,
    KVSource,
    Pacer,
    TransportError,
    TransportOptions,
    split,
)
from llumnix.net.gate import Challenge, Gate, GateLimits, ThrottledWarning

__all__ = ["KVReceiver", "KVSender", "TCPSender", "TransportError", "migration_host"]

log = logging.getLogger(__name__)
_U32 = struct.Struct("!I")
_NONCE = 32
_BULK, _URGENT = b"B", b"U"
_HEADER_BASE = 64 << 10  # a header's fields other than its block ids, with room to spare
_MAX_HEADER = 1 << 20  # for a sink that does not say its geometry
_WILDCARDS = ("", "0.0.0.0", "::")
MIGRATION_HOST_ENV = "LLUMNIX_MIGRATION_HOST"


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


def _recv_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes (a few: the handshake's), all received before ``deadline``."""
    buf = bytearray(n)
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransportError("the handshake timed out")
        sock.settimeout(left)
        k = sock.recv_into(memoryview(buf)[got:])
        if k == 0:
            raise TransportError("peer closed the connection")
        got += k
    return bytes(buf)


def _mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, nonce, hashlib.sha256).digest()


def client_handshake(sock: socket.socket, token: bytes, kind: bytes) -> None:
    """Prove to a receiver that we hold ``token`` and open a ``kind`` (bulk or urgent) connection."""
    nonce = _recv_bytes(sock, _NONCE)
    sock.sendall(_mac(token, nonce))
    if _recv_bytes(sock, 1) != b"\x01":
        raise TransportError("the receiver refused the handshake")
    sock.sendall(kind)


class _Refused(TransportError):
    """A frame the receiver will not read: the connection is closed, nothing allocated."""


def migration_host(node_ip: str | None = None) -> str:
    """The address a cluster instance's KV receiver binds and advertises:
    ``LLUMNIX_MIGRATION_HOST`` if set, else ``node_ip`` (the node's address as Ray sees
    it, which other nodes can reach), else this host's address on its default route."""
    return os.environ.get(MIGRATION_HOST_ENV) or node_ip or _route_ip()


def _route_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP: no packet is sent, a route is picked
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def max_header_bytes(limits: KVLimits | None) -> int:
    """The longest header a receiver reads: room for every block id of the cache, as
    JSON writes a list of them (``", "`` between ids), and for the other fields."""
    if limits is None:
        return _MAX_HEADER
    return _HEADER_BASE + limits.num_blocks * (len(str(max(limits.num_blocks - 1, 0))) + 2)


def parse_header(raw: bytes, limits: KVLimits | None) -> tuple[str, list[int], int]:
    """(request id, block ids, payload bytes) of a frame header, or ``_Refused`` if it is
    malformed or asks for more than a cache of ``limits`` could ever take."""
    try:
        h = json.loads(raw)
        rid, ids, n = h["request_id"], h["block_ids"], h["nbytes"]
    except (ValueError, KeyError, TypeError) as e:
        raise _Refused(f"a malformed header ({e!r})") from e
    if not isinstance(rid, str) or not isinstance(ids, list) or type(n) is not int or n < 0 \
            or not all(type(b) is int for b in ids):
        raise _Refused("a malformed header")
    if len(set(ids)) != len(ids):
        raise _Refused("a block id repeated")
    if limits is not None:
        if not all(0 <= b < limits.num_blocks for b in ids):
            raise _Refused(f"a block id outside 0..{limits.num_blocks - 1}")
        if n > len(ids) * limits.bytes_per_block:
            raise _Refused(f"{n} bytes for {len(ids)} blocks of {limits.bytes_per_block}")
    return rid, ids, n


class KVReceiver:
    """Listens on ``host:port`` (0 = any free port) and writes each frame through ``sink``.

    Until a connection authenticates it waits at a ``Gate`` (no thread; dropped
    ``options.handshake_timeout_s`` after accept; at most ``options.max_pending_handshakes``
    held, ``options.max_handshakes_per_peer`` from one address, the oldest closed past
    them). At most ``options.max_connections`` authenticated ones are served, a thread each.
    Nothing sized by the peer is allocated before it authenticates, nor after it for a
    header or payload beyond ``sink.kv_limits`` (``KVLimits``, if the sink has one).
    Bound to a wildcard (``0.0.0.0``), it advertises this host's routed address."""

    def __init__(self, token: bytes, sink: KVSink, host: str = "127.0.0.1", port: int = 0,
                 options: TransportOptions | None = None) -> None:
        self._token = token
        self._sink = sink
        self._options = options or TransportOptions()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=socket.SOMAXCONN)
        bound, bound_port = sock.getsockname()[:2]
        self.address: tuple[str, int] = (_route_ip() if host in _WILDCARDS else bound, bound_port)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.num_refused = 0
        """Authenticated connections closed because every slot was taken."""
        self._warn_full = ThrottledWarning()
        opts = self._options
        limits = GateLimits(opts.handshake_timeout_s, opts.max_pending_handshakes, opts.max_handshakes_per_peer)
        self.gate = Gate(f"KV receiver {bound}:{bound_port}", sock, self._challenge, self._proven, limits)

    @property
    def num_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        """Stop listening and drop every open connection (as a dying process would)."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        self.gate.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _challenge(self) -> Challenge:
        token, nonce = self._token, os.urandom(_NONCE)
        return Challenge(nonce, 32, lambda answer: b"\x01" if hmac.compare_digest(answer, _mac(token, nonce)) else None)

    def _proven(self, conn: socket.socket, peer: Any, reply: bytes) -> None:
        """A connection that proved the token: served on its own thread if a slot is free."""
        with self._lock:
            admit = not self._closed and len(self._conns) < self._options.max_connections
            if admit:
                self._conns.add(conn)
            else:
                self.num_refused += 1
        if not admit:
            conn.close()
            self._warn_full("KV receiver %s: all %d connection slots taken by authenticated peers; %d refused "
                            "so far (the latest from %s)", self.address, self._options.max_connections,
                            self.num_refused, peer)
            return
        threading.Thread(target=self._serve, args=(conn, peer, reply), daemon=True, name="kv-conn").start()

    def _serve(self, conn: socket.socket, peer: Any, reply: bytes) -> None:
        try:
            with conn:
                kind = self._kind(conn, reply)
                if kind == _BULK:
                    self._options.lower_bulk_thread()
                while True:
                    rid, ids, n = self._read_header(conn)
                    conn.sendall(b"\x01" if self._frame(conn, rid, ids, n) else b"\x00")
        except _Refused as e:
            log.warning("KV receiver %s: closed the connection from %s: %s", self.address, peer, e)
        except (TransportError, OSError):
            return
        finally:
            with self._lock:
                self._conns.discard(conn)

    def _kind(self, conn: socket.socket, reply: bytes) -> bytes:
        """The connection's kind (bulk or urgent), the last word of the handshake."""
        conn.settimeout(self._options.handshake_timeout_s)
        conn.sendall(reply)
        return _recv_by(conn, 1, time.monotonic() + self._options.handshake_timeout_s)

    def _read_header(self, conn: socket.socket) -> tuple[str, list[int], int]:
        _kernel_timeout(conn, None)  # idle between migrations; a dead peer closes the socket
        (hlen,) = _U32.unpack(_recv_bytes(conn, 4))
        _kernel_timeout(conn, self._options.timeout_s)
        limits: KVLimits | None = getattr(self._sink, "kv_limits", None)
        if hlen > max_header_bytes(limits):
            raise _Refused(f"a {hlen}-byte header (at most {max_header_bytes(limits)})")
        return parse_header(_recv_bytes(conn, hlen), limits)

    def _frame(self, conn: socket.socket, rid: str, ids: list[int], n: int) -> bool:
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
            client_handshake(sock, token, kind)
            _kernel_timeout(sock, self._options.timeout_s)
            return sock
        except (OSError, TransportError) as e:  # closed at once: a wrong token, or no free slot
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
