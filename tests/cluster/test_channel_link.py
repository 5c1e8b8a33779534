"""The request channel end to end without Ray: an instance's ``ChannelServer`` over a real
engine, a gateway's ``InstanceLink`` on asyncio, a real socket between them."""
from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from llumnix.cluster.channel import ChannelServer, pack
from llumnix.cluster.instance import InstanceServer
from llumnix.cluster.link import InstanceLink, _Line
from llumnix.core.clock import WallClock
from llumnix.core.errors import InvalidRequestError
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from tests.engine.helpers import make_engine

TOKEN = b"t" * 32


class Sink:
    def __init__(self) -> None:
        self.outputs: dict[str, list[int]] = {}
        self.finished: set[str] = set()
        self.statuses: list = []
        self.results: list[tuple[str, BaseException | None]] = []
        self.frames = 0

    def on_outputs(self, instance_id, outputs):
        for o in outputs:
            self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.is_finished:
                self.finished.add(o.request_id)

    def on_statuses(self, instance_id, statuses):
        self.statuses += statuses

    def on_add_result(self, instance_id, request_id, error):
        self.results.append((request_id, error))


@pytest.fixture()
def instance():
    eng = make_engine()
    eng.clock = WallClock()
    srv = InstanceServer(eng, Llumlet(eng.instance_id, eng, ReschedulingConfig(), FreenessConfig()),
                         status_interval_s=0.01)
    srv.start()

    def add(req: GenerateRequest) -> Future:
        def run() -> None:
            if req.params.max_tokens > 100:
                raise InvalidRequestError("max_tokens is too large here", "max_tokens")
            eng.add_request(req.request_id, req.prompt_token_ids, req.params, client=req.client)
            if req.final_only:
                srv.hold_until_final(req.request_id)
        return srv.run_at_boundary(run)

    chan = ChannelServer(srv, TOKEN, add, heartbeat_s=0.2)
    yield srv, chan
    chan.close()
    srv.stop()


def _req(rid: str, max_tokens: int = 5, final_only: bool = False) -> GenerateRequest:
    return GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens), 0, 0.0, client="gw",
                           final_only=final_only)


