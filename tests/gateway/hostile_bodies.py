"""Request bodies a hostile or careless client may send, as hypothesis strategies: every
field of the hot routes with valid values, values at and past their bounds, wrong types,
lone surrogates, and shapes the schema does not expect. Used by the property test here
(the gateway over a real engine) and by ``benchmarks/hostile_fuzz.py`` (a real serve)."""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from llumnix.core.sampling_params import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_TOKEN_IDS

ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")

_junk = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                  st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=3), st.just({}))
_text = st.one_of(st.text(max_size=40), st.sampled_from(["", "\ud800", "a\udfffb", "<|im_end|>", "\x00"]),
                  st.text(alphabet="ab ", min_size=200, max_size=2000))


def _ids(vocab: int) -> st.SearchStrategy[list[int]]:
    edge = st.sampled_from([0, vocab - 1, vocab, -1, 2**31, 2**63])
    return st.lists(st.one_of(st.integers(0, vocab - 1), edge), max_size=64)


def _near(bound: int, low: int = 0) -> st.SearchStrategy[int]:
    """An integer around a bound: inside, at it, one past it, and far away."""
    return st.sampled_from(sorted({low - 1, low, bound - 1, bound, bound + 1, 10 * bound + 7}))


def _sampling(vocab: int) -> dict[str, st.SearchStrategy[Any]]:
    return {
        "max_tokens": st.one_of(_near(8, 0), _junk), "min_tokens": st.one_of(_near(8, 0), _junk),
        "temperature": st.one_of(st.sampled_from([0, 0.5, 2, 2.01, -1, 1e308]), _junk),
        "top_p": st.one_of(st.sampled_from([1, 0.5, 0, 1.5]), _junk),
        "top_k": st.one_of(_near(5, -1), _junk), "seed": st.one_of(st.integers(-2**64, 2**64), _junk),
        "n": st.one_of(_near(16, 1), _junk), "stream": st.one_of(st.booleans(), _junk),
        "logprobs": st.one_of(_near(20, 0), st.booleans(), _junk), "echo": st.one_of(st.booleans(), _junk),
        "ignore_eos": st.one_of(st.booleans(), _junk),
        "stop": st.one_of(_text, st.lists(_text, max_size=6), st.just(["x" * (MAX_STOP_CHARS + 1)]), _junk),
        "stop_token_ids": st.one_of(_ids(vocab), st.just(list(range(MAX_STOP_TOKEN_IDS + 1))), _junk),
        "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "2", "-1", "x", str(vocab), "\ud800"]),
                                                st.one_of(st.floats(-200, 200), _junk), max_size=4),
                                st.just({str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}), _junk),
        "presence_penalty": st.one_of(st.floats(-3, 3), _junk), "frequency_penalty": st.one_of(st.floats(-3, 3), _junk),
        "repetition_penalty": st.one_of(st.floats(-1, 3), _junk),
        "priority": st.one_of(st.sampled_from(["high", "normal", "urgent", -1, 0, 5]), _junk),
        "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), _junk)}), _junk),
        "best_of": st.one_of(st.none(), _near(2, 1)), "user": st.one_of(_text, _junk),
    }


def _message() -> st.SearchStrategy[Any]:
    role = st.one_of(st.sampled_from(["user", "system", "assistant", "developer", "tool", "\ud800", "x"]), _junk)
    content = st.one_of(_text, st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                                                  st.just({"type": "image_url"}), _junk), max_size=3), _junk)
    return st.one_of(st.fixed_dictionaries({"role": role, "content": content}), _junk)


def body(route: str, model: str, vocab: int) -> st.SearchStrategy[dict[str, Any]]:
    """A body for ``route``: the model's name (or a bad one), the route's input, and any
    subset of the sampling fields."""
    name = st.one_of(st.just(model), st.just(model), st.just(model), _text, _junk)
    if route == "/v1/completions":
        main = {"prompt": st.one_of(_text, _ids(vocab), st.lists(_text, max_size=2), st.lists(_ids(vocab), max_size=2),
                                    _junk)}
    elif route == "/detokenize":
        main = {"tokens": st.one_of(_ids(vocab), _junk)}
    else:
        main = {"messages": st.one_of(st.lists(_message(), max_size=5), st.just([{"role": "user", "content": ""}] * 600),
                                      _junk)}
        if route == "/tokenize":
            main["prompt"] = st.one_of(st.nothing(), _text)
    optional = _sampling(vocab) if route.startswith("/v1/") else {"add_special_tokens": st.one_of(st.booleans(), _junk)}
    return st.fixed_dictionaries({"model": name, **main}, optional=optional)


def served_body(route: str, model: str, vocab: int) -> st.SearchStrategy[dict[str, Any]]:
    """A body the server should serve, every field valid and some at their bounds: so
    that the engine runs, not only the validation."""
    fields: dict[str, st.SearchStrategy[Any]] = {
        "max_tokens": st.integers(1, 8), "temperature": st.sampled_from([0, 0.7, 2]), "seed": st.integers(0, 2**32),
        "n": st.integers(1, 4), "stream": st.booleans(), "logprobs": st.integers(0, 20) if "chat" not in route
        else st.booleans(), "ignore_eos": st.booleans(), "min_tokens": st.integers(0, 1),
        "stop": st.lists(st.text(min_size=1, max_size=MAX_STOP_CHARS), max_size=4),
        "stop_token_ids": st.lists(st.integers(0, vocab - 1), max_size=MAX_STOP_TOKEN_IDS),
        "logit_bias": st.dictionaries(st.integers(0, vocab - 1).map(str), st.floats(-100, 100), max_size=8),
        "presence_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.5, 2),
        "top_k": st.integers(-1, 50), "top_p": st.floats(0.1, 1),
    }
    if route == "/v1/completions":
        main = {"prompt": st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, vocab - 1), min_size=1,
                                                                                max_size=40))}
    else:
        main = {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                                           "content": st.text(max_size=40)}), min_size=1, max_size=4)}
    return st.fixed_dictionaries({"model": st.just(model), **main}, optional=fields)


def request(model: str, vocab: int) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """Half hostile bodies on any route, half bodies to serve on the hot routes."""
    hostile = st.sampled_from(ROUTES).flatmap(lambda r: st.tuples(st.just(r), body(r, model, vocab)))
    served = st.sampled_from(ROUTES[:2]).flatmap(lambda r: st.tuples(st.just(r), served_body(r, model, vocab)))
    return st.one_of(hostile, served)
