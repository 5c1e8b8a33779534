import dataclasses

import pytest

from llumnix.core.evolve import evolve
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest


def test_evolve_changes_only_the_named_fields_of_a_copy():
    params = SamplingParams(max_tokens=7, temperature=0.5)
    req = GenerateRequest("r", [1, 2, 3], params, 1, 12.5)
    new = evolve(req, params=evolve(params, seed=42), client="gw")
    assert new == dataclasses.replace(req, params=dataclasses.replace(params, seed=42), client="gw")
    assert req.client == "" and req.params.seed is None  # the original is untouched
    assert new.prompt_token_ids is req.prompt_token_ids  # shallow, as dataclasses.replace
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.client = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no field 'clinet'"):
        evolve(req, clinet="gw")
