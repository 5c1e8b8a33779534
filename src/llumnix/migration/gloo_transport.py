"""KV transfer with torch.distributed send/recv over a two-rank gloo group per
(source, destination) pair, the paper's choice. The source (rank 0) hosts the
rendezvous store; the destination joins it when asked (``accept_gloo``). Both
sides prove they hold the cluster token through the store before the group
forms. The source gathers into a reused send buffer (one copy); the
destination receives into a reused buffer and scatters it once. Each side binds
and advertises its node's address (``node_host``), as the tcp receiver does, so a
pair forms across hosts.

Per frame, rank 0 -> rank 1: ``meta int64[2] = (header_len, nbytes)``, the
header (JSON bytes), the payload; rank 1 -> rank 0: ``int64[1]`` 1 = written.
``header_len = -1`` closes the pair.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import logging
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

from llumnix.migration.tcp_transport import migration_host
from llumnix.migration.transport import BulkWorker, KVSink, KVSource, TransportError, TransportOptions

log = logging.getLogger(__name__)
_DATA, _ACK = 0, 1


def node_host() -> str:
    """This process's address for a pair: the node's, as Ray sees it where Ray runs
    here (``migration_host``: ``LLUMNIX_MIGRATION_HOST`` wins), which the peer's
    node can reach; 127.0.0.1 would send a peer on another host to itself."""
    import sys

    node_ip = None
    ray = sys.modules.get("ray")  # only where this process already uses Ray
    if ray is not None and ray.is_initialized():
        node_ip = ray.util.get_node_ip_address()
    return migration_host(node_ip)


def _group(store: Any, name: str, host: str, rank: int, timeout_s: float) -> Any:
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(dist.PrefixStore(f"pg/{name}", store), rank, 2, opts)  # type: ignore[attr-defined]


def _prove(store: Any, token: bytes, mine: str, theirs: str, timeout_s: float) -> None:
    """Each side posts a nonce, answers the other's with an HMAC, and checks the answer to its own."""
    nonce = os.urandom(32)
    store.set(f"nonce/{mine}", nonce)
    store.wait([f"nonce/{theirs}"], datetime.timedelta(seconds=timeout_s))
    store.set(f"mac/{theirs}", hmac.new(token, store.get(f"nonce/{theirs}"), hashlib.sha256).digest())
    store.wait([f"mac/{mine}"], datetime.timedelta(seconds=timeout_s))
    if not hmac.compare_digest(store.get(f"mac/{mine}"), hmac.new(token, nonce, hashlib.sha256).digest()):
        raise TransportError("the gloo peer does not hold the cluster token")


def _wait(work: Any, timeout_s: float) -> None:
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise TransportError(f"gloo: {e}") from e


class _Buffer:
    """A flat tensor grown once and reused, viewed as whatever a frame needs."""

    def __init__(self) -> None:
        self._t = torch.empty(0, dtype=torch.uint8)

    def bytes(self, n: int) -> torch.Tensor:
        if self._t.numel() < n:
            self._t = torch.empty(n, dtype=torch.uint8)
        return self._t[:n]


