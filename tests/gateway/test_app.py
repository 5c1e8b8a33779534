from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from llumnix.core.sampling_params import SamplingParams
from llumnix.gateway.app import build_app
from tests.gateway.fake_backend import EngineBackend


def test_completion_non_streaming(client, backend):
    r = client.post("/v1/completions", json={"model": "fake", "prompt": "hello", "max_tokens": 7,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    assert body["id"].startswith("cmpl-")
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert backend.engine.kv.num_free_blocks == backend.engine.kv.num_total_blocks


def test_streaming_chunks_join_to_the_non_streamed_text(client):
    req = {"model": "fake", "prompt": "abc", "max_tokens": 12, "temperature": 0}
    full = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    for include_usage in (False, True):
        body = {**req, "stream": True, "stream_options": {"include_usage": include_usage}}
        with client.stream("POST", "/v1/completions", json=body) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert text == full
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        # OpenAI's rule: a usage chunk (no choices) only when asked for
        assert [c for c in chunks if not c["choices"]] == (chunks[-1:] if include_usage else [])
        assert chunks[-1].get("usage", {}).get("completion_tokens") == (12 if include_usage else None)


def test_chat_completion(client):
    r = client.post("/v1/chat/completions", json={
        "model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert r.json()["object"] == "chat.completion" and r.json()["id"].startswith("chatcmpl-")  # OpenAI's ids


@pytest.mark.parametrize("payload,status,param", [
    ({"model": "fake", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "fake", "prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ({"model": "fake", "prompt": "x", "min_tokens": -1}, 400, "min_tokens"),
    ({"model": "fake", "prompt": "x", "temperature": 5}, 400, "temperature"),
    ({"model": "fake", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": "fake", "prompt": "x", "n": 0}, 400, "n"),
    ({"model": "fake", "prompt": "x", "n": 17}, 400, "n"),
    ({"model": "fake", "prompt": 7}, 400, "prompt"),
    ({"model": "fake"}, 400, "prompt"),
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": "fake", "prompt": "x" * 300}, 400, "prompt"),
    ({"model": "fake", "prompt": [1, 2, 999]}, 400, "prompt"),
    ({"model": "fake", "prompt": ""}, 400, "prompt"),
    ({"model": "fake", "prompt": []}, 400, "prompt"),
    ({"model": "fake", "prompt": ["a", "b"]}, 400, "prompt"),    # a batch of prompts
    ({"model": "fake", "prompt": [1.5, 2]}, 400, "prompt"),
    ({"model": "fake", "prompt": {"text": "x"}}, 400, "prompt"),
])
def test_bad_input_gets_an_openai_error_body(client, backend, payload, status, param):
    r = client.post("/v1/completions", json=payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["param"] == param
    assert not backend.engine.requests  # nothing reached the engine


def test_malformed_json_is_a_400(client):
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    # the body as a whole is at fault: no parameter named, and the parser's reason given
    assert err["param"] is None and err["type"] == "invalid_request_error"
    assert err["message"].startswith("request body is not valid JSON")


def test_api_key_is_required_when_set(backend):
    c = TestClient(build_app(backend, api_key="s3cret"))
    req = {"model": "fake", "prompt": "x", "max_tokens": 1}
    assert c.post("/v1/completions", json=req).status_code == 401
    ok = c.post("/v1/completions", json=req, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert c.get("/health").status_code == 200  # health stays open for probes


def test_health_is_503_while_no_instance_can_serve(backend):
    c = TestClient(build_app(backend))
    assert c.get("/health").status_code == 200 and c.get("/health").json()["status"] == "ok"

    async def down():
        return {"status": "unavailable", "instances": {"instance-0": False}}

    backend.health = down  # every instance failed its health call
    r = c.get("/health")
    assert r.status_code == 503 and r.json() == {"status": "unavailable", "instances": {"instance-0": False}}


def test_admin_needs_a_key_off_loopback(backend):
    c = TestClient(build_app(backend, admin_requires_key=True))
    assert c.get("/admin/cluster").status_code == 403


def test_priority_header_and_field(client, backend):
    seen = []
    orig = backend.engine.add_request

    def spy(*a, **kw):
        seen.append(kw.get("priority"))
        return orig(*a, **kw)

    backend.engine.add_request = spy
    client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 1,
                                         "priority": "high"})
    client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 1},
                headers={"X-Llumnix-Priority": "high"})
    client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 1,
                                         "priority": 0})
    assert seen == [1, 1, 0]


def test_metrics_endpoint_counts_requests(client):
    client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 2})
    text = client.get("/metrics").text
    assert 'vllm:request_success_total{finished_reason="length",model_name="fake"} 1.0' in text
    assert "vllm:time_to_first_token_seconds_bucket" in text


def test_a_batch_of_one_prompt_is_that_prompt(client):
    """OpenAI clients may send ``prompt: ["..."]`` (the batch form) or ``[[ids]]``."""
    req = {"model": "fake", "max_tokens": 4, "temperature": 0}
    want = client.post("/v1/completions", json={**req, "prompt": "abc"}).json()["choices"][0]["text"]
    for prompt in (["abc"], [[97, 98, 99]], [97, 98, 99]):
        r = client.post("/v1/completions", json={**req, "prompt": prompt})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want


def test_a_batch_error_says_what_to_do(client):
    err = client.post("/v1/completions", json={"model": "fake", "prompt": ["a", "b"]}).json()["error"]
    assert err["message"] == "prompt: a batch of 2 prompts is not supported; send one prompt per request"
    assert err["param"] == "prompt"


def test_chat_top_logprobs_needs_logprobs(client, backend):
    msgs = [{"role": "user", "content": "hi"}]
    for extra in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}):
        r = client.post("/v1/chat/completions", json={"model": "fake", "messages": msgs, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text
    assert not backend.engine.requests


def test_chat_content_parts_are_joined_and_non_text_parts_refused(client, backend):
    req = {"model": "fake", "max_tokens": 4, "temperature": 0}
    plain = client.post("/v1/chat/completions", json={**req, "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]}).json()
    parts = client.post("/v1/chat/completions", json={**req, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]}).json()
    assert parts["usage"] == plain["usage"]
    assert parts["choices"][0]["message"] == plain["choices"][0]["message"]
    r = client.post("/v1/chat/completions", json={**req, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    assert r.status_code == 400 and "only text content parts" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages"
    assert not backend.engine.requests


@pytest.mark.parametrize("field,value", [
    ("best_of", 3), ("suffix", "tail"),
    ("response_format", {"type": "json_object"}), ("tools", [{"type": "function", "function": {"name": "f"}}]),
])
def test_fields_we_do_not_implement_are_refused_not_ignored(client, backend, field, value):
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = client.post(path, json={"model": "fake", "max_tokens": 2, **body, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and "not supported" in err["message"]
    assert not backend.engine.requests


def test_their_neutral_values_are_accepted(client):
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {},
               "best_of": 1, "response_format": {"type": "text"}, "tools": [], "logit_bias_extra": 5}
    r = client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 2, **neutral})
    assert r.status_code == 200, r.text


def test_stop_token_ids_end_the_output_with_reason_stop(client):
    """The fake engine's tokens are a hash of the sequence (deterministic): a stop token id
    that first comes k-th ends the output there, kept in it."""
    from tests.engine.helpers import make_engine, run_to_completion

    body = {"model": "fake", "prompt": "abcdefgh", "max_tokens": 8, "temperature": 0}
    eng = make_engine(num_blocks=64, block_size=4, max_model_len=256, vocab_size=EngineBackend.vocab_size)
    eng.add_request("r", list(b"abcdefgh"), SamplingParams(max_tokens=8))
    ids = run_to_completion(eng)["r"]
    full = client.post("/v1/completions", json=body).json()
    assert full["choices"][0]["finish_reason"] == "length" and full["usage"]["completion_tokens"] == 8
    k = next(i for i in range(1, 8) if ids[i] not in ids[:i])
    cut = client.post("/v1/completions", json={**body, "stop_token_ids": [ids[k]]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["usage"]["completion_tokens"] == k + 1
    assert cut["choices"][0]["text"] == full["choices"][0]["text"][:k + 1]


def test_min_tokens_holds_off_stop_ids_and_stop_strings(client):
    """The fake engine ignores the sampler's mask: a stop id or a stop string that comes
    before min_tokens tokens does not end the output; the next one after does."""
    from tests.engine.helpers import make_engine, run_to_completion

    body = {"model": "fake", "prompt": "abcdefgh", "max_tokens": 12, "temperature": 0}
    eng = make_engine(num_blocks=64, block_size=4, max_model_len=256, vocab_size=EngineBackend.vocab_size)
    eng.add_request("r", list(b"abcdefgh"), SamplingParams(max_tokens=12))
    ids = run_to_completion(eng)["r"]
    full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    for n_min in (1, 4):
        j = next((i for i in range(n_min - 1, 12) if ids[i] == ids[0]), None)
        got = client.post("/v1/completions", json={**body, "min_tokens": n_min, "stop_token_ids": [ids[0]]}).json()
        assert got["usage"]["completion_tokens"] == (12 if j is None else j + 1)
        assert got["choices"][0]["finish_reason"] == ("length" if j is None else "stop")
    # a stop string: the first token's text, then again with min_tokens 3
    tok = EngineBackend().tokenizer
    first = tok.decode([ids[0]])
    assert first and full.startswith(first)
    cut = client.post("/v1/completions", json={**body, "stop": [first]}).json()["choices"][0]
    assert cut["text"] == "" and cut["finish_reason"] == "stop"
    held = client.post("/v1/completions", json={**body, "stop": [first], "min_tokens": 3}).json()["choices"][0]
    floor = len(tok.decode(ids[:2]))
    at = full.find(first, floor - len(first) + 1)
    assert held["text"] == (full if at < 0 else full[:at])
    assert held["finish_reason"] == ("length" if at < 0 else "stop")


def test_prompt_tokens_read_from_the_prefix_cache_are_counted():
    backend = EngineBackend(prefix_caching=True)
    client = TestClient(build_app(backend))
    body = {"model": "fake", "prompt": "a shared prefix, then", "max_tokens": 2, "temperature": 0}
    first = client.post("/v1/completions", json=body).json()
    again = client.post("/v1/completions", json=body).json()
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    # 21 prompt tokens: 5 full blocks of 4 from the first request
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 20}
    with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 20}
    line = next(x for x in client.get("/metrics").text.splitlines()
                if x.startswith("llumnix:prompt_tokens_cached_total"))
    assert float(line.split()[-1]) == 40


def test_penalties_and_logit_bias_reach_the_engine(client, backend, monkeypatch):
    seen = []
    generate = backend.generate

    def spy(request):
        seen.append(request.params)
        return generate(request)

    monkeypatch.setattr(backend, "generate", spy)
    asked = {"frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.2,
             "logit_bias": {"50": 10, "7": -100}}
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = client.post(path, json={"model": "fake", "max_tokens": 2, **body, **asked})
        assert r.status_code == 200, r.text
    assert len(seen) == 2
    for p in seen:
        assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.5, -1.0, 1.2)
        assert p.logit_bias == ((7, -100.0), (50, 10.0))


@pytest.mark.parametrize("field,value,says", [
    ("frequency_penalty", 2.5, "in [-2, 2]"), ("presence_penalty", -3, "in [-2, 2]"),
    ("repetition_penalty", 0, "in (0, 2]"), ("logit_bias", {"x1": 3}, "must be token ids"),
    ("logit_bias", {"-4": 3}, "must be token ids"), ("logit_bias", {"256": 3}, "vocab size"),
    ("logit_bias", {"5": 200}, "in [-100, 100]"), ("stop_token_ids", [3, 999], "vocab size"),
    ("stop_token_ids", [-1], "vocab size"),
])
def test_bad_penalties_and_biases_are_400s(client, backend, field, value, says):
    r = client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and says in err["message"], err
    assert not backend.engine.requests


def test_max_tokens_beyond_the_context_is_refused_and_the_default_fits_it(client, backend):
    """The fake model's context is 256 tokens. An explicit max_tokens that cannot fit is a
    400 (OpenAI's and vLLM's rule) rather than a request that runs to the context's end; the
    default (256 here too) shrinks to what the prompt leaves."""
    prompt = "x" * 200
    r = client.post("/v1/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 57})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "max_tokens" and "at most 56, not 57" in err["message"]
    assert not backend.engine.requests
    ok = client.post("/v1/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 56,
                                              "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 56
    dflt = client.post("/v1/completions", json={"model": "fake", "prompt": prompt, "ignore_eos": True})
    assert dflt.status_code == 200 and dflt.json()["usage"]["completion_tokens"] == 56
    chat = client.post("/v1/chat/completions", json={"model": "fake", "max_completion_tokens": 300,
                                                     "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_tokens", chat.text


def test_unknown_routes_methods_and_non_object_bodies_get_openai_error_bodies(client):
    r = client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["message"] == "no route /v1/nope"
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["message"] == "GET is not allowed on /v1/completions"
    for content, ctype in ((b"hello", "text/plain"), (b"[1, 2]", "application/json"), (b"", "application/json")):
        r = client.post("/v1/completions", content=content, headers={"content-type": ctype})
        assert r.status_code == 400, (content, r.text)
        assert r.json()["error"]["message"] in (
            "the request body must be a JSON object",
            "the request body must be a JSON object sent as application/json (this one came as 'text/plain')",
            "request body is not valid JSON (Expecting value)")
    # curl -d without -H sends a JSON body as a form: the answer says what to change
    r = client.post("/v1/completions", content=b'{"model": "fake", "prompt": "x"}',
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "sent as application/json" in r.json()["error"]["message"]


def test_n_choices_are_served_each_on_its_own(client, backend):
    base = {"model": "fake", "prompt": "hello", "max_tokens": 6}
    one = client.post("/v1/completions", json={**base, "temperature": 0}).json()
    r = client.post("/v1/completions", json={**base, "temperature": 0, "n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == one["choices"][0]["text"] and c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 18, "total_tokens": 23,  # the prompt once
                             "prompt_tokens_details": {"cached_tokens": 0}}
    # seeded sampling: choice i samples as a single request with seed + i would
    seeded = client.post("/v1/completions", json={**base, "temperature": 1, "seed": 7, "n": 3}).json()
    singles = [client.post("/v1/completions", json={**base, "temperature": 1, "seed": 7 + i}).json()
               ["choices"][0]["text"] for i in range(3)]
    assert [c["text"] for c in seeded["choices"]] == singles
    assert len(set(singles)) > 1  # the choices are not copies of one another
    assert backend.engine.kv.num_free_blocks == backend.engine.kv.num_total_blocks
    assert not backend.engine.requests


def test_streamed_n_choices_join_to_the_non_streamed_ones(client, backend):
    req = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
           "temperature": 1, "seed": 3, "n": 2}
    full = client.post("/v1/chat/completions", json=req).json()
    body = {**req, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    by_index: dict[int, list[dict]] = {0: [], 1: []}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        by_index[choice["index"]].append(choice)
    for i in (0, 1):
        assert by_index[i][0]["delta"] == {"role": "assistant"}  # each choice opens with its role
        text = "".join(ch["delta"].get("content", "") for ch in by_index[i])
        assert text == full["choices"][i]["message"]["content"]
        assert by_index[i][-1]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert all(c["id"] == chunks[0]["id"] and c["id"].startswith("chatcmpl-") for c in chunks)
    assert backend.engine.kv.num_free_blocks == backend.engine.kv.num_total_blocks


def test_echo_of_token_ids_is_their_text(client):
    r = client.post("/v1/completions", json={"model": "fake", "prompt": [104, 105], "max_tokens": 2,
                                             "temperature": 0, "echo": True}).json()
    assert r["choices"][0]["text"].startswith("hi")


def test_when_one_of_n_choices_fails_the_others_are_stopped_and_their_kv_freed(backend):
    from llumnix.core.errors import LlumnixError

    served = backend.generate

    async def second_choice_fails(request):
        n = 0
        async for out in served(request):
            yield out
            n += 1
            if request.request_id.endswith("-1") and n == 2:
                raise LlumnixError("instance-0 failed and no other instance could take the request")

    backend.generate = second_choice_fails
    c = TestClient(build_app(backend))
    req = {"model": "fake", "prompt": "hello", "max_tokens": 40, "ignore_eos": True, "n": 3}
    r = c.post("/v1/completions", json=req)
    assert r.status_code == 503 and "could take" in r.json()["error"]["message"]
    # the failed choice and the two still running were aborted in the engine
    assert sorted(rid[-2:] for rid in backend.aborted) == ["-0", "-1", "-2"]
    assert backend.engine.kv.num_free_blocks == backend.engine.kv.num_total_blocks
    with c.stream("POST", "/v1/completions", json={**req, "stream": True}) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert "could take" in lines[-2] and lines[-1] == "data: [DONE]"
    # streamed, the other choices may have finished before the error was read: each one
    # either finished or was aborted, and nothing holds KV
    assert backend.engine.kv.num_free_blocks == backend.engine.kv.num_total_blocks
    assert not backend.engine.requests


def test_echo_with_max_tokens_0_answers_the_prompt_alone_streamed_or_not(client, backend):
    req = {"model": "fake", "prompt": "score me", "max_tokens": 0, "echo": True}
    r = client.post("/v1/completions", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == "score me" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert client.post("/v1/completions", json={**req, "echo": False}).status_code == 400  # 0 needs echo
    body = {**req, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks[:-1]] == [
        ("score me", None), ("", "length")]
    assert chunks[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8,
                                   "prompt_tokens_details": {"cached_tokens": 0}}
    assert backend.engine.kv.num_free_blocks == backend.engine.kv.num_total_blocks



def test_tokenize_and_detokenize_round_trip_what_the_server_prefills(backend):
    c = TestClient(build_app(backend, api_key="k"))
    key = {"Authorization": "Bearer k"}
    assert c.post("/tokenize", json={"model": "fake", "prompt": "hi"}).status_code == 401
    r = c.post("/tokenize", json={"model": "fake", "prompt": "hi there"}, headers=key).json()
    assert r == {"tokens": list(b"hi there"), "count": 8, "max_model_len": 256}
    chat = c.post("/tokenize", json={"model": "fake", "messages": [{"role": "user", "content": "yo"}]},
                  headers=key).json()
    used = c.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "yo"}],
                                                "max_tokens": 1}, headers=key).json()
    assert chat["count"] == used["usage"]["prompt_tokens"]  # what the chat route prefilled
    back = c.post("/detokenize", json={"model": "fake", "tokens": r["tokens"]}, headers=key).json()
    assert back == {"prompt": "hi there"}
    for bad, param in (({"model": "fake"}, None), ({"model": "fake", "prompt": "a", "messages": []}, None),
                       ({"model": "nope", "prompt": "a"}, "model")):
        res = c.post("/tokenize", json=bad, headers=key)
        assert res.status_code in (400, 404) and res.json()["error"]["param"] == param, res.text
    res = c.post("/detokenize", json={"model": "fake", "tokens": [1, 999]}, headers=key)
    assert res.status_code == 400 and res.json()["error"]["param"] == "tokens"
