"""Per-client fairness on a real cluster behind a real gateway (HTTP on a socket): a client
with eight n=16 requests of 400 tokens queued cannot hold back another client's 16-token
request behind its whole backlog once the gateway keeps a fair share (``--fair-share``),
where the engine's FCFS queue does. Both gateways serve the same cluster, one after the
other, so the two runs see the same machine."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.cluster.helpers import running_cluster, serve_cluster

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

PLACES = 8
"""The engine's batch (max_num_seqs): the fair share keeps exactly that many choices in flight."""
NUM_HOGS = 8
"""The hog's requests: 128 choices, 16 rounds of the engine's batch."""
HOG = {"prompt": "a b c d", "n": 16, "max_tokens": 400, "ignore_eos": True, "temperature": 0, "user": "hog"}
PROBE = {"prompt": "hello", "max_tokens": 16, "ignore_eos": True, "temperature": 0, "user": "probe"}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    with running_cluster(tiny_model_dir, "fair", instances=1, engine={"max_num_seqs": PLACES}) as c:
        yield c


async def in_flight(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("llumnix:gateway_requests_in_flight"))


async def hog_and_probe(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        t0 = time.monotonic()
        probe_alone = await client.post("/v1/completions", json={"model": model, **PROBE})
        alone_s = time.monotonic() - t0
        assert probe_alone.status_code == 200, probe_alone.text
        t0 = time.monotonic()
        hogs = [asyncio.create_task(client.post("/v1/completions", json={"model": model, **HOG}))
                for _ in range(NUM_HOGS)]
        while await in_flight(client) < 16 * NUM_HOGS:  # every choice of the hog is in: 8 served, the rest queued
            await asyncio.sleep(0.005)
        t1 = time.monotonic()
        probe = await client.post("/v1/completions", json={"model": model, **PROBE})
        probe_s = time.monotonic() - t1
        done = await asyncio.gather(*hogs)
        hog_s = time.monotonic() - t0
    assert probe.status_code == 200 and probe.json()["usage"]["completion_tokens"] == 16, probe.text
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16 * 400 for r in done)
    return {"probe_alone_s": alone_s, "probe_s": probe_s, "hog_s": hog_s}


def test_a_costly_client_cannot_hold_back_another_clients_short_request(cluster, tiny_model_dir):
    with serve_cluster(cluster, tiny_model_dir) as (url, _):
        fcfs = asyncio.run(hog_and_probe(url))
    with serve_cluster(cluster, tiny_model_dir, fair_share=PLACES) as (url, _):
        fair = asyncio.run(hog_and_probe(url))
    print({"fcfs": fcfs, "fair": fair})
    # FCFS: the probe runs after the hog's whole backlog (16 rounds of 400 tokens)
    assert fcfs["probe_s"] > 0.6 * fcfs["hog_s"], fcfs
    # Fair: it waits for one place to free (at most one round of the hog's) and runs: the
    # bound is two rounds of the 16 the hog's backlog takes
    assert fair["probe_s"] < 2 / 16 * fair["hog_s"] + fair["probe_alone_s"], fair
