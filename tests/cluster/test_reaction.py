"""Triggered rescheduling on a real 2-instance cluster: an instance becoming a migration
source gets a migration out at once (well before the periodic round, 30 s away here), and
the reaction time is in the gateway's /metrics."""
from __future__ import annotations

import re
import time

import httpx
import ray

from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest
from tests.cluster.helpers import ADMIN, running_cluster, serve_cluster

SCHEDULING = {"rescheduling": {"out_threshold": 10, "in_threshold": 10, "trigger_gap_s": 0.03}}


def _wait_for(url: str, ok, timeout_s: float) -> dict:
    deadline = time.time() + timeout_s
    while True:
        info = httpx.get(f"{url}/admin/cluster", headers=ADMIN, timeout=10).json()
        if ok(info) or time.time() > deadline:
            return info
        time.sleep(0.05)


def test_a_new_source_is_migrated_out_of_within_a_step_and_the_reaction_is_exported(tiny_model_dir):
    with running_cluster(tiny_model_dir, "reaction", instances=2, engine={"num_blocks": 128},
                         scheduling=SCHEDULING, reschedule_interval_s=30.0) as c, \
            serve_cluster(c, tiny_model_dir) as (url, _):
        info = _wait_for(url, lambda i: len(i["status_feed"]["live"]) == 2, 30)
        assert len(info["status_feed"]["live"]) == 2, info["status_feed"]
        passes_before = info["rescheduling"]["num_passes"]
        # 4 requests of 40 prompt tokens on one instance, the other idle: 10 blocks each at
        # first (F = 22); at about 90 tokens each F falls below 10 and it is a source
        src = c.instances["instance-0"]
        ray.get([src.add_request.remote(GenerateRequest(f"r{i}", [1 + i] * 40,
                                                        SamplingParams(max_tokens=300, ignore_eos=True),
                                                        0, time.time(), client="test"))
                 for i in range(4)])
        info = _wait_for(url, lambda i: i["rescheduling"]["reaction"]["count"] >= 1
                         and (i["migrations"]["committed"] + i["migrations"]["aborted"]) >= 1, 60)
        resched = info["rescheduling"]
        assert resched["reaction"]["count"] >= 1, resched
        assert info["migrations"]["committed"] >= 1, info["migrations"]
        assert resched["num_passes"] > passes_before and resched["num_triggers"] >= 1, resched
        assert min(resched["reaction"]["recent_s"]) < 0.25, resched
        text = httpx.get(f"{url}/metrics", timeout=10).text
        m = re.search(r'llumnix:reschedule_reaction_seconds_bucket\{le="0.25",model_name="[^"]*"\} (\S+)', text)
        assert m is not None and float(m.group(1)) >= 1, text[-3000:]
        assert re.search(r"llumnix:reschedule_reaction_seconds_count\{[^}]*\} [1-9]", text)
