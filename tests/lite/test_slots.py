"""Engines that run a known number of requests at once (llama.cpp's server: one slot per
``--parallel``): an endpoint with every slot taken sits a dispatch out while another has
a free one (``lite/pool.py``), and the slots are learnt from llama.cpp's ``/props``."""
from __future__ import annotations

import asyncio

import httpx

from llumnix.config.fields import build
from llumnix.lite.config import EndpointConfig, LiteConfig, PoolConfig
from llumnix.lite.endpoint import Endpoint
from llumnix.lite.pool import Pool

PREFIX = [7] * 96  # six blocks: well past the affinity's 64-token minimum


def _pool(max_num_seqs: int, slack: int = 4) -> Pool:
    eps = tuple(build(EndpointConfig, {"url": f"http://e{i}:1", "max_num_seqs": max_num_seqs}, "")
                for i in range(3))
    lite = LiteConfig(pools=(PoolConfig("p", eps),),
                      dispatch_params={"queued": "all", "prefix": True, "prefix_slack": slack})
    return Pool(lite.pools[0], lite)


def _turns(pool: Pool, n: int) -> list[str]:
    """``n`` turns of one chat, each sent while the earlier ones still run."""
    picked = []
    for i in range(n):
        ep = pool.dispatch(f"r{i}", PREFIX + list(range(100 + 8 * i)), 0, set())
        assert ep is not None
        picked.append(ep.endpoint_id)
    return picked


def test_a_busy_single_slot_endpoint_sits_out_while_another_is_idle():
    # Unknown concurrency: the prefix keeps every turn on one endpoint (within the slack).
    assert len(set(_turns(_pool(0), 3))) == 1
    # One slot each: the second and third turns go to the idle endpoints; once every slot
    # is taken, the policy's own rule (prefix within the slack) decides again.
    turns = _turns(_pool(1), 4)
    assert len(set(turns[:3])) == 3 and turns[3] == turns[0]


def test_the_rule_frees_an_endpoint_again_when_its_request_finishes_and_skips_ejected_ones():
    pool = _pool(1)
    first = pool.dispatch("a", PREFIX + [1], 0, set())
    assert first is not None
    first.lrs.on_finish("a")
    again = pool.dispatch("b", PREFIX + [1, 2], 0, set())
    assert again is first  # free again: its prefix wins
    others = [ep for ep in pool.endpoints.values() if ep is not first]
    for ep in others:  # nowhere else to start it: the busy one takes it (queued)
        ep.health.on_failure(0.0, "down", fatal=True)
        pool.changed.add(ep.endpoint_id)
    assert pool.dispatch("c", PREFIX + [1, 2, 3], 0, set()) is first


def _endpoint(handler) -> tuple[Endpoint, list[str]]:
    cfg = build(EndpointConfig, {"url": "http://e:1"}, "")
    lite = LiteConfig(pools=(PoolConfig("p", (cfg,)),))
    ep = Endpoint(cfg, "p", lite)
    asked: list[str] = []

    def wrapped(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return handler(request)

    async def probes() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(wrapped)) as client:
            await ep.probe(client)
            await ep.probe(client)

    asyncio.run(probes())
    return ep, asked


def test_slots_are_learnt_from_llamacpps_props_once_and_other_engines_are_asked_once():
    ep, asked = _endpoint(lambda r: httpx.Response(200, json={"total_slots": 1, "model_path": "x.gguf"}))
    assert ep.lrs.known_max_num_seqs == 1 and ep.lrs.max_num_seqs == 1 and asked.count("/props") == 1
    ep, asked = _endpoint(lambda r: httpx.Response(404))
    assert ep.lrs.known_max_num_seqs == 0 and ep.lrs.max_num_seqs == 256 and asked.count("/props") == 1
    ep, _ = _endpoint(lambda r: httpx.Response(200, text="not json"))
    assert ep.lrs.known_max_num_seqs == 0


def test_llama_cpp_pythons_server_is_known_to_run_one_request_at_a_time():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":  # what llama-cpp-python 0.3's FastAPI app serves
            return httpx.Response(200, json={"openapi": "3.1.0", "info": {"title": "🦙 llama.cpp Python API"}})
        return httpx.Response(404)

    ep, asked = _endpoint(answer)
    assert ep.lrs.known_max_num_seqs == 1 and asked.count("/openapi.json") == 1
    ep, _ = _endpoint(lambda r: httpx.Response(200, json={"info": {"title": "vLLM"}}) if r.url.path ==
                      "/openapi.json" else httpx.Response(404))
    assert ep.lrs.known_max_num_seqs == 0
