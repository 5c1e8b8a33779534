"""Per-request sampling: greedy, temperature, top-k, top-p, seeded.

Each random draw uses a fresh generator seeded from (request seed, output
index), so the random stream is a pure function of counters the request
already carries: a request resumed on another instance draws exactly what it
would have drawn here, and no generator state needs to travel.
"""
from __future__ import annotations

import torch

from llumnix.core.batch import ScheduledRequest

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, index: int) -> int:
    """splitmix64 of (seed, index): well-spread 63-bit seeds for nearby inputs."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (always keep the first).
        drop = (cum - sorted_logits.softmax(-1)) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, requests: list[ScheduledRequest],
           want_logprobs: bool = False) -> tuple[list[int], list[float] | None]:
    """One token per row of ``logits`` [B, vocab] (float32).

    Logprobs, when asked for, are of the model's own distribution (log-softmax
    of the raw logits, before temperature and filtering), as vLLM reports them.
    """
    tokens = logits.argmax(dim=-1)
    sampled_rows = [i for i, r in enumerate(requests) if not r.sampling_params.is_greedy]
    if sampled_rows:
        tokens = tokens.clone()
        for i in sampled_rows:
            r = requests[i]
            p = r.sampling_params
            row = _filter(logits[i] / p.temperature, p.top_k, p.top_p)
            gen = torch.Generator(device=logits.device)
            gen.manual_seed(mix_seed(r.seed, r.output_index))
            tokens[i] = torch.multinomial(row.softmax(-1), 1, generator=gen)[0]
    out = tokens.tolist()
    if not want_logprobs:
        return out, None
    lp = logits.log_softmax(-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    return out, lp.tolist()


def top_logprobs(logits: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """The ``k`` most likely tokens of each row with their logprobs, most likely first,
    of the model's own distribution (as ``sample`` reports the chosen token's)."""
    return top_of(logits.log_softmax(-1), k)


def top_of(logprobs: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """The ``k`` largest entries of each row of ``logprobs``, as (token id, logprob)."""
    values, ids = logprobs.topk(k, dim=-1)
    return [list(zip(row_ids, row_vals, strict=True)) for row_ids, row_vals in zip(ids.tolist(), values.tolist(),
                                                                                   strict=True)]
