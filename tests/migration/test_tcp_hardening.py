"""The TCP receiver against peers that misbehave: floods of connections, idle or slow
handshakes, and authenticated peers that announce more than the cache could take."""
from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from types import SimpleNamespace

import pytest

from llumnix.migration.tcp_transport import (
    _U32,
    KVReceiver,
    TCPSender,
    TransportError,
    client_handshake,
    max_header_bytes,
    migration_host,
)
from llumnix.migration.transport import KVLimits, TransportOptions
from tests.net.strangers import Strangers, closed_by_peer, dripping

TOKEN = b"cluster-secret"
BPB = 16  # bytes per block of the fake cache


class Sink:
    """A cache of ``num_blocks`` blocks of ``BPB`` bytes that takes any write of the right size."""

    def __init__(self, num_blocks: int = 8, geometry: bool = True) -> None:
        if geometry:
            self.kv_limits = KVLimits(num_blocks, BPB)
        self.cache = bytearray(num_blocks * BPB)
        self.begun: list[tuple[str, list[int], int]] = []

    def begin_write(self, request_id, block_ids, nbytes):
        self.begun.append((request_id, block_ids, nbytes))
        if nbytes != len(block_ids) * BPB:
            return None
        return [memoryview(self.cache)[b * BPB:(b + 1) * BPB] for b in block_ids]

    def end_write(self, request_id, block_ids, pieces, ok):
        return ok

    def write(self, request_id, block_ids, data):
        raise NotImplementedError


