"""The slo predictor's samples on the cluster's road (issue 47): a real InstanceServer
records each step (its shape, the seconds it held the engine) on the statuses it
pushes; the gateway's ClusterBackend (every status, or a reader that skipped some and
got them merged) and the simulator's PolicyBridge fit the same per-instance model."""
from __future__ import annotations

import time

import pytest

from llumnix.cluster.gateway_client import ClusterBackend
from llumnix.cluster.instance import InstanceServer
from llumnix.core.clock import VirtualClock, WallClock
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import InstanceStatus
from llumnix.policy import GlobalScheduler, Llumlet, SchedulingConfig
from llumnix.sim.policy_bridge import PolicyBridge
from tests.engine.helpers import make_engine

SLO = SchedulingConfig.from_dict({"dispatch": {"policy": "slo"}})


def _served(records_steps: bool = True) -> tuple[InstanceServer, int]:
    """A server that ran a few requests to the end, stopped: (server, steps it ran)."""
    eng = make_engine(num_blocks=256, max_num_seqs=4)
    eng.clock = WallClock()
    real = eng.executor.execute

    def paced(batch):  # steps long enough to be told apart from the loop's own cost
        time.sleep(0.004 + 0.0005 * batch.num_entries)
        return real(batch)

    eng.executor.execute = paced
    ll = Llumlet("i0", eng, SLO.rescheduling, SLO.freeness, records_steps=records_steps)
    srv = InstanceServer(eng, ll, status_interval_s=0.01)
    srv.start()
    try:
        for i in range(6):
            srv.call(lambda i=i: eng.add_request(f"r{i}", list(range(5 + 3 * i)), SamplingParams(max_tokens=8)))
        deadline = time.time() + 20
        while time.time() < deadline and srv.call(lambda: eng.has_unfinished_requests()):
            time.sleep(0.02)
        time.sleep(0.05)  # the last steps' status
        srv.call(lambda: None)
    finally:
        srv.stop()
    return srv, eng.step_id


def _backend() -> ClusterBackend:
    info = {"model": "m", "max_model_len": 1024, "vocab_size": 1000, "num_blocks": 256, "watermark": 0.0,
            "block_size": 4}
    backend = ClusterBackend(None, {"i0": object()}, info, None)  # type: ignore[arg-type]
    backend.gs = GlobalScheduler(SLO, cluster=backend.cluster)
    return backend


def test_every_step_rides_on_a_status_with_the_time_it_held_the_engine() -> None:
    srv, num_steps = _served()
    statuses = [st for _, st in srv.statuses]
    samples = [x for st in statuses for x in st.step_samples]
    assert num_steps > 10 and len(samples) == num_steps  # none lost, none twice
    assert sum(x.num_prefill_tokens for x in samples) == sum(5 + 3 * i for i in range(6))
    assert sum(x.num_decode_seqs for x in samples) == 6 * 7  # 8 tokens: the first from the prefill
    steps = [end - start for start, end, *_ in srv.step_log]
    held = [x.seconds for x in samples]
    # each sample spans its step and the boundary before it: at least the step itself
    assert all(h >= s - 1e-6 for h, s in zip(held, steps, strict=True))
    assert sum(held) <= srv.step_log[-1][1] - srv.step_log[0][0] + 1e-6
    assert min(held) >= 0.004


def test_no_samples_without_the_slo_policy() -> None:
    srv, _ = _served(records_steps=False)
    assert all(st.step_samples == () for _, st in srv.statuses)


def _coef(gs: GlobalScheduler) -> list[float]:
    assert gs.slo is not None
    return gs.slo.model("i0").coef


def test_gateway_skipping_reader_and_simulator_fit_the_same_model() -> None:
    srv, num_steps = _served()
    numbered = list(srv.statuses)
    assert len(numbered) > 3
    first_seq, first = numbered[0]
    every = _backend()
    every.on_statuses("i0", [st for _, st in numbered])

    skipping = _backend()  # read the first status, then only the newest (the rest merged into it)
    skipping.on_statuses("i0", [first])
    seq, merged = srv.newest_status(first_seq)
    assert seq == numbered[-1][0] and isinstance(merged, InstanceStatus)
    assert merged.step_samples == tuple(x for _, st in numbered[1:] for x in st.step_samples)
    skipping.on_statuses("i0", [merged])

    bridge = PolicyBridge(SLO, clock=VirtualClock())
    for _, st in numbered:
        bridge.deliver(st)

    fitted = num_steps - len(first.step_samples)  # the first status adds the instance
    assert every.gs is not None and every.gs.slo is not None
    assert every.gs.slo.model("i0").num_observed == fitted > 0
    assert _coef(every.gs) == _coef(bridge.gs)
    assert skipping.gs is not None
    assert _coef(skipping.gs) == pytest.approx(_coef(every.gs), rel=1e-9)
    assert _coef(every.gs) != every.gs.slo.steps.coef  # it moved off the seed


def test_the_step_error_reaches_metrics() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from llumnix.gateway.cluster_metrics import ClusterCollector

    srv, num_steps = _served()
    backend = _backend()
    backend.on_statuses("i0", [st for _, st in srv.statuses])
    info: dict = {"instances": []}
    backend._add_dispatch_info(info)
    pred = info["slo_predictor"]
    fitted = num_steps - len(srv.statuses[0][1].step_samples)
    assert pred["num_steps_fitted"] == fitted and 0.0 <= pred["p50"] <= pred["p90"]
    collector = ClusterCollector("m")
    collector.update(info)
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert f'llumnix:slo_predictor_steps_total{{model_name="m"}} {float(fitted)}' in text
    assert f'llumnix:slo_predictor_step_error{{model_name="m",quantile="0.9"}} {pred["p90"]}' in text


def test_the_gateway_dispatches_on_one_clock() -> None:
    """The gateway stamps arrivals with the monotonic clock and dispatches at wall time: the
    predicted TTFT logged counts from the arrival on the dispatch's clock (it was off by the
    clocks' difference, ~1.7e9 s)."""
    import dataclasses as dc

    from llumnix.core.wire import GenerateRequest
    from tests.policy.snapshots import inst

    class Link:
        instance_id, is_open = "i0", True

        def add(self, request) -> None:
            self.sent = request

    backend = _backend()
    backend.links = {"i0": Link()}  # type: ignore[dict-item]
    backend.on_statuses("i0", [dc.replace(inst("i0"), timestamp=time.time())])
    req = GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=4), 0, time.monotonic() - 0.5)
    assert backend._dispatch_here(req) == "i0"
    assert backend.gs is not None and backend.gs.slo is not None
    arrival, predicted = backend.gs.slo.ttft_log["r1"]
    assert abs(arrival - (time.time() - 0.5)) < 0.2
    assert 0.5 <= predicted < 5.0


def test_llumscheds_dispatch_takes_the_arrival_on_the_wall_clock() -> None:
    """Where LlumSched dispatches for a gateway (``submit``, and the failover's choice) the
    gateway sends the arrival turned to the wall clock: its own stamp is on its monotonic
    clock, which means nothing to LlumSched's process."""
    from llumnix.cluster.llumsched import LlumSchedActor
    from llumnix.core.wire import GenerateRequest, wall_arrival

    sched = LlumSchedActor.__ray_actor_class__(None, None, reschedule_interval_s=3600)
    seen: list = []
    sched.dispatch = lambda req: seen.append(req)  # type: ignore[method-assign]
    req = GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=4), 0, time.monotonic() - 0.5)
    assert sched.submit(req, wall_arrival(req)) is None
    assert abs(seen[0].arrival_time - (time.time() - 0.5)) < 0.2
