"""KV transfer with torch.distributed send/recv over a two-rank gloo group per
(source, destination) pair, the paper's choice. The source gathers into a reused send
buffer (one copy); the destination receives into a reused buffer and scatters it once.
Each side binds and advertises its node's address (``node_host``), as the tcp receiver
does, so a pair forms across hosts.

Nothing of a pair listens for strangers before it is proven. The rendezvous (each rank's
gloo address) is no TCP store on a port: each side's group forms against a store in its
own process (``_PairStore``), and the two halves travel in the one call the source makes
to the destination anyway (``accept(pair_id, offer) -> answer``, a Ray call between
instance actors: authenticated by Ray's token). Gloo then connects the ranks directly;
before any frame, each group runs a mutual proof of the cluster token over its own
connection (``prove_as_source`` / ``prove_as_destination``, bound to each side's role), so
a stranger who reaches gloo's listening port and takes the connection in place of the
peer learns nothing and writes nothing::

    src -> dst: n_s (32 random bytes)
    dst -> src: n_d, HMAC(token, "dst" n_s)       the source checks it
    src -> dst: HMAC(token, "src" n_d)            the destination checks it

Per frame, rank 0 -> rank 1: ``meta int64[2] = (header_len, nbytes)``, the
header (JSON bytes), the payload; rank 1 -> rank 0: ``int64[1]`` 1 = written.
``header_len = -1`` closes the pair.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from llumnix.migration.gloo_rendezvous import FormingGroup, prove_as_destination, prove_as_source
from llumnix.migration.tcp_transport import migration_host
from llumnix.migration.transport import BulkWorker, KVSink, KVSource, TransportError, TransportOptions

log = logging.getLogger(__name__)
_DATA, _ACK, _PROOF = 0, 1, 2
KINDS = ("urgent", "bulk")
"""A pair's two groups, so the last stage never queues behind a bulk frame or a niced receiver."""
MAX_PAIR_AGE_S = 300.0
"""A pair is formed anew before its first pre-copy stage past this age: gloo keeps every
connection a stranger makes to a group's listener (until it hangs up, or for ever once it
sent bytes) for as long as the group lives, so a pair's age bounds how long they hold them."""
Accept = Callable[[str, dict[str, dict[str, bytes]]], dict[str, dict[str, bytes]]]


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


def _prove(pg: Any, peer: int, token: bytes, timeout_s: float, as_source: bool) -> None:
    """The token's proof over ``pg``'s own connection, before any frame on it."""
    def send(data: bytes) -> None:
        _wait(pg.send([torch.frombuffer(bytearray(data), dtype=torch.uint8)], peer, _PROOF), timeout_s)

    def recv(n: int) -> bytes:
        t = torch.empty(n, dtype=torch.uint8)
        _wait(pg.recv([t], peer, _PROOF), timeout_s)
        return t.numpy().tobytes()

    (prove_as_source if as_source else prove_as_destination)(send, recv, token)


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

    def __init__(self, accept: Accept, token: bytes, host: str | None = None,
                 options: TransportOptions | None = None, max_pair_age_s: float = MAX_PAIR_AGE_S) -> None:
        """``accept(pair_id, offer)`` hands the destination this side's rendezvous halves over
        a channel both trust (a Ray call) and returns its own (``GlooReceiver.answer``);
        ``host`` (default ``node_host()``) is the address this side's groups bind."""
        self._accept, self._token, self._host = accept, token, host or node_host()
        self._options = options or TransportOptions()
        self._max_age_s = max_pair_age_s
        self._pgs = self._form()
        self._formed_at = time.monotonic()
        self.num_renewals = 0
        self._buf = _Buffer()
        self._worker = BulkWorker(self._options, "kv-bulk-gloo")
        self._lock = threading.Lock()
        self._broken = False

    def _form(self) -> dict[str, Any]:
        t = self._options.timeout_s
        pair_id = os.urandom(8).hex()
        forming = {kind: FormingGroup(f"{pair_id}-{kind}", self._host, 0, t) for kind in KINDS}
        try:
            answer = self._accept(pair_id, {kind: f.store.half() for kind, f in forming.items()})
            for kind, f in forming.items():
                f.store.join(answer.get(kind) if isinstance(answer, dict) else None)
            pgs = {kind: f.group() for kind, f in forming.items()}
            for pg in pgs.values():  # in KINDS order, as the destination proves them
                _prove(pg, 1, self._token, t, as_source=True)
            return pgs
        except BaseException:
            for f in forming.values():
                f.store.abandon()
            raise

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool:
        with self._lock:
            if self._broken:
                raise TransportError("gloo pair is broken")
            try:
                if not urgent and time.monotonic() - self._formed_at > self._max_age_s:
                    self._renew()  # before a pre-copy stage: the last stage never waits for it
                payload = src.contiguous() if urgent else self._worker.run(lambda: self._gather(src))
                return self._send(self._pgs["urgent" if urgent else "bulk"], request_id, dst_block_ids, payload)
            except TransportError:
                self._broken = True
                raise

    def _renew(self) -> None:
        """A new pair in place of this one (whose devices close, with every socket a
        stranger left at their listeners)."""
        self._close_groups()
        self._pgs = {}
        try:
            self._pgs = self._form()
        except Exception as e:  # noqa: BLE001 - a Ray error from accept too: the pair is gone either way
            raise TransportError(f"gloo: renewing the pair failed: {e!r}") from e
        self._formed_at = time.monotonic()
        self.num_renewals += 1

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
                self._close_groups()
            self._broken = True

    def _close_groups(self) -> None:
        """Tell the destination's threads to end (``header_len = -1`` on each group)."""
        for pg in self._pgs.values():
            with contextlib.suppress(TransportError):
                _wait(pg.send([torch.tensor([-1, 0], dtype=torch.int64)], 1, _DATA), 1.0)


def _as_tensor(data: memoryview | bytes) -> torch.Tensor:
    mv = memoryview(data)
    return torch.frombuffer(mv if not mv.readonly else bytearray(mv), dtype=torch.uint8) if len(mv) \
        else torch.empty(0, dtype=torch.uint8)


class GlooReceiver:
    """The destination's end of one pair: it forms both groups from the source's offer
    (its own halves are ``answer``, for the source), proves the token on each, and serves
    each on its own thread (the bulk one niced) until the source closes the pair or dies."""

    def __init__(self, pair_id: str, offer: Any, sink: KVSink, token: bytes,
                 options: TransportOptions, local_host: str | None = None) -> None:
        self._sink = sink
        self._token = token
        self._options = options
        t = options.timeout_s
        forming = {kind: FormingGroup(f"{pair_id}-{kind}", local_host or node_host(), 1, t) for kind in KINDS}
        try:
            for kind, f in forming.items():
                f.store.join(offer.get(kind) if isinstance(offer, dict) else None)
            self.answer = {kind: f.store.half() for kind, f in forming.items()}
        except BaseException:
            for f in forming.values():
                f.store.abandon()
            raise
        th = threading.Thread(target=self._join, args=(pair_id, forming), daemon=True, name=f"kv-gloo-{pair_id}")
        self._threads = [th]
        th.start()

    @property
    def is_alive(self) -> bool:
        return any(th.is_alive() for th in self._threads)

    def close(self) -> None:
        """The threads end when their source closes the pair or dies."""

    def _join(self, pair_id: str, forming: dict[str, FormingGroup]) -> None:
        t = self._options.timeout_s
        try:
            groups = {kind: f.group() for kind, f in forming.items()}
            for pg in groups.values():
                _prove(pg, 0, self._token, t, as_source=False)
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
