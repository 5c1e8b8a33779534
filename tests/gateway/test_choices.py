from __future__ import annotations

from llumnix.core.sampling_params import SamplingParams
from llumnix.gateway.choices import make_choices


def test_one_choice_is_the_response_itself():
    (gen,) = make_choices("cmpl-a", [1, 2], SamplingParams(max_tokens=3), 1, 0, 5.0)
    assert gen.request_id == "cmpl-a" and gen.prompt_token_ids == [1, 2] and gen.arrival_time == 5.0


def test_n_choices_have_their_own_ids_and_seeds():
    gens = make_choices("cmpl-a", [1], SamplingParams(max_tokens=3, seed=7), 3, 1, 5.0)
    assert [g.request_id for g in gens] == ["cmpl-a-0", "cmpl-a-1", "cmpl-a-2"]
    assert [g.params.seed for g in gens] == [7, 8, 9] and {g.priority for g in gens} == {1}
    unseeded = make_choices("cmpl-b", [1], SamplingParams(max_tokens=3), 2, 0, 5.0)
    assert [g.params.seed for g in unseeded] == [None, None]


def test_a_final_only_answer_takes_its_first_token_time_from_the_engine():
    """Sent whole at its end, its 4 tokens arrive at once: TTFT is the engine's, and the
    3 gaps share the decode time, not 0 and e2e."""
    import time

    from llumnix.core.batch import RequestMetrics, RequestOutput
    from llumnix.core.wire import GenerateRequest
    from llumnix.gateway.app import build_app
    from llumnix.gateway.choices import _Progress
    from tests.gateway.fake_backend import EngineBackend

    ctx = build_app(EngineBackend()).state.gateway
    reg = ctx.metrics.registry
    gen = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=4), 0, time.monotonic() - 1.0, final_only=True)
    m = RequestMetrics(100.0, 100.1, 100.25, 101.0, 2, 4, 0, 0.0, 0)  # engine clock: TTFT 0.25 s
    progress = _Progress(ctx, gen)
    progress.on_output(RequestOutput("r", [5, 6, 7, 8], 4, "length", metrics=m))
    count = reg.get_sample_value("vllm:time_to_first_token_seconds_count", {"model_name": "fake"})
    total = reg.get_sample_value("vllm:time_to_first_token_seconds_sum", {"model_name": "fake"})
    assert count == 1 and abs(total - 0.25) < 0.01
    assert reg.get_sample_value("vllm:inter_token_latency_seconds_count", {"model_name": "fake"}) == 3
    itl = reg.get_sample_value("vllm:inter_token_latency_seconds_sum", {"model_name": "fake"})
    assert 0.7 < itl < 0.8  # about 1.0 - 0.25 s over the three gaps
