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
