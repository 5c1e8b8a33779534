"""A request's work budget (issue 43): every field whose size multiplies the work of an
engine step or of the gateway has a documented bound, checked before any tokenization,
and what a step does per request is made once at admission."""
from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Request
from llumnix.core.sampling_params import MAX_STOP_CHARS, MAX_STOP_TOKEN_IDS, SamplingParams
from llumnix.gateway.app import build_app
from llumnix.gateway.limits import AUTO_MIN_BYTES, body_limit

H = {"content-type": "application/json"}


def _post(client: TestClient, path: str, body: dict) -> tuple[int, dict]:
    r = client.post(path, content=json.dumps(body, separators=(",", ":")).encode(), headers=H)
    return r.status_code, r.json()


def test_the_hostile_stop_list_is_refused_by_name_before_the_engine_sees_it(client, backend):
    # issue 43's N1 request, at the largest size the default body limit lets through
    n1 = {"model": "fake", "prompt": "x", "n": 16, "min_tokens": 200, "max_tokens": 200, "ignore_eos": True,
          "temperature": 0.5, "stop_token_ids": [0] * 200_000}
    status, body = _post(client, "/v1/completions", n1)
    assert status == 400 and body["error"]["param"] == "stop_token_ids", body
    assert f"at most {MAX_STOP_TOKEN_IDS}" in body["error"]["message"]
    assert not backend.engine.requests


def test_the_8_mib_hostile_body_is_a_413_before_it_is_parsed(client, backend):
    n1 = {"model": "fake", "prompt": "x", "n": 16, "min_tokens": 200, "max_tokens": 200,
          "stop_token_ids": [0] * 4_000_000}
    t0 = time.monotonic()
    status, body = _post(client, "/v1/completions", n1)
    assert status == 413 and "--max-request-bytes" in body["error"]["message"], body
    assert time.monotonic() - t0 < 5 and not backend.engine.requests


@pytest.mark.parametrize("field,value,param", [
    ("stop_token_ids", [1] * (MAX_STOP_TOKEN_IDS + 1), "stop_token_ids"),
    ("stop", ["a" * (MAX_STOP_CHARS + 1)], "stop"),
    ("stop", ["a", "b", "c", "d", "e"], "stop"),
    ("logit_bias", {str(i): 1.0 for i in range(1025)}, "logit_bias"),
    ("n", 17, "n"),
    ("logprobs", 21, "logprobs"),
])
def test_each_bounded_field_one_past_its_bound_is_a_400_naming_it(client, backend, field, value, param):
    status, body = _post(client, "/v1/completions", {"model": "fake", "prompt": "x", "max_tokens": 2, field: value})
    assert status == 400 and body["error"]["param"] == param, body
    assert not backend.engine.requests


def test_at_its_bound_a_field_is_served(client):
    status, body = _post(client, "/v1/completions", {
        "model": "fake", "prompt": "x", "max_tokens": 3, "min_tokens": 2, "stop": ["z" * MAX_STOP_CHARS] * 4,
        "stop_token_ids": [i % 200 for i in range(MAX_STOP_TOKEN_IDS)]})
    assert status == 200 and len(body["choices"]) == 1, body


def test_empty_messages_count_against_the_context(client, backend):
    # 250,000 empty messages froze the event loop for 13 s: a message renders to at least one
    # token, so more messages than the context holds are refused before the template runs
    many = [{"role": "user", "content": ""}] * (backend.max_model_len + 1)
    for path in ("/v1/chat/completions",):
        status, body = _post(client, path, {"model": "fake", "messages": many})
        assert status == 400 and body["error"]["param"] == "messages", body
        assert f"at least {backend.max_model_len + 1} tokens" in body["error"]["message"]
    assert not backend.engine.requests


@pytest.mark.parametrize("field,value", [("max_tokens", True), ("stream", "yes"), ("seed", "12"),
                                         ("n", 1.0), ("temperature", "0.5"), ("ignore_eos", 1)])
def test_request_fields_are_strictly_typed(client, field, value):
    status, body = _post(client, "/v1/completions", {"model": "fake", "prompt": "x", "max_tokens": 2, field: value})
    assert status == 400 and body["error"]["param"] == field, body


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", '{"model": "\\ud800", "prompt": "x"}'),
    ("/v1/chat/completions", '{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}'),
    ("/detokenize", '{"model": "\\ud800", "tokens": [1]}'),
    ("/tokenize", '{"model": "\\udfff", "prompt": "x"}'),
])
def test_a_lone_surrogate_in_model_is_a_400(client, path, body):
    r = client.post(path, content=body.encode(), headers=H)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text


def test_a_lone_surrogate_in_a_chat_role_is_answered(client):
    for path in ("/v1/chat/completions", "/tokenize"):
        body = '{"model": "fake", "messages": [{"role": "\\ud800", "content": "x"}]}'
        r = client.post(path, content=body.encode(), headers=H)
        assert r.status_code == 400 and "role" in r.json()["error"]["message"], r.text


def test_the_default_body_limit_follows_the_context():
    assert body_limit("auto", 2048) == AUTO_MIN_BYTES
    assert body_limit("auto", 131072) == 64 * 131072
    assert body_limit(None, 2048) is None and body_limit(1000, 2048) == 1000


def test_sampling_params_check_lengths_before_walking_lists():
    with pytest.raises(InvalidRequestError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=(0,) * 4_000_000)
    p = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(5, 3, 5))
    assert p.stop_token_set == {3, 5}
    req = Request("r", [1, 2], p, 0.0, eos_token_id=7)
    assert req.banned_under_min_tokens == (7, 3, 5)
    assert req.banned_under_min_tokens is req.banned_under_min_tokens  # made once


def test_an_app_built_with_an_explicit_limit_keeps_it(backend):
    client = TestClient(build_app(backend, max_request_bytes=1 << 20))
    status, body = _post(client, "/v1/completions", {"model": "fake", "prompt": "x" * 600_000, "max_tokens": 1})
    assert status != 413, body
