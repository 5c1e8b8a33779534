from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama saved as a Hugging Face directory, and its transformers twin."""
    from tests.tiny_model import save_tiny_llama

    d = tmp_path_factory.mktemp("tiny-llama")
    model = save_tiny_llama(d)
    return d, model


@pytest.fixture(scope="session")
def tiny_loaded(tiny_llama_dir):
    from llumnix.model import load_model

    return load_model(str(tiny_llama_dir[0]))
