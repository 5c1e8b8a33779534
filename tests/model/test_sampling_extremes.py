"""No accepted sampling parameters can make the real sampler or the real step raise:
the values a hostile client sends (a top_p of 1e-300, a temperature of 5e-324, a
repetition penalty of 1e-300) are sampled at their limit, not crashed on."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llumnix.core.batch import ScheduledRequest
from llumnix.core.errors import InvalidRequestError
from llumnix.core.sampling_params import SamplingParams
from llumnix.model.sampler import sample
from tests.model.helpers import real_engine

tiny = st.sampled_from([0.0, 5e-324, 1e-300, 1e-45, 1e-40, 1e-8, 1e-5, 1e-3])
params = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 6),
    min_tokens=st.integers(0, 2),
    temperature=st.one_of(tiny, st.floats(0.0, 2.0)),
    top_p=st.one_of(tiny.filter(bool), st.floats(1e-300, 1.0)),
    top_k=st.one_of(st.just(-1), st.integers(0, 300)),
    seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    repetition_penalty=st.one_of(tiny.filter(bool), st.floats(1e-300, 2.0)),
    logit_bias=st.lists(st.tuples(st.integers(0, 300), st.floats(-100.0, 100.0)), max_size=4).map(tuple),
    logprobs=st.one_of(st.none(), st.integers(0, 5)),
    ignore_eos=st.booleans(),
    stop_token_ids=st.lists(st.integers(0, 300), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(p=st.data(), scale=st.sampled_from([1.0, 30.0, 1e30, float("inf")]), seed=st.integers(0, 1000))
def test_the_sampler_never_raises_on_accepted_parameters(p, scale, seed):
    try:
        sp = p.draw(params)
    except InvalidRequestError:
        assume(False)
    logits = torch.randn(2, 301, generator=torch.Generator().manual_seed(seed)) * (1.0 if scale == float("inf") else scale)
    if scale == float("inf"):
        logits[0, 7] = logits[1, 3] = float("inf")  # what a broken model could emit
    reqs = [ScheduledRequest(f"r{i}", [1], 0, [0], sp, seed, i, prompt_token_ids=[1, 7, 9, 3], output_token_ids=[3, 3])
            for i in range(2)]
    tokens, _ = sample(logits, reqs, want_logprobs=sp.logprobs is not None)
    assert all(0 <= t < 301 for t in tokens)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.filter_too_much])
@given(data=st.data())
def test_the_real_step_serves_any_accepted_parameters(tiny_loaded, data):
    eng = real_engine(tiny_loaded, num_blocks=48)
    for i in range(3):
        try:
            sp = data.draw(params)
        except InvalidRequestError:
            assume(False)
        eng.add_request(f"r{i}", [5 + i, 9, 11, 5 + i, 2], sp)
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
        eng.check_invariants()
    assert not [o for o in outs if o.finish_reason == "error"]
    assert eng.kv.num_free_blocks == eng.kv.num_total_blocks