async def _until(cond, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_requests_go_out_and_their_outputs_statuses_and_results_come_back(instance):
    srv, chan = instance

    async def main() -> Sink:
        sink = Sink()
        link = InstanceLink("i0", chan.address, TOKEN, "gw", sink)
        await link.open()
        runner = asyncio.create_task(link.run())
        link.add(_req("streamed"))
        link.add(_req("whole", final_only=True))
        link.add(_req("refused", max_tokens=1000))
        await _until(lambda: sink.finished == {"streamed", "whole"} and len(sink.results) == 3)
        link.close()
        with pytest.raises(ConnectionError):
            await runner
        return sink

    sink = asyncio.run(main())
    assert len(sink.outputs["streamed"]) == 5 and len(sink.outputs["whole"]) == 5
    results = dict(sink.results)
    assert results["streamed"] is None and results["whole"] is None
    assert isinstance(results["refused"], InvalidRequestError)
    assert sink.statuses and sink.statuses[-1].instance_id == srv.engine.instance_id
    assert srv.call(lambda: srv.engine.kv.num_free_blocks) == srv.engine.kv.num_total_blocks


def test_a_reopened_line_resends_only_what_was_not_acknowledged(instance):
    _, chan = instance

    async def main() -> tuple[Sink, Sink]:
        first, second = Sink(), Sink()
        link = InstanceLink("i0", chan.address, TOKEN, "gw", first)
        await link.open()
        runner = asyncio.create_task(link.run())
        link.add(_req("a", final_only=True))
        await _until(lambda: "a" in first.finished)
        acked = link.acked
        link.close()
        with pytest.raises(ConnectionError):
            await runner
        link._sink = second  # noqa: SLF001 - the same link, reopened, reads into a fresh sink
        await link.open()
        runner = asyncio.create_task(link.run())
        link.add(_req("b", final_only=True))
        await _until(lambda: "b" in second.finished)
        link.close()
        with pytest.raises(ConnectionError):
            await runner
        assert acked >= 1
        return first, second

    first, second = asyncio.run(main())
    assert set(second.outputs) == {"b"}  # "a" was acknowledged in the hello: not sent again


def test_a_peer_without_the_token_is_refused_both_ways(instance):
    _, chan = instance

    async def main() -> None:
        link = InstanceLink("i0", chan.address, b"wrong" * 8, "gw", Sink())
        with pytest.raises(ConnectionError):
            await link.open(timeout_s=2.0)
        assert not link.is_open

    asyncio.run(main())


def test_frames_are_cut_out_of_any_split_of_the_bytes():
    """The protocol parses whatever pieces TCP hands it: a frame cut anywhere, several in one piece."""

    class Transport:
        def write(self, data):
            pass

        def is_closing(self):
            return False

        def close(self):
            pass

    frames = [("out", k, [], [], [(f"r{k}", None)]) for k in range(1, 6)]
    data = b"".join(pack(f) for f in frames)

    async def feed(chunk: int) -> Sink:
        sink = Sink()
        link = InstanceLink("i0", ("127.0.0.1", 0), TOKEN, "gw", sink)
        line = _Line(link)
        line.connection_made(Transport())
        line.end.is_proven = True  # the handshake skipped
        line.proven.set_result(None)
        for i in range(0, len(data), chunk):
            line.data_received(data[i:i + chunk])
        assert line.end.is_empty and not line.closed.done()
        return sink

    for chunk in (1, 3, 7, len(data) // 2, len(data)):
        sink = asyncio.run(feed(chunk))
        assert [r for r, _ in sink.results] == [f"r{k}" for k in range(1, 6)], chunk


def test_a_frame_over_the_limit_or_not_a_frame_breaks_the_line():
    class Transport:
        closed = False

        def write(self, data):
            pass

        def is_closing(self):
            return self.closed

        def close(self):
            self.closed = True

    async def feed(data: bytes) -> None:
        link = InstanceLink("i0", ("127.0.0.1", 0), TOKEN, "gw", Sink())
        line = _Line(link)
        t = Transport()
        line.connection_made(t)
        line.end.is_proven = True  # the handshake skipped
        line.proven.set_result(None)
        line.data_received(data)
        assert t.closed
        with pytest.raises(ConnectionError):
            await line.closed

    asyncio.run(feed(b"\xff\xff\xff\xff"))
    junk = b"not a pickle"
    asyncio.run(feed(len(junk).to_bytes(4, "big") + junk))
    asyncio.run(feed(pack(("out", 1))))  # a pickle, but not a frame


def test_a_client_without_requests_gets_a_status_at_most_every_gap(instance):
    """Every add and every finish makes the engine report; a client that sent none of those
    requests is told at most once a gap, and still learns the newest state."""
    srv, chan = instance  # the engine reports every 10 ms while busy
    chan._status_gap_s = 0.1  # noqa: SLF001 - new lines take it; a longer gap than the engine's

    async def main() -> tuple[int, int, float, Sink]:
        sender, watcher = Sink(), Sink()
        counted = []
        watcher.on_statuses = lambda iid, sts: (counted.append(len(sts)), Sink.on_statuses(watcher, iid, sts))
        a = InstanceLink("i0", chan.address, TOKEN, "gw", sender)
        b = InstanceLink("i0", chan.address, TOKEN, "other", watcher)
        await a.open()
        await b.open()
        runners = [asyncio.create_task(x.run()) for x in (a, b)]
        seq0, t0 = srv._status_seq, asyncio.get_running_loop().time()  # noqa: SLF001
        for i in range(30):
            a.add(_req(f"r{i}", max_tokens=4, final_only=True))
            await _until(lambda i=i: f"r{i}" in sender.finished)
        elapsed = asyncio.get_running_loop().time() - t0
        published = srv._status_seq - seq0  # noqa: SLF001
        await _until(lambda: not watcher.statuses[-1].running)
        for x in (a, b):
            x.close()
        await asyncio.gather(*runners, return_exceptions=True)
        return len(counted), published, elapsed, watcher

    frames, published, elapsed, watcher = asyncio.run(main())
    assert published >= 60  # at least a report after each add and each finish
    assert frames <= elapsed / 0.1 + 3, (frames, elapsed)
    assert all(len(st.running) == 0 for st in watcher.statuses[-1:])


def test_the_newest_status_carries_the_evicted_keys_of_those_it_replaces():
    from llumnix.core.evolve import evolve

    eng = make_engine()
    srv = InstanceServer(eng, Llumlet(eng.instance_id, eng, ReschedulingConfig(), FreenessConfig()))
    base = srv.llumlet.report(0.0)
    for n, keys in enumerate([(b"a",), (), (b"b", b"c")], start=1):
        srv.statuses.append((n, evolve(base, step_id=n, evicted_prefix_keys=keys)))
    seq, st = srv.newest_status(0)
    assert (seq, st.step_id, st.evicted_prefix_keys) == (3, 3, (b"a", b"b", b"c"))
    seq, st = srv.newest_status(2)
    assert (seq, st.evicted_prefix_keys) == (3, (b"b", b"c"))
    assert srv.newest_status(3) == (3, None)


def test_llumscheds_feed_reads_statuses_at_its_gap_and_reopens_a_broken_line(instance):
    import socket as socketlib
    import threading
    import time

    from llumnix.cluster.status_feed import CLIENT, StatusFeed

    srv, chan = instance
    got: list[tuple[str, float]] = []
    lock = threading.Lock()

    def on_statuses(iid, statuses):
        with lock:
            got.extend((iid, time.monotonic()) for _ in statuses)

    feed = StatusFeed(TOKEN, on_statuses, status_gap_s=0.1)
    try:
        feed.watch("i0", chan.address)
        deadline = time.time() + 10
        while not feed.is_live("i0") and time.time() < deadline:
            time.sleep(0.02)
        assert feed.is_live("i0") and chan.has_client(CLIENT)
        with lock:
            got.clear()
        t0 = time.monotonic()
        for i in range(20):  # busy: the engine reports every 10 ms, the feed gets one a gap
            srv.call(lambda i=i: srv.engine.add_request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=30)))
            time.sleep(0.02)
        elapsed = time.monotonic() - t0
        with lock:
            n = len(got)
        assert 2 <= n <= elapsed / 0.1 + 2, (n, elapsed)
        with chan._lock:  # noqa: SLF001 - the instance's end drops the line
            for conn in chan._conns:  # noqa: SLF001
                conn.shutdown(socketlib.SHUT_RDWR)
        before = feed.num_frames
        deadline = time.time() + 10
        while feed.num_frames <= before + 2 and time.time() < deadline:
            time.sleep(0.05)
        assert feed.num_frames > before + 2  # reopened, reading again
        feed.drop("i0")
        deadline = time.time() + 5
        while chan.has_client(CLIENT) and time.time() < deadline:
            time.sleep(0.02)
        assert not chan.has_client(CLIENT) and not feed.is_live("i0")
    finally:
        feed.close()


