"""The gateway's fair share (``--fair-share``) over a real engine: a client's backlog
waits in the gateway, and another client's request goes ahead of it."""
from __future__ import annotations

import asyncio
import threading
import time

from fastapi.testclient import TestClient

from llumnix.gateway.app import build_app
from tests.gateway.fake_backend import EngineBackend


class Recording(EngineBackend):
    """Records the prompt of each choice as it reaches the backend; a token takes 2 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []
        self.in_flight = self.peak = 0

    async def generate(self, request):
        self.started.append(bytes(request.prompt_token_ids).decode())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        done = False
        try:
            async for out in super().generate(request):
                await asyncio.sleep(0.002)
                if out.is_finished:  # the engine is done with it (the consumer stops reading here)
                    done, self.in_flight = True, self.in_flight - 1
                yield out
        finally:
            if not done:
                self.in_flight -= 1


def body(prompt: str, user: str | None, n: int = 1, max_tokens: int = 16) -> dict:
    b = {"model": "fake", "prompt": prompt, "n": n, "max_tokens": max_tokens}
    if user is not None:
        b["user"] = user
    return b


def hog_then_probe(client: TestClient, backend: Recording, probe_user: str | None) -> dict:
    hog: dict = {}

    def send_hog() -> None:
        hog["r"] = client.post("/v1/completions", json=body("hog", "hog", n=8, max_tokens=30))

    t = threading.Thread(target=send_hog)
    t.start()
    deadline = time.monotonic() + 10
    while len(backend.started) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    probe = client.post("/v1/completions", json=body("probe", probe_user))
    t.join(30)
    assert hog["r"].status_code == 200 and len(hog["r"].json()["choices"]) == 8
    assert probe.status_code == 200 and probe.json()["usage"]["completion_tokens"] == 16
    return {"order": backend.started, "peak": backend.peak}


def test_another_clients_request_goes_ahead_of_a_backlog():
    """Two places; the hog's n=8 takes both and queues six choices; the probe, from another
    client, is the next to reach the engine, not the ninth."""
    backend = Recording()
    with TestClient(build_app(backend, fair_share=2)) as client:
        seen = hog_then_probe(client, backend, probe_user="probe")
    assert seen["order"][:3] == ["hog", "hog", "probe"], seen["order"]
    assert seen["peak"] == 2  # never more than the places
    assert len(seen["order"]) == 9


def test_the_same_client_waits_its_turn():
    """A probe from the hog's own address (no ``user``: keyed by address) is part of that
    backlog: it comes after the choices queued before it."""
    backend = Recording()
    with TestClient(build_app(backend, fair_share=2)) as client:
        client.post("/v1/completions", json=body("warm", "hog"))  # hog's counter is ahead of none
        backend.started.clear()
        seen = hog_then_probe(client, backend, probe_user="hog")
    assert seen["order"].index("probe") == 8, seen["order"]


def test_without_a_fair_share_every_choice_goes_at_once():
    backend = Recording()
    with TestClient(build_app(backend)) as client:
        seen = hog_then_probe(client, backend, probe_user="probe")
    assert seen["order"].index("probe") == 8 and seen["peak"] >= 8


def test_a_waiting_choice_whose_client_leaves_gives_up_its_turn():
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.core.wire import GenerateRequest
    from llumnix.gateway.fair import FairGate
    from llumnix.policy.fair_share import FairConfig

    def gen(rid: str) -> GenerateRequest:
        return GenerateRequest(rid, [1, 2], SamplingParams(max_tokens=4), 0, 0.0)

    async def main() -> list[str]:
        gate = FairGate(FairConfig(max_in_flight=1))
        order: list[str] = []
        release = asyncio.Event()

        async def choice(rid: str, client: str, hold: bool) -> None:
            g = gen(rid)
            gate.tag([g], client)
            async with gate.slot(g) as served:
                order.append(rid)
                served(4)
                if hold:
                    await release.wait()

        first = asyncio.create_task(choice("a0", "a", True))
        await asyncio.sleep(0.01)
        gone = asyncio.create_task(choice("b0", "b", False))
        later = asyncio.create_task(choice("c0", "c", False))
        await asyncio.sleep(0.01)
        gone.cancel()  # b's client hung up while waiting
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(first, later)
        assert gate.share.num_in_flight == 0 and gate.share.num_waiting == 0
        gate.share.check_invariants()
        return order

    assert asyncio.run(main()) == ["a0", "c0"]