@pytest.fixture
def receiver():
    made: list[KVReceiver] = []

    def make(sink=None, **kw):
        r = KVReceiver(TOKEN, sink or Sink(), **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def num_conn_threads() -> int:
    return sum(t.name == "kv-conn" for t in threading.enumerate())


def migrates(address: tuple[str, int], sink: Sink, block: int = 3) -> bool:
    sender = TCPSender(address, TOKEN, TransportOptions(bulk_nice=0, bulk_idle=False, timeout_s=5.0))
    try:
        ok = sender.send_raw({"request_id": "r", "block_ids": [block]}, b"\x07" * BPB)
    finally:
        sender.close()
    return ok and sink.cache[block * BPB:(block + 1) * BPB] == b"\x07" * BPB


def authenticated(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=5.0)
    client_handshake(sock, TOKEN, b"U")
    return sock


# -- connections ---------------------------------------------------------------------

@pytest.mark.parametrize("trickle_s", [None, 0.05])
def test_strangers_get_no_thread_and_a_migration_goes_through_among_them(trickle_s):
    """Issue 43: 300 idle connections held every slot and every migration of a drain aborted.
    Now they wait at the gate (no thread, capped there) and a sender's handshake is always read."""
    opts = TransportOptions(max_connections=8, handshake_timeout_s=30.0)
    sink = Sink()
    rx = KVReceiver(TOKEN, sink, options=opts)
    base_threads = threading.active_count()
    try:
        with Strangers(rx.address, 300, trickle_s=trickle_s):
            deadline = time.monotonic() + 10.0
            while rx.gate.num_pending + rx.gate.num_evicted + rx.gate.num_refused < 300 \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            assert num_conn_threads() == 0 and rx.num_connections == 0
            assert rx.gate.num_pending <= opts.max_handshakes_per_peer
            assert threading.active_count() - base_threads <= 1  # the trickler's own
            for block in (1, 2, 3):
                assert migrates(rx.address, sink, block)
    finally:
        rx.close()


def test_authenticated_connections_beyond_the_cap_are_refused_at_once(receiver):
    rx = receiver(Sink(), options=TransportOptions(max_connections=2))
    first = TCPSender(rx.address, TOKEN, TransportOptions(timeout_s=5.0))  # both slots
    try:
        with pytest.raises(TransportError):  # refused on proving the token, no hang
            TCPSender(rx.address, TOKEN, TransportOptions(timeout_s=5.0))
        assert rx.num_refused == 1 and rx.num_connections == 2
    finally:
        first.close()


def test_idle_and_trickling_handshakes_are_dropped_at_the_deadline(receiver):
    sink = Sink()
    rx = receiver(sink, options=TransportOptions(max_connections=4, handshake_timeout_s=0.3))
    idle = [socket.create_connection(rx.address, timeout=5.0) for _ in range(3)]
    trickle = socket.create_connection(rx.address, timeout=5.0)
    t0 = time.monotonic()
    try:
        with dripping(trickle):  # a byte of the MAC every 50 ms: each read is quick, the whole is not
            assert all(closed_by_peer(s) for s in [*idle, trickle])
            assert time.monotonic() - t0 < 3.0
            assert migrates(rx.address, sink)  # the slots are free again, the sockets still open here
    finally:
        for s in [*idle, trickle]:
            s.close()


def test_a_wrong_token_is_dropped_and_its_slot_freed(receiver):
    sink = Sink()
    rx = receiver(sink, options=TransportOptions(max_connections=2))
    with pytest.raises(TransportError):
        TCPSender(rx.address, b"not the token", TransportOptions(timeout_s=5.0))
    deadline = time.monotonic() + 5.0
    while rx.num_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert migrates(rx.address, sink)


# -- headers and frames ----------------------------------------------------------------

@pytest.mark.parametrize("geometry", [True, False])
def test_a_huge_header_length_closes_the_connection_without_allocating(receiver, geometry):
    sink = Sink(geometry=geometry)
    rx = receiver(sink)
    sock = authenticated(rx.address)
    tracemalloc.start()
    try:
        sock.sendall(_U32.pack(64 << 20))  # a 64 MiB header, none of it sent
        assert closed_by_peer(sock)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sock.close()
    assert peak < 1 << 20
    assert sink.begun == []


def test_a_header_just_over_the_geometric_bound_is_refused(receiver):
    sink = Sink()
    rx = receiver(sink)
    sock = authenticated(rx.address)
    with sock:
        sock.sendall(_U32.pack(max_header_bytes(sink.kv_limits) + 1))
        assert closed_by_peer(sock)
    assert migrates(rx.address, sink)


def test_the_header_bound_admits_every_block_of_the_cache():
    limits = KVLimits(100_000, BPB)
    header = {"request_id": "r" * 2000, "block_ids": list(range(limits.num_blocks)),
              "nbytes": limits.num_blocks * BPB}
    assert len(json.dumps(header).encode()) <= max_header_bytes(limits) < 2 << 20


@pytest.mark.parametrize("header", [
    {"request_id": "r", "block_ids": [0], "nbytes": 1 << 30},  # more than the cache holds
    {"request_id": "r", "block_ids": [0, 1], "nbytes": 2 * BPB + 1},  # more than its blocks hold
    {"request_id": "r", "block_ids": [8], "nbytes": BPB},  # no such block
    {"request_id": "r", "block_ids": [-1], "nbytes": BPB},
    {"request_id": "r", "block_ids": [1] * 10_000, "nbytes": 10_000 * BPB},  # one block, many times
    {"request_id": "r", "block_ids": [0], "nbytes": -5},
    {"request_id": "r", "block_ids": ["0"], "nbytes": BPB},
    {"request_id": 7, "block_ids": [0], "nbytes": BPB},
    {"request_id": "r", "block_ids": [0]},
    ["r", [0], BPB],
])
def test_a_frame_beyond_the_geometry_or_malformed_is_refused_unread(receiver, header):
    sink = Sink()
    rx = receiver(sink)
    raw = json.dumps(header).encode()
    sock = authenticated(rx.address)
    with sock:
        sock.sendall(_U32.pack(len(raw)) + raw)
        assert closed_by_peer(sock)
    assert sink.begun == []
    assert migrates(rx.address, sink)


def test_a_wrong_size_within_the_geometry_is_refused_and_the_connection_kept(receiver):
    sink = Sink()
    rx = receiver(sink)
    sender = TCPSender(rx.address, TOKEN, TransportOptions(timeout_s=5.0))
    try:
        assert not sender.send_raw({"request_id": "r", "block_ids": [2]}, b"\x01" * 3)
        assert sender.send_raw({"request_id": "r", "block_ids": [2]}, b"\x01" * BPB)
    finally:
        sender.close()


def test_a_destination_endpoint_states_its_cache_geometry():
    from llumnix.migration.destination import DestinationEndpoint
    from tests.engine.helpers import make_engine

    eng = make_engine(num_blocks=16)
    endpoint = DestinationEndpoint(SimpleNamespace(instance_id="d", engine=eng), TOKEN)
    try:
        assert endpoint.kv_limits == KVLimits(16, eng.executor.bytes_per_block)
        raw = json.dumps({"request_id": "r", "block_ids": [0], "nbytes": 17 * eng.executor.bytes_per_block}).encode()
        sock = authenticated(endpoint.address)
        with sock:
            sock.sendall(_U32.pack(len(raw)) + raw)
            assert closed_by_peer(sock)
    finally:
        endpoint.close()


# -- where it listens ------------------------------------------------------------------

def test_the_migration_host_is_the_node_address_unless_overridden(monkeypatch):
    monkeypatch.delenv("LLUMNIX_MIGRATION_HOST", raising=False)
    assert migration_host("10.1.2.3") == "10.1.2.3"
    assert migration_host() not in ("", "0.0.0.0")
    monkeypatch.setenv("LLUMNIX_MIGRATION_HOST", "127.0.0.2")
    assert migration_host("10.1.2.3") == "127.0.0.2"


def test_a_receiver_bound_to_another_address_takes_senders_there(receiver, monkeypatch):
    monkeypatch.setenv("LLUMNIX_MIGRATION_HOST", "127.0.0.2")  # Linux routes all of 127/8 to lo
    sink = Sink()
    rx = receiver(sink, host=migration_host("10.1.2.3"))
    assert rx.address[0] == "127.0.0.2"
    assert migrates(rx.address, sink)


def test_a_wildcard_receiver_advertises_a_real_address_and_takes_any(receiver):
    sink = Sink()
    rx = receiver(sink, host="0.0.0.0")
    assert rx.address[0] not in ("", "0.0.0.0")
    assert migrates(("127.0.0.2", rx.address[1]), sink)
