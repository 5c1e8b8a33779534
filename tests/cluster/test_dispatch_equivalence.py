"""Dispatch moved from LlumSched's actor to the gateway (issue 30): on one recorded
trace of statuses and requests, the gateway's call sites (statuses from its request
channels, ``_dispatch_here``) decide exactly what LlumSched's did (statuses off its feed,
``submit``'s dispatch), with and without prefix affinity, through a burst between
reports, a drained instance and an unschedulable one. No Ray: the actor's class is
driven directly, the gateway over fake channels."""
from __future__ import annotations

import dataclasses
import random
import time

import pytest

from llumnix.cluster.gateway_client import ClusterBackend
from llumnix.cluster.llumsched import LlumSchedActor
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.core.wire import GenerateRequest
from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig

IDS = [f"instance-{i}" for i in range(4)]
BLOCK = 16


def _status(rng: random.Random, iid: str, now: float, **fields: object) -> InstanceStatus:
    running = tuple(RequestBrief(f"{iid}-r{k}", 0, rng.randint(1, 20), rng.randint(8, 300), now - 1, is_running=True)
                    for k in range(rng.randint(0, 6)))
    waiting = tuple(RequestBrief(f"{iid}-w{k}", 0, rng.randint(1, 20), rng.randint(8, 300), now - 0.5, is_running=False)
                    for k in range(rng.randint(0, 3)))
    used = sum(b.num_blocks for b in running)
    return dataclasses.replace(InstanceStatus(iid, now, 256, max(0, 256 - used), BLOCK, 16, 8),
                               running=running, waiting=waiting, **fields)


def _trace(seed: int) -> list[tuple[str, object]]:
    """Statuses and requests in arrival order: bursts of several requests between two
    reports, prompts that share prefixes, one instance drained, one unschedulable."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(250) for _ in range(rng.choice((16, 48, 80)))] for _ in range(5)]
    now, events = 1000.0, []
    for iid in IDS:
        events.append(("status", _status(rng, iid, now)))
    for k in range(300):
        now += 0.01
        if rng.random() < 0.3:
            iid = rng.choice(IDS)
            extra = {"is_terminating": True} if iid == "instance-3" and k > 150 else {}
            if iid == "instance-2" and 200 < k < 240:
                extra["is_schedulable"] = False
            events.append(("status", _status(rng, iid, now, **extra)))
        else:
            prompt = rng.choice(prefixes) + [rng.randrange(250) for _ in range(rng.randint(1, 40))]
            events.append(("request", (f"req-{k}", prompt, rng.choice((0, 0, 0, 1)), now)))
    return events


class _Link:
    def __init__(self, iid: str) -> None:
        self.instance_id, self.is_open, self.sent = iid, True, []

    def add(self, request: GenerateRequest) -> None:
        self.sent.append(request.request_id)


def _decisions(trace: list[tuple[str, object]], scheduling: dict, monkeypatch: pytest.MonkeyPatch
               ) -> tuple[list[str | None], list[str | None]]:
    clock = {"now": 0.0}
    monkeypatch.setattr(time, "time", lambda: clock["now"])
    # dispatch only: a triggered rescheduling pass would call migrate_out on the fake handles
    scheduling = {**scheduling, "rescheduling": {"enabled": False}}
    sched = LlumSchedActor.__ray_actor_class__(SchedulingConfig.from_dict(scheduling), None,
                                               reschedule_interval_s=3600)
    backend = ClusterBackend(None, {iid: object() for iid in IDS},
                             {"model": "m", "max_model_len": 512, "vocab_size": 256, "num_blocks": 256,
                              "watermark": 0.0, "block_size": BLOCK}, tokenizer=None)  # type: ignore[arg-type]
    backend.gs = GlobalScheduler(SchedulingConfig.from_dict(scheduling), cluster=backend.cluster)
    backend.links = {iid: _Link(iid) for iid in IDS}  # channels, without sockets
    theirs: list[str | None] = []
    ours: list[str | None] = []
    for kind, item in trace:
        if kind == "status":
            assert isinstance(item, InstanceStatus)
            clock["now"] = item.timestamp
            if item.instance_id not in sched.gs.statuses:
                sched.register(item, handle=object())
            else:
                sched._on_fed_statuses(item.instance_id, [item])  # noqa: SLF001 - the feed's road
            backend.on_statuses(item.instance_id, [item])
        else:
            rid, prompt, priority, now = item  # type: ignore[misc]
            clock["now"] = now
            theirs.append(sched.dispatch(DispatchRequest(rid, len(prompt), priority, now, prompt)))
            ours.append(backend._dispatch_here(GenerateRequest(  # noqa: SLF001
                rid, prompt, SamplingParams(max_tokens=4), priority, now)))
    return theirs, ours


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scheduling", [
    {"dispatch": {"policy": "llumnix", "pending_grace_s": 1.0}},
    {"dispatch": {"policy": "llumnix", "params": {"prefix": True}, "pending_grace_s": 1.0}},
    {"dispatch": {"policy": "infaas++"}},
], ids=["llumnix", "llumnix+prefix", "infaas++"])
def test_the_gateway_dispatches_as_llumsched_did(seed, scheduling, monkeypatch):
    theirs, ours = _decisions(_trace(seed), scheduling, monkeypatch)
    assert len(theirs) > 150 and None not in theirs
    assert len(set(theirs)) >= 3  # the trace exercises the choice, not one instance
    assert ours == theirs
