"""What a stranger can do to a gloo pair: there is no rendezvous port to reach, and one
that takes gloo's connection in place of the peer (or reflects the source's challenge)
proves nothing, learns nothing and writes nothing."""
from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time

import psutil
import pytest

from llumnix.migration.gloo_rendezvous import NONCE, PairStore, prove_as_destination, prove_as_source
from llumnix.migration.gloo_transport import GlooReceiver, GlooSender
from llumnix.migration.transport import TransportError, TransportOptions

TOKEN = b"cluster-secret"
OPTIONS = TransportOptions(bulk_nice=0, timeout_s=10.0)


class Wire:
    """Two ends of an in-memory connection, as the proofs see a gloo group's."""

    def __init__(self) -> None:
        self.a_to_b: queue.Queue[bytes] = queue.Queue()
        self.b_to_a: queue.Queue[bytes] = queue.Queue()

    def end(self, side: str):
        out, inb = (self.a_to_b, self.b_to_a) if side == "a" else (self.b_to_a, self.a_to_b)

        def recv(n: int) -> bytes:
            data = inb.get(timeout=1)
            assert len(data) == n
            return data
        return out.put, recv


def run_both(left, right) -> tuple[BaseException | None, BaseException | None]:
    errors: list[BaseException | None] = [None, None]

    def run(i, fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[i] = e
    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((left, right))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return errors[0], errors[1]


def test_the_proof_passes_with_the_token_on_both_sides():
    w = Wire()
    errs = run_both(lambda: prove_as_source(*w.end("a"), TOKEN), lambda: prove_as_destination(*w.end("b"), TOKEN))
    assert errs == (None, None)


def test_a_peer_without_the_token_is_refused_by_the_source_before_it_answers_anything():
    w = Wire()
    sent = []
    send, recv = w.end("a")
    src_err, _ = run_both(lambda: prove_as_source(lambda b: (sent.append(b), send(b)), recv, TOKEN),
                          lambda: prove_as_destination(*w.end("b"), b"guess"))
    assert isinstance(src_err, TransportError)
    assert [len(b) for b in sent] == [NONCE]  # its nonce only: no MAC computed for the stranger


def test_a_source_without_the_token_is_refused_by_the_destination():
    w = Wire()
    send, recv = w.end("a")

    def stranger() -> None:
        send(os.urandom(NONCE))
        recv(NONCE + 32)
        send(os.urandom(32))  # it cannot make HMAC(token, "src" n_d)
    _, dst_err = run_both(stranger, lambda: prove_as_destination(*w.end("b"), TOKEN))
    assert isinstance(dst_err, TransportError)


def test_reflecting_the_sources_challenge_proves_nothing():
    """The old store proof fell to this: a stranger posed as the destination by handing
    the source its own nonce and then its own answer."""
    to_src: queue.Queue[bytes] = queue.Queue()
    from_src: queue.Queue[bytes] = queue.Queue()

    def attacker() -> None:
        n_s = from_src.get(timeout=5)
        to_src.put(n_s + b"\0" * 32)  # it cannot make HMAC(token, "dst" n_s); nothing to copy yet

    t = threading.Thread(target=attacker)
    t.start()
    with pytest.raises(TransportError):
        prove_as_source(from_src.put, lambda n: to_src.get(timeout=5), TOKEN)
    t.join()
    assert from_src.empty()  # the source sent no MAC the attacker could reflect


def test_a_peer_half_that_claims_this_sides_keys_is_refused():
    store = PairStore(1.0)
    store.set("0/0", b"mine")
    for bad in ({"0/0": b"theirs"}, {}, {"k": "not bytes"}, {f"k{i}": b"x" for i in range(9)},
                {"k": b"x" * 5000}, "a string"):
        with pytest.raises(TransportError):
            store.join(bad)


class Sink:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, request_id: str, block_ids: list[int], data) -> bool:
        self.writes.append(request_id)
        return True


class Source:
    executor = None
    block_ids = [1]
    nbytes = 16

    def contiguous(self) -> bytes:
        return b"secret KV bytes!"


def open_pair(src_token: bytes, dst_token: bytes, sink: Sink):
    receivers: list[GlooReceiver] = []

    def accept(pair_id, offer):
        receivers.append(GlooReceiver(pair_id, offer, sink, dst_token, OPTIONS, local_host="127.0.0.1"))
        return receivers[-1].answer
    return GlooSender(accept, src_token, host="127.0.0.1", options=OPTIONS), receivers


