from __future__ import annotations

import pytest
import torch

from llumnix.core.batch import ScheduledRequest
from llumnix.core.sampling_params import SamplingParams
from llumnix.model.sampler import mix_seed, sample


def _req(params: SamplingParams, seed: int = 1, index: int = 0) -> ScheduledRequest:
    return ScheduledRequest("r", [1], 0, [0], params, seed, index)


def test_greedy_is_argmax_and_logprobs_are_of_the_model_distribution():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]])
    toks, lps = sample(logits, [_req(SamplingParams())] * 2, want_logprobs=True)
    assert toks == [1, 0]
    torch.testing.assert_close(torch.tensor(lps), logits.log_softmax(-1)[[0, 1], [1, 0]])


def test_top_logprobs_are_the_most_likely_tokens_of_the_model_distribution():
    from llumnix.model.sampler import top_logprobs

    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0], [2.0, 0.0, 1.0, -3.0]])
    top = top_logprobs(logits, 2)
    lsm = logits.log_softmax(-1)
    assert [[t for t, _ in row] for row in top] == [[1, 3], [0, 2]]
    assert [lp for row in top for _, lp in row] == pytest.approx([float(lsm[0, 1]), float(lsm[0, 3]),
                                                                  float(lsm[1, 0]), float(lsm[1, 2])])


def test_same_seed_and_index_give_the_same_token_and_indices_differ():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0)
    draws = [sample(logits, [_req(p, seed=42, index=i)])[0][0] for i in range(20)]
    again = [sample(logits, [_req(p, seed=42, index=i)])[0][0] for i in range(20)]
    assert draws == again and len(set(draws)) > 5
    assert mix_seed(42, 0) != mix_seed(42, 1) != mix_seed(43, 0)


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(1, 500, generator=torch.Generator().manual_seed(1))
    best = int(logits.argmax())
    for p in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=1.5, top_p=1e-6)):
        assert {sample(logits, [_req(p, seed=s)])[0][0] for s in range(30)} == {best}


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().unsqueeze(0)
    p = SamplingParams(temperature=1.0)
    counts = torch.zeros(3)
    for s in range(3000):
        counts[sample(logits, [_req(p, seed=s)])[0][0]] += 1
    torch.testing.assert_close(counts / counts.sum(), probs, atol=0.03, rtol=0)


def test_top_k_keeps_only_the_k_best():
    logits = torch.tensor([[5.0, 4.0, 3.0, -10.0, -10.0]])
    p = SamplingParams(temperature=2.0, top_k=2)
    assert {sample(logits, [_req(p, seed=s)])[0][0] for s in range(200)} == {0, 1}
