"""--gpu-memory-utilization's arithmetic (CUDA's memory queries faked: no GPU here; the
flag has no effect on cpu)."""
from __future__ import annotations

import pytest

from llumnix.core.errors import InvalidRequestError
from llumnix.llm import CUDA_CONTEXT_BYTES, GRAPH_RESERVE_BYTES, activation_bytes, kv_bytes_for_utilization
from llumnix.model.config import LlamaConfig

GiB = 2**30


@pytest.fixture()
def cuda(monkeypatch):
    """A device with 80 GiB, ``state["free"]`` free, ``state["held"]`` held by this process's torch."""
    import torch

    state = {"free": 70 * GiB, "held": 10 * GiB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["held"])
    return state


def test_the_kv_cache_gets_the_share_less_weights_context_and_activations(cuda):
    reserve = 2 * GiB
    assert kv_bytes_for_utilization("cuda", 0.5, reserve) == 40 * GiB - 10 * GiB - CUDA_CONTEXT_BYTES - reserve
    cuda["free"] = 20 * GiB  # another process holds the rest: never more than is free
    assert kv_bytes_for_utilization("cuda", 0.9, reserve) == 20 * GiB - reserve


def test_a_share_the_weights_fill_is_one_clear_error(cuda):
    with pytest.raises(InvalidRequestError, match=r"gpu_memory_utilization 0.1 leaves no room for a KV cache: "
                                                  r"of the 8.0 GiB it allows, the weights and CUDA context take "
                                                  r"10.5 GiB"):
        kv_bytes_for_utilization("cuda", 0.1, GiB)


def test_activations_grow_with_the_step_budget_and_graphs_add_their_reserve():
    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16)
    base = activation_bytes(cfg, 256, 8, "float32", graphs=False)
    assert base == 256 * (6 * 64 + 3 * 128) * 4 + 8 * 3 * 1000 * 4
    assert activation_bytes(cfg, 512, 8, "float32", graphs=False) > base
    assert activation_bytes(cfg, 256, 8, "float32", graphs=True) == base + GRAPH_RESERVE_BYTES