def test_a_gloo_peer_without_the_token_gets_no_pair_and_no_frame():
    """A peer that speaks gloo and forms the groups (as one that took gloo's connection
    would) but lacks the token: the source refuses the pair; nothing reaches a sink."""
    sink = Sink()
    with pytest.raises(TransportError, match="cluster token"):
        open_pair(TOKEN, b"stranger", sink)
    assert sink.writes == []


def listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def listening_sockets() -> set[tuple[int, int]]:
    """(port, inode) of this process's listening TCP sockets: a socket, not a port number,
    which the kernel may hand to a new socket once the old one is closed."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                mine.add(int(link[8:-1]))
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[9]) in mine:  # 0A: LISTEN
                    out.add((int(cols[1].rsplit(":", 1)[1], 16), int(cols[9])))
    return out


def test_a_pair_opens_no_port_but_gloos_own_and_strangers_there_stop_nothing():
    """The pair's only listening ports are gloo's (the rendezvous has none). Strangers
    holding and writing garbage to them leave frames flowing, and closing the pair frees
    every socket they held (gloo keeps a connection that sent bytes until the pair closes:
    what a stranger can hold is bounded by the pair's lifetime)."""
    me = psutil.Process()
    before_ports, before_fds = listening_ports(), me.num_fds()
    sink = Sink()
    sender, receivers = open_pair(TOKEN, TOKEN, sink)
    ports = listening_ports() - before_ports
    assert len(ports) == 4  # one gloo device a group, two groups a side
    strangers = [socket.create_connection(("127.0.0.1", p)) for p in ports for _ in range(50)]
    for i, s in enumerate(strangers):
        if i % 2:
            s.send(os.urandom(64))  # garbage where gloo expects a pair's sequence number
    threads = me.num_threads()
    assert sender.send("r1", [1], Source(), urgent=True)
    assert sender.send("r2", [1], Source(), urgent=False)
    assert sink.writes == ["r1", "r2"]
    assert me.num_threads() <= threads  # no thread per stranger
    for s in strangers:
        s.close()
    sender.close()
    deadline = time.monotonic() + 10
    while any(r.is_alive for r in receivers) and time.monotonic() < deadline:
        time.sleep(0.05)
    del sender, receivers
    import gc

    gc.collect()
    while (listening_ports() & ports or me.num_fds() > before_fds + 4) and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    assert not listening_ports() & ports
    assert me.num_fds() <= before_fds + 4, (before_fds, me.num_fds())


def test_an_old_pair_is_formed_anew_and_the_sockets_strangers_left_go_with_it():
    """Past its age a pair forms anew before a pre-copy frame; gloo's listeners of the old
    one close, and with them every socket strangers left there, while the sender stays."""
    me = psutil.Process()
    sink = Sink()
    receivers: list[GlooReceiver] = []

    def accept(pair_id, offer):
        receivers.append(GlooReceiver(pair_id, offer, sink, TOKEN, OPTIONS, local_host="127.0.0.1"))
        return receivers[-1].answer
    before_ports, before_sockets = listening_ports(), listening_sockets()
    sender = GlooSender(accept, TOKEN, host="127.0.0.1", options=OPTIONS, max_pair_age_s=0.5)
    first = listening_ports() - before_ports
    first_sockets = listening_sockets() - before_sockets
    assert {port for port, _ in first_sockets} == first
    with_pair = me.num_fds()
    strangers = [socket.create_connection(("127.0.0.1", p)) for p in first for _ in range(50)]
    for s in strangers:
        s.send(os.urandom(64))
        s.close()  # gone, but gloo keeps the socket that sent it bytes
    deadline = time.monotonic() + 10
    while me.num_fds() < with_pair + 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert me.num_fds() >= with_pair + 200  # the leak the renewal bounds
    assert sender.send("r1", [1], Source(), urgent=False) and sender.num_renewals == 0
    time.sleep(0.6)
    assert sender.send("r2", [1], Source(), urgent=True) and sender.num_renewals == 0  # never before the last stage
    assert sender.send("r3", [1], Source(), urgent=False) and sender.num_renewals == 1
    assert sink.writes == ["r1", "r2", "r3"]
    deadline = time.monotonic() + 10  # gloo closes the old pair's sockets from its own threads
    while listening_sockets() & first_sockets and time.monotonic() < deadline:
        time.sleep(0.05)  # (a fresh-clone CI once found one of them still listening at once)
    assert not listening_sockets() & first_sockets  # the old pair's listeners are closed
    deadline = time.monotonic() + 10
    while me.num_fds() > with_pair + 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert me.num_fds() <= with_pair + 8, (with_pair, me.num_fds())
    sender.close()