def test_a_feed_without_a_gap_gets_every_status_the_instance_reports(instance):
    """Triggered rescheduling's line (gap 0): each report reaches LlumSched as it is made,
    not one a gap; a status the writer had no time to send before the next is superseded."""
    import threading
    import time

    from llumnix.cluster.status_feed import StatusFeed

    srv, chan = instance
    got: list[float] = []
    lock = threading.Lock()

    def on_statuses(iid, statuses):
        with lock:
            got.extend(s.timestamp for s in statuses)

    feed = StatusFeed(TOKEN, on_statuses, status_gap_s=0.0)
    try:
        feed.watch("i0", chan.address)
        deadline = time.time() + 10
        while not feed.is_live("i0") and time.time() < deadline:
            time.sleep(0.02)
        assert feed.is_live("i0")
        seq0 = srv.newest_status(0)[0]
        with lock:
            got.clear()
        for i in range(20):  # busy: the engine reports every 10 ms
            srv.call(lambda i=i: srv.engine.add_request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=30)))
            time.sleep(0.02)
        time.sleep(0.05)
        num_reported = srv.newest_status(0)[0] - seq0
        with lock:
            n, stamps = len(got), list(got)
        assert num_reported >= 20 and n >= num_reported // 2, (n, num_reported)
        assert stamps == sorted(stamps)
    finally:
        feed.close()


