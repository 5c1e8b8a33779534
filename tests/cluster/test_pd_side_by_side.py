"""HandoffWorker's hand-offs side by side, on a hand-made prefill instance (no engine, no
transport): a request past its first token is not held back by a followed prompt's
hand-off, which lasts as long as the prompt's remaining chunks."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from llumnix.cluster.handoff import FOLLOW_PREFILL, STOP_AND_COPY, HandoffWorker
from llumnix.core.request import RequestStatus


def _req(rid: str, arrival: float, tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, status=RequestStatus.RUNNING, output_token_ids=tokens,
                           arrival_time=arrival)


class _Instance:
    """What the worker reads of a prefill instance: a long prompt in its chunks, then a
    short request that has its first token."""

    def __init__(self) -> None:
        self.long, self.short = _req("long", 1.0, []), _req("short", 2.0, [])
        reqs = {"long": self.long, "short": self.short}
        self.engine = SimpleNamespace(requests=reqs, scheduler=SimpleNamespace(waiting=[], running=list(reqs.values())),
                                      kv=SimpleNamespace(num_blocks_of=lambda rid: 4))
        self.llumlet = SimpleNamespace(migrating_out=set())


def _until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


@pytest.mark.parametrize("max_in_flight", [8, 1])
def test_a_request_past_its_first_token_moves_while_a_followed_prompt_is_in_flight(max_in_flight):
    inst = _Instance()
    inst.short.status = RequestStatus.WAITING  # not admitted yet: only the long prompt is a candidate
    release = threading.Event()
    started: dict[str, dict | None] = {}
    reports: list[dict] = []

    def migrate(rid, dst_id, dst, overrides):
        started[rid] = overrides
        if rid == "long":  # following the prompt: until its last chunk
            assert release.wait(10)
        inst.engine.requests.pop(rid)
        return {"committed": True}

    w = HandoffWorker(inst, lambda rid, n: ("decode-0", None), migrate, reports.append, max_in_flight=max_in_flight)
    w.set_role("prefill")
    w.start()
    try:
        assert _until(lambda: "long" in started)
        assert started["long"] == FOLLOW_PREFILL
        inst.short.status, inst.short.output_token_ids = RequestStatus.RUNNING, [7]
        w.on_step([SimpleNamespace(num_output_tokens=1, new_token_ids=[7], is_finished=False)], False)
        if max_in_flight > 1:
            assert _until(lambda: "short" in started)
            assert started["short"] == STOP_AND_COPY  # the long prompt's chunks still wait here
            assert w.num_in_flight == 1 and [r["request_id"] for r in reports] == ["short"]
        else:  # one at a time: it waits behind the followed prompt, decoding beside its chunks
            time.sleep(0.3)
            assert "short" not in started and not reports
        release.set()
        assert _until(lambda: len(reports) == 2)
    finally:
        release.set()
        w.stop()
    assert sorted(r["request_id"] for r in reports) == ["long", "short"]
    assert all(r["committed"] and r["dst_instance_id"] == "decode-0" for r in reports)
    assert w.num_in_flight == 0


def test_stop_waits_for_every_hand_off_in_flight():
    inst = _Instance()
    inst.short.output_token_ids = [7]
    gate = threading.Event()
    reports: list[dict] = []

    def migrate(rid, dst_id, dst, overrides):
        assert gate.wait(10)
        return {"committed": False, "abort_reason": "refused"}

    w = HandoffWorker(inst, lambda rid, n: ("decode-0", None), migrate, reports.append)
    w.set_role("prefill")
    w.start()
    assert _until(lambda: w.num_in_flight == 2)
    threading.Timer(0.2, gate.set).start()
    w.stop()
    assert sorted(r["request_id"] for r in reports) == ["long", "short"] and w.num_in_flight == 0
