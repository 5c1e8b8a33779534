"""The pure parts of lite mode, on literal inputs: the books (LRS) as a status, metric
pages of each engine kind, the health state machine, traffic splitting, the config."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from llumnix.config.fields import SystemConfigError
from llumnix.lite.config import from_doc
from llumnix.lite.health import EndpointHealth, HealthOptions
from llumnix.lite.lrs import BLOCK_SIZE, EngineLoad, LocalState
from llumnix.lite.routing import route
from llumnix.lite.scrape import detect_kind, parse_metrics
from llumnix.policy import FreenessConfig, freeness


def test_books_split_running_and_queued_by_max_num_seqs_and_count_generated_tokens():
    lrs = LocalState("e", capacity_tokens=64 * BLOCK_SIZE, max_num_seqs=2)
    for i, n in enumerate((20, 40, 50)):
        lrs.on_dispatch(f"r{i}", n, 0, now=float(i))
    lrs.on_tokens("r0", 13)  # 33 tokens: 3 blocks
    s = lrs.status(now=5.0)
    assert [b.request_id for b in s.running] == ["r0", "r1"] and [b.request_id for b in s.waiting] == ["r2"]
    assert s.num_used_blocks == 3 + 3 and s.num_total_blocks == 64
    assert s.waiting[0].num_blocks == 0 and s.waiting[0].num_tokens == 50
    lrs.on_finish("r0")
    s = lrs.status(now=6.0)
    assert [b.request_id for b in s.running] == ["r1", "r2"] and not s.waiting
    assert lrs.num_finished == 1 and lrs.num_in_flight == 2


def test_a_fresh_scrape_adds_load_the_books_do_not_hold_and_a_stale_one_does_not():
    lrs = LocalState("e", capacity_tokens=100 * BLOCK_SIZE, max_num_seqs=8, max_scrape_age_s=2.0)
    lrs.on_dispatch("mine", 16, 0, now=0.0)
    lrs.on_scrape(EngineLoad(timestamp=10.0, num_running=3, num_waiting=0, kv_usage=0.41))
    s = lrs.status(now=11.0)
    assert s.num_running == 3 and s.num_used_blocks == 41  # two foreign requests, the engine's KV usage
    assert sum(b.num_blocks for b in s.running) == 1 + 2 * 20
    idle = LocalState("f", capacity_tokens=100 * BLOCK_SIZE)
    assert freeness(s, FreenessConfig()) < freeness(idle.status(11.0), FreenessConfig())
    assert lrs.status(now=13.0).num_running == 1  # 3 s old: the books alone


@pytest.mark.parametrize(("kind", "page", "want"), [
    ("vllm", 'vllm:num_requests_running{model_name="m"} 4\nvllm:num_requests_waiting{model_name="m"} 2\n'
             'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
             'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1\n', (4, 2, 0.25, 16000)),
    ("sglang", "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n"
               "sglang:max_total_num_tokens 2048\n", (3, 1, 0.5, 2048)),
    ("llamacpp", "llamacpp:requests_processing 1\nllamacpp:requests_deferred 5\n"
                 "llamacpp:kv_cache_usage_ratio 0.75\n", (1, 5, 0.75, None)),
    ("llumnix", 'vllm:num_requests_running{engine="i0",model_name="m"} 2\n'
                'vllm:num_requests_running{engine="i1",model_name="m"} 1\n'
                'vllm:kv_cache_usage_perc{engine="i0",model_name="m"} 0.2\n'
                'vllm:kv_cache_usage_perc{engine="i1",model_name="m"} 0.4\n'
                'llumnix:gateway_requests_in_flight{model_name="m"} 3\n', (3, None, 0.3, None)),
])
def test_each_engines_metrics_page_reads_as_its_load(kind, page, want):
    assert detect_kind(page) == kind
    load = parse_metrics(kind, page, now=1.0)
    got = (load.num_running, load.num_waiting, load.kv_usage, load.capacity_tokens)
    assert got[:2] == want[:2] and got[3] == want[3] and got[2] == pytest.approx(want[2])


def test_an_unknown_page_is_plain_openai_with_no_load():
    assert detect_kind("process_cpu_seconds_total 3\n") == "openai"
    assert parse_metrics("openai", "x 1\n", 1.0) == EngineLoad(1.0)


def test_health_ejects_after_failures_in_a_row_and_backs_off_doubling():
    h = EndpointHealth(HealthOptions(eject_after=2, backoff_s=1.0, max_backoff_s=3.0))
    assert not h.on_failure(0.0, "500")
    h.on_success(0.1)  # the count is of failures in a row
    assert not h.on_failure(0.2, "500") and h.on_failure(0.3, "timeout")
    assert not h.can_serve() and h.ejected_until == pytest.approx(1.3)
    assert not h.on_probe(True, 1.0)  # still backing off
    assert h.on_probe(True, 1.4) and h.can_serve()
    assert h.on_failure(1.5, "refused", fatal=True)  # a refused connection ejects at once
    assert h.ejected_until == pytest.approx(3.5)  # the backoff doubled
    h.on_probe(False, 3.4, "down")  # a failing probe pushes re-admission out
    assert not h.on_probe(True, 3.6) and h.on_probe(True, 5.5)
    assert h.num_ejections == 2


def test_answering_probes_do_not_clear_requests_that_keep_failing():
    """An engine whose /v1/models answers but whose completions are garbage: each probe
    between two failed requests answers, and the requests still eject it."""
    h = EndpointHealth(HealthOptions(eject_after=2, backoff_s=1.0))
    assert not h.on_failure(0.0, "token id outside the vocabulary")
    h.on_probe(True, 0.5)
    assert h.num_failures_in_row == 1 and h.on_failure(1.0, "token id outside the vocabulary")
    assert not h.can_serve() and h.num_ejections == 1
    assert h.on_probe(True, 2.1) and h.num_failures_in_row == 0  # re-admitted: a fresh start
    g = EndpointHealth(HealthOptions(eject_after=2))
    assert not g.on_probe(False, 0.0, "down") and g.num_probe_failures_in_row == 1
    g.on_success(0.1)  # a request that succeeds does not clear failing probes either
    assert not g.on_probe(False, 0.2, "down") and not g.can_serve()
    g2 = EndpointHealth(HealthOptions(eject_after=2))
    g2.on_probe(False, 0.0, "down")
    g2.on_probe(True, 0.1)
    assert not g2.on_failure(0.2, "500") and g2.can_serve()  # one of each is not two in a row


class _P:
    def __init__(self, name, models=(), weight=1.0, fallback=None, healthy=True):
        from llumnix.lite.config import EndpointConfig, PoolConfig

        self.name, self.healthy = name, healthy
        self.cfg = PoolConfig(name, (EndpointConfig("http://h:1"),), tuple(models), weight, fallback)

    def has_healthy(self):
        return self.healthy


def test_routing_splits_by_weight_matches_prefixes_and_falls_back():
    a, b = _P("a", ["llama*"], 3.0, fallback="c"), _P("b", ["llama-8b"], 1.0)
    c, other = _P("c", ["none"], 0.0), _P("d", ["qwen"])
    rng = random.Random(0)
    firsts = Counter(route([a, b, c, other], "llama-8b", rng)[0].name for _ in range(4000))
    assert 2800 < firsts["a"] < 3200 and firsts["a"] + firsts["b"] == 4000
    assert [p.name for p in route([a, b, c, other], "llama-70b", rng)] == ["a", "c"]
    assert route([a, b, c, other], "mistral", rng) == []
    a.healthy = False
    assert [p.name for p in route([a, b, c, other], "llama-8b", rng)] == ["b", "a", "c"]


def test_config_errors_name_their_path():
    with pytest.raises(SystemConfigError, match=r"pools\[0\]\.endpoints\[0\]\.url: must be http"):
        from_doc([{"name": "a", "endpoints": ["localhost:8000"]}])
    with pytest.raises(SystemConfigError, match=r"pools\[1\]\.fallback: must name another pool"):
        from_doc([{"name": "a", "endpoints": ["http://h:1"]},
                  {"name": "b", "endpoints": ["http://h:2"], "fallback": "zz"}])
    with pytest.raises(SystemConfigError, match=r"lite\.max_attempt: unknown key"):
        from_doc([{"name": "a", "endpoints": ["http://h:1"]}], {"max_attempt": 2})
    with pytest.raises(SystemConfigError, match=r"max_line_bytes: must be >= 65536"):
        from_doc([{"name": "a", "endpoints": ["http://h:1"]}], {"max_line_bytes": 1000})
    assert from_doc([{"name": "a", "endpoints": ["http://h:1"]}], {"max_line_bytes": 1 << 20}).max_line_bytes == 1 << 20
    cfg = from_doc([{"name": "a", "models": "m*", "endpoints": [{"url": "http://h:1/v1/", "capacity_tokens": 4096}]}])
    assert cfg.pools[0].endpoints[0].url == "http://h:1" and cfg.pools[0].serves("m-7b")


def test_a_probe_that_connected_but_timed_out_counts_for_nothing_and_a_refused_one_ejects():
    """Measured: llama-cpp-python's servers answered probes late while they generated
    (for us or for others), and counting that ejected every endpoint 5-8 times in minutes."""
    import asyncio

    import httpx

    from llumnix.lite.config import from_urls
    from llumnix.lite.endpoint import Endpoint

    lite = from_urls(["http://e:1"], "m", eject_after=1)
    ep = Endpoint(lite.pools[0].endpoints[0], "default", lite)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def probe(handler) -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await ep.probe(client)

    assert not asyncio.run(probe(slow)) and ep.can_serve() and ep.health.num_failures_in_row == 0
    assert not asyncio.run(probe(refused)) and not ep.can_serve()


def test_an_ejection_by_a_failed_probe_is_logged_once_with_its_endpoint_and_reason(caplog):
    import asyncio
    import logging

    import httpx

    from llumnix.lite.config import from_urls
    from llumnix.lite.endpoint import Endpoint

    lite = from_urls(["http://e:1"], "m", eject_after=2)
    ep = Endpoint(lite.pools[0].endpoints[0], "default", lite)

    def error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    async def probe() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(error)) as client:
            return await ep.probe(client)

    with caplog.at_level(logging.WARNING, logger="llumnix.lite.endpoint"):
        asyncio.run(probe())  # one failure in a row: not ejected yet
        assert ep.can_serve() and not caplog.records
        asyncio.run(probe())
        asyncio.run(probe())  # already ejected: nothing more to say
    assert not ep.can_serve()
    assert [r.getMessage() for r in caplog.records] == ["lite: endpoint e:1 ejected: probe: HTTP 503"]