@pytest.mark.parametrize("urgent", [True, False])
def test_a_status_whose_marks_changed_comes_at_once_to_a_line_that_asks(instance, urgent):
    """LlumSched's line (``urgent_marks``): statuses one a gap (5 s here), but the one that
    makes the instance a migration source at once; without it, not."""
    import threading
    import time

    from llumnix.cluster.status_feed import StatusFeed

    srv, chan = instance
    got: list = []
    lock = threading.Lock()

    def on_statuses(iid, statuses):
        with lock:
            got.extend(statuses)

    feed = StatusFeed(TOKEN, on_statuses, status_gap_s=5.0, urgent_marks=urgent)
    try:
        feed.watch("i0", chan.address)
        deadline = time.time() + 10
        while not got and time.time() < deadline:
            time.sleep(0.02)
        assert got and not got[-1].running  # idle: a destination
        time.sleep(0.1)
        # 62 of 64 blocks: F = 2, below the out threshold (3)
        srv.call(lambda: srv.engine.add_request("big", list(range(1, 249)), SamplingParams(max_tokens=8)))
        deadline = time.time() + 1.0
        while time.time() < deadline and len(got) < 2:
            time.sleep(0.01)
        # (the request may be over by the time the line sends: the newest status goes)
        with lock:
            assert (len(got) >= 2) is urgent, [(s.timestamp, s.num_running) for s in got]
    finally:
        feed.close()


def test_an_instance_the_feed_cannot_reach_leaves_the_other_lines_alone(instance):
    import time

    from llumnix.cluster.status_feed import StatusFeed

    _, chan = instance
    dead = socket_free_port()
    feed = StatusFeed(TOKEN, lambda iid, sts: None)
    try:
        feed.watch("gone", ("127.0.0.1", dead))
        feed.watch("i0", chan.address)
        deadline = time.time() + 10
        while not feed.is_live("i0") and time.time() < deadline:
            time.sleep(0.02)
        assert feed.is_live("i0") and not feed.is_live("gone")
    finally:
        feed.close()


def socket_free_port() -> int:
    import socket as socketlib

    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- strangers at the port (issue 43) ----------------------------------------------------

@pytest.mark.parametrize("num, trickle_s", [(300, None), (300, 0.05),
                                            pytest.param(10_000, 0.5, marks=pytest.mark.slow)])
def test_strangers_idle_or_trickling_cost_no_thread_and_keep_no_gateway_out(instance, num, trickle_s):
    """4,000 trickling connections once held 4,044 threads. Now they wait at the gate: the
    instance's threads stay as they were, and a gateway's line opens and serves a request."""
    import threading
    import time

    from llumnix.cluster.status_feed import CLIENT, StatusFeed
    from tests.net.strangers import Strangers, raise_fd_limit

    _, chan = instance
    raise_fd_limit(num + 2000)
    base = threading.active_count()
    with Strangers(chan.address, num, trickle_s=trickle_s):
        gate = chan.gate
        deadline = time.monotonic() + 30.0
        while gate.num_pending + gate.num_evicted + gate.num_refused < num and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.num_pending <= gate.limits.max_per_peer
        assert threading.active_count() - base <= 1  # the trickler's own

        async def main() -> Sink:
            sink = Sink()
            link = InstanceLink("i0", chan.address, TOKEN, "gw", sink)
            await link.open()
            runner = asyncio.create_task(link.run())
            link.add(_req("among-strangers"))
            await _until(lambda: "among-strangers" in sink.finished)
            link.close()
            await asyncio.gather(runner, return_exceptions=True)
            return sink

        t0 = time.monotonic()
        sink = asyncio.run(main())
        served_s = time.monotonic() - t0
        assert len(sink.outputs["among-strangers"]) == 5 and served_s < 5.0
        feed = StatusFeed(TOKEN, lambda iid, sts: None)
        try:
            feed.watch("i0", chan.address)
            deadline = time.monotonic() + 10.0
            while not feed.is_live("i0") and time.monotonic() < deadline:
                time.sleep(0.02)
            assert feed.is_live("i0") and chan.has_client(CLIENT)
        finally:
            feed.close()


def test_a_trickling_handshake_is_closed_at_the_deadline_from_accept(instance):
    """The deadline once restarted on every byte: a byte each 50 ms held a thread forever."""
    import socket as socketlib
    import time

    from llumnix.net.gate import GateLimits
    from tests.net.strangers import closed_by_peer, dripping

    srv, _ = instance
    chan = ChannelServer(srv, TOKEN, lambda req: Future(), limits=GateLimits(deadline_s=0.5))
    sock = socketlib.create_connection(chan.address, timeout=5.0)
    t0 = time.monotonic()
    try:
        with dripping(sock):  # the 48-byte answer would take 2.4 s
            assert closed_by_peer(sock, within=5.0)
            assert 0.4 < time.monotonic() - t0 < 2.0 and chan.gate.num_expired == 1
    finally:
        sock.close()
        chan.close()