class GlooSender:
    name = "gloo"

    def __init__(self, accept: Any, token: bytes, host: str | None = None,
                 options: TransportOptions | None = None) -> None:
        """``accept(host, port, pair_id)`` asks the destination to join (it must return at
        once); ``host`` (default ``node_host()``) is where it finds this side."""
        host = host or node_host()
        self._options = options or TransportOptions()
        t = self._options.timeout_s
        pair_id = os.urandom(8).hex()
        self._store = dist.TCPStore(host, 0, 2, True,  # type: ignore[attr-defined]
                                      datetime.timedelta(seconds=t), wait_for_workers=False)
        accept(host, self._store.port, pair_id)
        _prove(self._store, token, "src", "dst", t)
        # Two groups, so the last stage never queues behind a bulk frame or a niced
        # receiver; formed one after the other, in the same order on both sides.
        self._pgs = {kind: _group(self._store, f"{pair_id}/{kind}", host, 0, t) for kind in ("urgent", "bulk")}
        self._buf = _Buffer()
        self._worker = BulkWorker(self._options, "kv-bulk-gloo")
        self._lock = threading.Lock()
        self._broken = False

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool:
        with self._lock:
            if self._broken:
                raise TransportError("gloo pair is broken")
            payload = src.contiguous() if urgent else self._worker.run(lambda: self._gather(src))
            try:
                return self._send(self._pgs["urgent" if urgent else "bulk"], request_id, dst_block_ids, payload)
            except TransportError:
                self._broken = True
                raise

    def _gather(self, src: KVSource) -> torch.Tensor:
        cache = getattr(src.executor, "kv_cache", None)
        if isinstance(cache, torch.Tensor) and cache.device.type == "cpu":
            shape = list(cache.shape)
            shape[2] = len(src.block_ids)
            out = self._buf.bytes(src.nbytes).view(cache.dtype).view(shape)
            idx = torch.tensor(src.block_ids, dtype=torch.long)
            torch.index_select(cache, 2, idx, out=out)
            return out.view(-1).view(torch.uint8)
        return _as_tensor(src.contiguous())

    def _send(self, pg: Any, request_id: str, ids: list[int], payload: Any) -> bool:
        t = self._options.timeout_s
        data = payload if isinstance(payload, torch.Tensor) else _as_tensor(payload)
        header = torch.frombuffer(bytearray(json.dumps({"request_id": request_id, "block_ids": ids}).encode()),
                                  dtype=torch.uint8)
        _wait(pg.send([torch.tensor([header.numel(), data.numel()], dtype=torch.int64)], 1, _DATA), t)
        _wait(pg.send([header], 1, _DATA), t)
        if data.numel():
            _wait(pg.send([data], 1, _DATA), t)
        ack = torch.zeros(1, dtype=torch.int64)
        _wait(pg.recv([ack], 1, _ACK), t)
        return bool(ack.item())

    def close(self) -> None:
        self._worker.close()
        with self._lock:
            if not self._broken:
                for pg in self._pgs.values():
                    with contextlib.suppress(TransportError):
                        _wait(pg.send([torch.tensor([-1, 0], dtype=torch.int64)], 1, _DATA), 1.0)
            self._broken = True


def _as_tensor(data: memoryview | bytes) -> torch.Tensor:
    mv = memoryview(data)
    return torch.frombuffer(mv if not mv.readonly else bytearray(mv), dtype=torch.uint8) if len(mv) \
        else torch.empty(0, dtype=torch.uint8)


class GlooReceiver:
    """The destination's end of one pair: it joins both groups and serves each on its
    own thread (the bulk one niced) until the source closes the pair or dies."""

    def __init__(self, host: str, port: int, pair_id: str, sink: KVSink, token: bytes,
                 options: TransportOptions, local_host: str | None = None) -> None:
        self._args = (host, port, pair_id)
        self._local_host = local_host or node_host()
        self._sink = sink
        self._token = token
        self._options = options
        self._threads: list[threading.Thread] = []
        th = threading.Thread(target=self._join, daemon=True, name=f"kv-gloo-{pair_id}")
        self._threads.append(th)
        th.start()

    @property
    def is_alive(self) -> bool:
        return any(th.is_alive() for th in self._threads)

    def close(self) -> None:
        """The threads end when their source closes the pair or dies."""

    def _join(self) -> None:
        host, port, pair_id = self._args
        t = self._options.timeout_s
        try:
            store = dist.TCPStore(host, port, 2, False, datetime.timedelta(seconds=t))  # type: ignore[attr-defined]
            _prove(store, self._token, "dst", "src", t)
            groups = {kind: _group(store, f"{pair_id}/{kind}", self._local_host, 1, t)
                      for kind in ("urgent", "bulk")}
            bulk = threading.Thread(target=self._serve, args=(groups["bulk"], True), daemon=True,
                                    name=f"kv-gloo-bulk-{pair_id}")
            self._threads.append(bulk)
            bulk.start()
            self._serve(groups["urgent"], False)
        except (TransportError, RuntimeError, ValueError, KeyError) as e:
            log.info("gloo receiver %s ends: %r", pair_id, e)

    def _serve(self, pg: Any, is_bulk: bool) -> None:
        t = self._options.timeout_s
        if is_bulk:
            self._options.lower_bulk_thread()
        buf = _Buffer()
        try:
            while True:
                meta = torch.zeros(2, dtype=torch.int64)
                _wait(pg.recv([meta], 0, _DATA), 10 ** 6)  # idle between migrations
                hlen, n = int(meta[0]), int(meta[1])
                if hlen < 0:
                    return
                header = torch.empty(hlen, dtype=torch.uint8)
                _wait(pg.recv([header], 0, _DATA), t)
                h = json.loads(header.numpy().tobytes())
                data = buf.bytes(n)
                if n:
                    _wait(pg.recv([data], 0, _DATA), t)
                ok = self._sink.write(str(h["request_id"]), [int(b) for b in h["block_ids"]],
                                      memoryview(data.numpy().data))
                _wait(pg.send([torch.tensor([int(ok)], dtype=torch.int64)], 0, _ACK), t)
        except (TransportError, RuntimeError, ValueError, KeyError) as e:
            log.info("gloo receiver ends: %r", e)
