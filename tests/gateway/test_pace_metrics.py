"""A paced engine's counts (engine/pace.py) reach ``/metrics`` through its status, so a run
can say whether the emulated device's step times held; an unpaced cluster shows none."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llumnix.cluster.meta_store import status_summary
from llumnix.core.sampling_params import SamplingParams
from llumnix.engine.pace import StepPacer, pace_model
from llumnix.gateway.metrics import GatewayMetrics
from llumnix.policy import FreenessConfig
from tests.engine.helpers import make_engine


def _families(m: GatewayMetrics) -> dict[str, dict[str, float]]:
    text = generate_latest(m.registry).decode()
    return {fam.name: {s.labels.get("engine", ""): s.value for s in fam.samples if s.name.endswith("_total")}
            for fam in text_string_to_metric_families(text)}


def _stepped_status(paced: bool, iid: str):
    engine = make_engine(instance_id=iid)
    now = [0.0]
    if paced:
        def sleep(s: float) -> None:
            now[0] += s

        engine.pacer = StepPacer(pace_model("a10-llama7b-serving", 0.01), clock=lambda: now[0], sleep=sleep)
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    for _ in range(3):
        engine.step()
    return status_summary(engine.get_status(), FreenessConfig(), 0.0)


def test_paced_steps_and_overruns_are_counters_per_instance():
    m = GatewayMetrics("tiny")
    m.observe_cluster({"instances": [_stepped_status(True, "i0"), _stepped_status(False, "i1")]})
    fams = _families(m)
    assert fams["llumnix:paced_steps"] == {"i0": 3.0}  # the unpaced instance has no series
    assert fams["llumnix:pace_overrun_steps"] == {"i0": 0.0}


def test_an_unpaced_cluster_has_no_pace_families():
    m = GatewayMetrics("tiny")
    m.observe_cluster({"instances": [_stepped_status(False, "i0")]})
    text = generate_latest(m.registry).decode()
    assert "vllm:num_preemptions" in text and "pace" not in text
