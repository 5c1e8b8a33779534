"""The gate alone, on real sockets: strangers held at caps that close the oldest, an
absolute deadline, and one of ours always let through."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from llumnix.net.gate import Challenge, Gate, GateLimits
from tests.net.strangers import Strangers, closed_by_peer, dripping

ANSWER = b"open sesame!"


class Server:
    """A gate whose challenge is a fixed word; proven connections are kept here."""

    def __init__(self, limits: GateLimits) -> None:
        self.proven: list[tuple[socket.socket, bytes]] = []
        self.got = threading.Event()
        listener = socket.create_server(("127.0.0.1", 0), backlog=socket.SOMAXCONN)
        self.address = listener.getsockname()
        self.gate = Gate("test port", listener, self._challenge, self._on_proven, limits)

    @staticmethod
    def _challenge() -> Challenge:
        return Challenge(b"?", len(ANSWER), lambda a: b"welcome" if a == ANSWER else None)

    def _on_proven(self, sock: socket.socket, peer, reply: bytes) -> None:
        sock.sendall(reply)
        self.proven.append((sock, reply))
        self.got.set()

    def close(self) -> None:
        self.gate.close()
        for s, _ in self.proven:
            s.close()


@pytest.fixture
def server():
    made: list[Server] = []

    def make(**kw) -> Server:
        s = Server(GateLimits(**kw))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def knock(address, source: str | None = None, timeout: float = 5.0) -> bytes:
    """Connect, answer, and return what the server replied."""
    with socket.create_connection(address, timeout=timeout,
                                  source_address=None if source is None else (source, 0)) as s:
        assert s.recv(1) == b"?"
        s.sendall(ANSWER)
        return s.recv(16)


def until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(cond())


def test_strangers_over_the_per_address_cap_close_their_oldest_and_ours_gets_in(server):
    srv = server(max_per_peer=20, max_pending=1000, deadline_s=30.0)
    with Strangers(srv.address, 200) as flood:
        assert until(lambda: srv.gate.num_evicted >= 180)
        assert srv.gate.num_pending <= 20
        assert knock(srv.address) == b"welcome"
        # the oldest went (one more to make room for ours); the 19 newest still wait
        assert flood.num_closed_by_server() == 200 - 19


def test_the_total_cap_holds_across_addresses_and_ours_gets_in(server):
    srv = server(max_per_peer=50, max_pending=60, deadline_s=30.0)
    floods = [Strangers(srv.address, 40, source=f"127.0.0.{k}") for k in (2, 3, 4)]
    try:
        # 120 strangers, a cap of 60: the 60 oldest closed, the 60 newest waiting (read once
        # settled: between closing the oldest and taking the newest the gate holds 59)
        assert until(lambda: srv.gate.num_evicted >= 60 and srv.gate.num_pending == 60)
        assert srv.gate.num_evicted == 60
        assert knock(srv.address, source="127.0.0.5") == b"welcome"
    finally:
        for f in floods:
            f.close()


def test_a_trickle_is_closed_at_the_deadline_from_accept(server):
    srv = server(deadline_s=0.5)
    sock = socket.create_connection(srv.address, timeout=5.0)
    t0 = time.monotonic()
    try:
        with dripping(sock):
            assert closed_by_peer(sock, within=5.0)
            assert 0.4 < time.monotonic() - t0 < 2.0
            assert srv.gate.num_expired == 1
    finally:
        sock.close()


def test_a_wrong_answer_is_closed_and_counted(server):
    srv = server()
    with socket.create_connection(srv.address, timeout=5.0) as s:
        s.sendall(b"x" * len(ANSWER))
        assert closed_by_peer(s)
    assert srv.gate.num_refused == 1 and not srv.proven


def test_bytes_past_the_answer_stay_for_the_server(server):
    """The gate reads exactly the answer: what a peer sends after it is the server's to read."""
    srv = server()
    with socket.create_connection(srv.address, timeout=5.0) as s:
        s.sendall(ANSWER + b"first frame")
        assert s.recv(1) == b"?"
        assert s.recv(16) == b"welcome"
        assert srv.got.wait(5.0)
        conn, _ = srv.proven[0]
        conn.settimeout(5.0)
        assert conn.recv(64) == b"first frame"


def test_the_gate_is_one_thread_however_many_wait(server):
    before = threading.active_count()
    srv = server(deadline_s=30.0, max_per_peer=1000)
    with Strangers(srv.address, 300):
        assert until(lambda: srv.gate.num_pending == 300)
        assert threading.active_count() - before == 1


def test_closing_the_gate_closes_the_port_and_the_waiting(server):
    srv = server(deadline_s=30.0)
    with Strangers(srv.address, 5) as flood:
        assert until(lambda: srv.gate.num_pending == 5)
        srv.gate.close()
        assert all(closed_by_peer(s) for s in flood.socks)
    with pytest.raises(OSError):
        socket.create_connection(srv.address, timeout=2.0)


@pytest.mark.parametrize("kw", [{"deadline_s": 0}, {"max_pending": 0}, {"max_per_peer": 0}])
def test_limits_must_be_positive(kw):
    with pytest.raises(ValueError):
        GateLimits(**kw)


GATE_WITH_FEW_FDS = """
import resource, socket, sys
from llumnix.net.gate import Challenge, Gate, GateLimits
listener = socket.create_server(("127.0.0.1", 0), backlog=socket.SOMAXCONN)
def proven(sock, peer, reply):
    sock.sendall(reply)
    sock.close()
gate = Gate("few fds", listener, lambda: Challenge(b"?", 12, lambda a: b"welcome" if a == b"open sesame!" else None),
            proven, GateLimits(deadline_s=60.0, max_pending=10_000, max_per_peer=10_000))
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(listener.getsockname()[1], flush=True)
for _ in sys.stdin:
    print(gate.num_pending, gate.num_evicted, flush=True)
"""


def test_out_of_file_descriptors_the_oldest_stranger_makes_room():
    """A process at its limit on open files cannot accept: the gate closes its oldest
    stranger and accepts again, so one of ours still gets in."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", GATE_WITH_FEW_FDS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        address = ("127.0.0.1", int(proc.stdout.readline()))
        with Strangers(address, 200):
            assert knock(address, timeout=10.0) == b"welcome"
            proc.stdin.write("\n")
            proc.stdin.flush()
            pending, evicted = map(int, proc.stdout.readline().split())
        assert pending < 48 and evicted > 150
    finally:
        proc.kill()
        proc.wait()
