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


def _hist(params: SamplingParams, prompt: list[int], output: list[int], seed: int = 1) -> ScheduledRequest:
    return ScheduledRequest("r", [1], 0, [0], params, seed, len(output), prompt, output)


def test_repetition_penalty_matches_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    from llumnix.model.sampler import shape_logits

    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(3))
    prompt, output = [4, 9, 9, 30], [7, 4, 12]
    for penalty in (1.3, 0.7):
        got = shape_logits(logits, [_hist(SamplingParams(repetition_penalty=penalty), prompt, output),
                                    _hist(SamplingParams(), prompt, output)])
        want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits[:1].clone())
        torch.testing.assert_close(got[0], want[0])
        assert torch.equal(got[1], logits[1])  # the other request's row is untouched


def test_frequency_and_presence_penalties_count_the_output_only():
    from llumnix.model.sampler import shape_logits

    logits = torch.zeros(1, 10)
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=1.5)
    got = shape_logits(logits, [_hist(p, prompt=[1, 1, 1], output=[2, 2, 2, 5])])[0]
    want = torch.zeros(10)
    want[2] = -(3 * 0.5 + 1.5)
    want[5] = -(1 * 0.5 + 1.5)
    torch.testing.assert_close(got, want)  # token 1 is only in the prompt: not penalised
    assert torch.equal(logits, torch.zeros(1, 10))  # the model's logits are not written


def test_logit_bias_steers_greedy_and_sampled_choices_but_not_the_reported_logprobs():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(4))
    worst = int(logits.argmin())
    for p in (SamplingParams(logit_bias=((worst, 100.0),)),
              SamplingParams(temperature=1.0, logit_bias=((worst, 100.0),))):
        toks, lps = sample(logits, [_hist(p, [1], [])], want_logprobs=True)
        assert toks == [worst]
        assert lps == pytest.approx([float(logits.log_softmax(-1)[0, worst])])
    best = int(logits.argmax())
    toks, _ = sample(logits, [_hist(SamplingParams(logit_bias=((best, -100.0),)), [1], [])])
    assert toks != [best]


def test_a_greedy_batch_without_penalties_is_not_copied():
    from llumnix.model.sampler import shape_logits

    logits = torch.randn(3, 20)
    assert shape_logits(logits, [_hist(SamplingParams(), [1], [2])] * 3) is logits


def test_penalty_and_bias_values_are_checked():
    from llumnix.core.errors import InvalidRequestError

    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0},
                {"repetition_penalty": 2.5}, {"logit_bias": ((5, 101.0),)}, {"logit_bias": ((-1, 1.0),)}):
        with pytest.raises(InvalidRequestError) as e:
            SamplingParams(**bad)
        assert e.value.param == next(iter(bad))
    assert not SamplingParams().shapes_logits and SamplingParams(repetition_penalty=1.1).shapes_logits


def test_banned_tokens_cannot_be_sampled_but_keep_their_logprobs():
    from llumnix.core.batch import ScheduledRequest

    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(5))
    best = int(logits[0].argmax())
    for p in (SamplingParams(), SamplingParams(temperature=1.0)):
        for seed in range(20 if p.temperature else 1):  # each seed its own draw
            banned = ScheduledRequest("a", [1], 0, [0], p, seed, 0, [1], [], (best, 99))  # 99: beyond the vocab
            free = ScheduledRequest("b", [1], 0, [0], p, seed, 0, [1], [])
            toks, lps = sample(logits, [banned, free], want_logprobs=True)
            assert toks[0] != best
            assert lps[0] == pytest.approx(float(logits.log_softmax(-1)[0, toks[0]]))  # the model's own
    greedy = ScheduledRequest("b", [1], 0, [0], SamplingParams(), 1, 0, [1], [])
    assert sample(logits, [greedy, greedy])[0][0] == best
