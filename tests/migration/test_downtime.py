"""A running request's migration downtime: from its pause on the source to the start of
the destination's first step that computes it, not to the commit (issue 29, item 7).

The real driver and destination endpoint run here on one fake clock, with every step
boundary of both engines placed by the test, so each instant of the sequence is known::

    source     step  step  | pause  last stage  install (queued)
    dest.      step ......................................| boundary: install | step (prefill, not it) | step with it
                                                          T1                                           T2
    downtime = T2 - pause   (the commit is earlier: it does not wait for the destination)
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from llumnix.core.sampling_params import SamplingParams
from llumnix.migration import MigrationConfig
from llumnix.migration.destination import DestinationEndpoint
from llumnix.migration.driver import migrate
from llumnix.migration.transport import KVSource
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from llumnix.sim.events import EventKind
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import fit_a10_llama7b
from llumnix.sim.loop import EventLoop
from llumnix.sim.migration import MigrationRun
from tests.engine.helpers import make_engine

PROMPT = list(range(1, 30))
COPY_S = 0.003  # each KV send
HOP_S = 0.002  # one way of the install call


class InlineServer:
    """An instance whose step thread is the test: ``call`` runs at once (the engine is
    between steps), ``run_at_boundary`` waits in the inbox until ``boundary()``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.instance_id = engine.instance_id
        self.llumlet = Llumlet(self.instance_id, engine, ReschedulingConfig(), FreenessConfig())
        self.inbox: list[tuple[Any, Future[Any]]] = []

    def call(self, fn: Any, timeout: float = 30.0) -> Any:
        return fn()

    def run_at_boundary(self, fn: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.inbox.append((fn, fut))
        return fut

    def boundary(self) -> None:
        for fn, fut in self.inbox:
            fut.set_result(fn())
        self.inbox.clear()

    def step(self) -> list[str]:
        """One step; the requests it computed."""
        batch = self.engine.schedule()
        ids = [e.request_id for e in batch.scheduled]
        if ids:
            self.engine.update(batch, self.engine.executor.execute(batch))
        return ids


class OneClock:
    """The engines' virtual clock, read by the destination on another machine's scale."""

    def __init__(self, engine: Any, offset: float = 0.0) -> None:
        self.clock, self.offset = engine.clock, offset

    def advance(self, dt: float) -> None:
        self.clock.advance_to(self.clock.now() + dt)

    def __call__(self) -> float:
        return float(self.clock.now()) + self.offset


class Sender:
    name = "inline"

    def __init__(self, endpoint: DestinationEndpoint, clock: OneClock) -> None:
        self.endpoint, self.clock = endpoint, clock

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool:
        self.clock.advance(COPY_S)
        return self.endpoint.write(request_id, dst_block_ids, src.contiguous())

    def close(self) -> None:
        pass


class BusyDestination:
    """The Destination protocol over the endpoint, with the install call's hops on the
    clock; when the source asks for the first step, the destination's step in flight
    ends at ``t1`` (the boundary installs the request), a prefill of another request
    runs until ``t2``, and the step at ``t2`` takes the migrated request."""

    def __init__(self, endpoint: DestinationEndpoint, server: InlineServer, clock: OneClock,
                 t1: float, t2: float) -> None:
        self.endpoint, self.server, self.clock, self.t1, self.t2 = endpoint, server, clock, t1, t2
        self.instance_id = endpoint.instance_id
        self.steps: list[tuple[float, list[str]]] = []

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        return self.endpoint.try_reserve(request_id, num_blocks)

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        return self.endpoint.try_reserve_with_cache(request_id, keys)

    def release(self, request_id: str) -> int:
        return self.endpoint.release(request_id)

    def install(self, snapshot: Any) -> float:
        self.clock.advance(HOP_S)
        queued = self.endpoint.install(snapshot)
        self.clock.advance(HOP_S)
        return queued

    def first_step(self, request_id: str, timeout_s: float) -> tuple[float, float] | None:
        assert self.server.inbox, "the install waits for the destination's boundary"
        for t, action in ((self.t1, self.server.boundary), (self.t1, None), (self.t2, None)):
            self.clock.clock.advance_to(t)
            if action is not None:
                action()
            else:
                self.steps.append((t, self.server.step()))
        return self.endpoint.first_step(request_id, timeout_s)


def _pair(offset: float) -> tuple[InlineServer, InlineServer, OneClock, DestinationEndpoint]:
    src_eng = make_engine(instance_id="src")
    dst_eng = make_engine(instance_id="dst")
    dst_eng.clock = src_eng.clock  # one virtual time; the destination reads it with an offset
    src, dst = InlineServer(src_eng), InlineServer(dst_eng)
    clock = OneClock(src_eng)
    endpoint = DestinationEndpoint(dst, b"token", now=OneClock(src_eng, offset))
    src_eng.add_request("x", PROMPT, SamplingParams(max_tokens=100))
    dst_eng.add_request("busy", PROMPT, SamplingParams(max_tokens=100))
    for _ in range(3):
        src.step()
        dst.step()
        clock.advance(0.01)
    dst_eng.add_request("newcomer", PROMPT, SamplingParams(max_tokens=5))  # prefilled at the boundary
    return src, dst, clock, endpoint


@pytest.mark.parametrize("offset", [0.0, 1000.0])  # the destination's clock on another scale
def test_downtime_runs_from_the_pause_to_the_destinations_first_step_with_the_request(offset):
    src, dst, clock, endpoint = _pair(offset)
    try:
        start = clock()
        busy = BusyDestination(endpoint, dst, clock, t1=start + 0.150, t2=start + 0.400)
        rep = migrate("x", src, busy, Sender(endpoint, clock), MigrationConfig(max_stages=3), now=clock)
        assert rep.committed, rep.abort_reason
        paused = rep.marks["paused"]
        # The boundary's step is the newcomer's prefill; the request rejoins a batch at t2.
        assert busy.steps == [(busy.t1, ["newcomer"]), (busy.t2, ["busy", "x", "newcomer"])]
        assert rep.downtime == pytest.approx(busy.t2 - paused, abs=1e-9)
        assert rep.marks["resumed"] == pytest.approx(busy.t2, abs=1e-9)
        # Without the wait the downtime would have been the last stage and the install alone.
        assert rep.end_time - paused == pytest.approx(COPY_S + 2 * HOP_S, abs=1e-9)
        assert rep.downtime > rep.end_time - paused + 0.3
        assert "x" not in src.engine.requests and dst.engine.requests["x"].num_output_tokens == 4
        for s in (src, dst):
            s.engine.check_invariants()
    finally:
        endpoint.close()


def test_a_request_gone_before_its_first_step_keeps_the_downtime_to_its_commit():
    src, dst, clock, endpoint = _pair(0.0)
    try:
        class AbortedThere(BusyDestination):
            def first_step(self, request_id: str, timeout_s: float) -> tuple[float, float] | None:
                self.server.boundary()
                self.server.engine.abort_request(request_id)  # the client left
                return self.endpoint.first_step(request_id, timeout_s)

        gone = AbortedThere(endpoint, dst, clock, t1=0.0, t2=0.0)
        rep = migrate("x", src, gone, Sender(endpoint, clock), MigrationConfig(max_stages=3), now=clock)
        assert rep.committed and "resumed" not in rep.marks
        assert rep.downtime == pytest.approx(rep.end_time - rep.marks["paused"], abs=1e-9)
        assert endpoint.first_step("x", 0.0) is None  # asked once; nothing left behind
    finally:
        endpoint.close()


def test_the_engine_tells_an_installed_request_its_first_step_once_and_its_leaving():
    eng = make_engine(instance_id="dst")
    seen: list[tuple[str, float | None]] = []
    snaps = {}
    for rid in ("a", "b"):
        donor = make_engine(instance_id="donor")
        donor.add_request(rid, PROMPT, SamplingParams(max_tokens=20))
        donor.step()
        snaps[rid] = donor.snapshot_request(rid)
        assert eng.try_reserve(rid, len(donor.block_table(rid))) is not None
        eng.install_request(snaps[rid], lambda t, rid=rid: seen.append((rid, t)))
    eng.abort_request("b")
    eng.clock.advance_to(5.0)
    eng.step()
    eng.clock.advance_to(6.0)
    eng.step()
    assert seen == [("b", None), ("a", 5.0)]


def test_the_simulator_counts_the_wait_for_the_destinations_next_step():
    """sim/migration.py, the same measure in virtual time: the destination decodes a large
    batch (long steps), so the migrated request waits for its current step to end."""
    model = fit_a10_llama7b()
    loop = EventLoop()
    clock = loop.clock

    def instance(name: str) -> SimInstance:
        from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
        from llumnix.engine import EngineCore
        from llumnix.sim.executor import SimExecutor

        config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=2000),
                              scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=16384),
                              max_model_len=4096)
        ex = SimExecutor(model)
        return SimInstance(name, EngineCore(config, ex, 2000, clock=clock, instance_id=name), ex)

    src, dst = instance("src"), instance("dst")
    for i in range(4):
        src.engine.add_request(f"r{i}", [0] * 512, SamplingParams(max_tokens=1000, ignore_eos=True))
    for i in range(48):
        dst.engine.add_request(f"d{i}", [0] * 1024, SamplingParams(max_tokens=1000, ignore_eos=True))
    steps: list[tuple[float, list[str]]] = []
    schedule = dst.engine.schedule

    def logged():  # type: ignore[no-untyped-def]
        batch = schedule()
        steps.append((clock.now(), [e.request_id for e in batch.scheduled]))
        return batch

    dst.engine.schedule = logged  # type: ignore[method-assign]
    loop.on(EventKind.STEP_END, lambda ev: ev.target.finish_step(clock.now())[1])
    loop.on(EventKind.MIGRATION_STAGE, lambda ev: ev.target.on_stage_done(clock.now()))
    loop.push_all(src.wake(0.0) + dst.wake(0.0))
    loop.run(max_events=8)
    reports = []
    run = MigrationRun(src, dst, "r0", MigrationConfig(max_stages=3), model.migration, clock.now(),
                       on_done=lambda r, now: r.on_report(reports.append) or [])
    loop.push_all(run.start(clock.now()))
    loop.run(stop=lambda: bool(reports))
    rep = reports[0]
    assert rep.committed
    first = next(t for t, ids in steps if "r0" in ids)
    assert rep.downtime == pytest.approx(first - rep.marks["paused"])
    assert first > rep.end_time  # the destination was mid-step at the commit
