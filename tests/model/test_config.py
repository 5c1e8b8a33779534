"""LlamaConfig from HF config.json dicts: RoPE settings in both transformers layouts."""
from __future__ import annotations

import pytest

from llumnix.core.errors import ModelLoadError
from llumnix.model.config import LlamaConfig

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("extra,theta", [
    ({}, 10000.0),
    ({"rope_theta": 100000.0}, 100000.0),                                           # transformers 4.x
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, 500000.0),  # transformers 5
    ({"rope_theta": 1.0, "rope_parameters": {"rope_theta": 2.0}}, 2.0),
])
def test_rope_theta_is_read_from_either_layout(extra, theta):
    assert LlamaConfig.from_hf({**BASE, **extra}).rope_theta == theta


@pytest.mark.parametrize("extra", [
    {"rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}},
])
def test_scaled_rope_is_refused_not_silently_wrong(extra):
    with pytest.raises(ModelLoadError, match="RoPE scaling"):
        LlamaConfig.from_hf({**BASE, **extra})
