"""Lite mode end to end: the real gateway over LiteBackend over real HTTP engines (small
fake servers that answer, die, hang, fail or stream garbage)."""
from __future__ import annotations

import json
import threading
import time

import httpx

from tests.lite.conftest import gateway, lite_backend
from tests.lite.fake_engine import expected_text


def _complete(url: str, max_tokens: int = 6, prompt: str = "Hello there", **kw: object) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": "fake-model", "prompt": prompt,
                                                     "max_tokens": max_tokens, **kw}, timeout=20)


def _stream(url: str, max_tokens: int = 6) -> list[object]:
    events: list[object] = []
    with httpx.stream("POST", url + "/v1/completions", timeout=20,
                      json={"model": "fake-model", "prompt": "Hi", "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return events


def test_completion_and_chat_text_and_usage_are_the_engines(engines):
    e = engines()
    with gateway(lite_backend([("p", [e], {})])) as url:
        r = _complete(url, max_tokens=5)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == expected_text(5)
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 5  # the engine's count, not the re-tokenized bytes
        chat = httpx.post(url + "/v1/chat/completions", timeout=20, json={
            "model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).json()
        assert chat["choices"][0]["message"]["content"] == expected_text(3)
    # Text engines get the gateway's prompt as text (the chat with its template applied).
    assert e.prompts[0] == "Hello there"
    assert "<|im_start|>user\nhi<|im_end|>" in e.prompts[1]


def test_stop_strings_are_applied_by_the_gateway_too(engines):
    with gateway(lite_backend([("p", [engines()], {})])) as url:
        r = _complete(url, max_tokens=6, stop=[" gamma"])
        assert r.json()["choices"][0]["text"] == " alpha beta"
        assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_streamed_chunks_concatenate_to_the_engines_text(engines):
    with gateway(lite_backend([("p", [engines(delay_s=0.01)], {})])) as url:
        events = _stream(url, max_tokens=8)
    texts = [c["text"] for ev in events if isinstance(ev, dict) for c in ev.get("choices", [])]
    assert "".join(texts) == expected_text(8)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 8


def test_requests_before_any_byte_are_retried_on_a_healthy_endpoint(engines):
    bad = {mode: engines(mode) for mode in ("error500", "hang", "garbage")}
    dead = engines()
    dead.stop()
    good = engines()
    backend = lite_backend([("p", [*bad.values(), dead, good], {})], dispatch="round-robin", max_attempts=5)
    with gateway(backend) as url:
        for _ in range(4):
            r = _complete(url, max_tokens=3)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected_text(3)
        info = httpx.get(url + "/admin/cluster").json()
        health = httpx.get(url + "/health")
    assert info["gateway"]["num_retries"] >= 1
    states = {i["instance_id"]: i["health"]["state"] for i in info["instances"]}
    assert states["p-3"] == "ejected"  # refused connections eject at once
    assert states["p-4"] == "healthy"
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert good.prompts, "the healthy endpoint served"


def test_every_endpoint_failing_is_one_clear_error(engines):
    with gateway(lite_backend([("p", [engines("error500"), engines("garbage")], {})])) as url:
        r = _complete(url)
    assert r.status_code >= 500
    msg = r.json()["error"]["message"]
    assert "Traceback" not in msg


def test_a_stream_that_breaks_mid_way_resumes_on_another_endpoint_from_its_output(engines):
    e = engines("break_after:3")
    other = engines()
    with gateway(lite_backend([("p", [e, other], {})], dispatch="round-robin")) as url:
        events = _stream(url, max_tokens=8)
        info = httpx.get(url + "/admin/cluster").json()
    texts = "".join(c["text"] for ev in events if isinstance(ev, dict) for c in ev.get("choices", []))
    assert not [ev for ev in events if isinstance(ev, dict) and "error" in ev]
    # The first three words once, then the other engine's five (it starts its own list again).
    assert texts == expected_text(3) + expected_text(5)
    assert other.prompts == ["Hi" + expected_text(3)] and other.bodies[0]["max_tokens"] == 5
    assert events[-2]["usage"]["completion_tokens"] == 8
    assert info["gateway"]["num_resumed"] == 1


def test_without_resume_a_stream_that_breaks_mid_way_ends_with_an_error_event_not_a_repeat(engines):
    e = engines("break_after:3")
    other = engines()
    with gateway(lite_backend([("p", [e, other], {})], dispatch="round-robin", resume=False)) as url:
        events = _stream(url, max_tokens=8)
    texts = "".join(c["text"] for ev in events if isinstance(ev, dict) for c in ev.get("choices", []))
    errors = [ev for ev in events if isinstance(ev, dict) and "error" in ev]
    assert texts == expected_text(3)  # what the engine sent, once, and nothing from elsewhere
    assert len(errors) == 1 and "mid-stream" in errors[0]["error"]["message"]
    assert events[-1] == "[DONE]"
    assert not other.prompts, "a request that already streamed is never sent again"


def test_a_stream_that_hangs_mid_way_with_nowhere_to_resume_ends_with_an_error_event(engines):
    with gateway(lite_backend([("p", [engines("hang_after:2")], {})])) as url:
        events = _stream(url, max_tokens=6)
    texts = "".join(c["text"] for ev in events if isinstance(ev, dict) for c in ev.get("choices", []))
    assert texts == expected_text(2)
    errors = [ev for ev in events if isinstance(ev, dict) and "error" in ev]
    assert len(errors) == 1 and "mid-stream" in errors[0]["error"]["message"]
    assert events[-1] == "[DONE]"


def test_an_ejected_endpoint_comes_back_once_it_answers_probes(engines):
    e = engines()
    port_engine = e
    backend = lite_backend([("p", [e], {})])
    with gateway(backend) as url:
        port_engine.stop()
        assert _complete(url).status_code >= 500
        assert not backend.endpoints["p-0"].can_serve()
        e.start()  # the same port again
        deadline = time.time() + 10
        while not backend.endpoints["p-0"].can_serve() and time.time() < deadline:
            time.sleep(0.05)
        assert backend.endpoints["p-0"].can_serve()
        assert _complete(url).status_code == 200


def test_the_fallback_pool_serves_when_the_primary_has_no_healthy_endpoint(engines):
    primary, backup = engines(), engines()
    backend = lite_backend([("main", [primary], {"fallback": "backup"}),
                            ("backup", [backup], {"weight": 0.0})])
    with gateway(backend) as url:
        assert _complete(url).status_code == 200
        primary.stop()
        for _ in range(3):
            assert _complete(url).status_code == 200
        info = httpx.get(url + "/admin/cluster").json()
    assert len(primary.prompts) == 1 and len(backup.prompts) == 3
    assert info["gateway"]["num_fallbacks"] == 3


def test_concurrent_requests_spread_by_the_books(engines):
    """No metrics and no reports: the LRS alone (requests in flight) spreads a burst."""
    engs = [engines(delay_s=0.2) for _ in range(3)]  # 2 s a request: all six are in flight at once even on a loaded machine
    with gateway(lite_backend([("p", engs, {})], dispatch="least-requests")) as url:
        threads = [threading.Thread(target=_complete, args=(url, 10)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [len(e.prompts) for e in engs] == [2, 2, 2]


def test_prefix_affinity_keeps_a_conversation_on_one_endpoint(engines):
    engs = [engines() for _ in range(3)]
    system = "You are a careful assistant. " * 12  # > 64 tokens of shared prefix
    with gateway(lite_backend([("p", engs, {})])) as url:  # default: llumnix, queued all, prefix
        for turn in range(4):
            assert _complete(url, prompt=system + f"turn {turn}", max_tokens=2).status_code == 200
    assert sorted(len(e.prompts) for e in engs) == [0, 0, 4]


def test_logprobs_are_refused_with_a_400(engines):
    with gateway(lite_backend([("p", [engines()], {})])) as url:
        r = _complete(url, logprobs=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_admin_cluster_and_metrics_show_every_endpoint(engines):
    page = 'vllm:num_requests_running{model_name="m"} 2\nvllm:num_requests_waiting{model_name="m"} 1\n' \
           'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    e = engines(metrics=page)
    backend = lite_backend([("p", [e], {})], kind="auto")
    with gateway(backend) as url:
        time.sleep(0.5)  # a few scrapes
        info = httpx.get(url + "/admin/cluster").json()
        metrics = httpx.get(url + "/metrics").text
    inst = info["instances"][0]
    assert inst["kind"] == "vllm" and inst["lrs"]["scraped"]["num_running"] == 2
    assert inst["lrs"]["scrape_age_s"] < 1.0
    assert inst["num_running"] == 3  # the engine's load beyond our books (none in flight): 2 + 1 foreign
    assert 'llumnix:instance_freeness{instance_id="p-0"' in metrics


def test_a_shared_prefix_does_not_pile_concurrent_requests_onto_one_endpoint(engines):
    """The default slack of one request: a burst sharing a system prompt spreads."""
    engs = [engines(delay_s=0.05) for _ in range(3)]
    system = "You are a careful assistant. " * 12
    with gateway(lite_backend([("p", engs, {})])) as url:
        threads = [threading.Thread(target=_complete, args=(url, 10, system + f"question {i}")) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sum(len(e.prompts) for e in engs) == 6 and max(len(e.prompts) for e in engs) <= 2
