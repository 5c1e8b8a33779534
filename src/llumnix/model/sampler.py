"""Per-request sampling: penalties and logit biases, then greedy or temperature,
top-k, top-p, seeded.

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


def _tame(row: torch.Tensor) -> torch.Tensor:
    """The row's limit where arithmetic broke: NaN logits cannot be drawn, and when some
    logits overflowed to +inf (a tiny repetition penalty, a tiny temperature over a large
    logit) the distribution is uniform over those. Tensor ops only, so no device sync."""
    row = torch.nan_to_num(row, nan=float("-inf"), posinf=float("inf"))
    inf = torch.isposinf(row)
    return torch.where(inf.any(), torch.where(inf, 0.0, float("-inf")), row)


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (always keep the first).
        drop = (cum - sorted_logits.softmax(-1)) >= top_p
        drop[0] = False  # also when top_p underflows the tensor's dtype (1e-300 is 0 in float32)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def shape_logits(logits: torch.Tensor, requests: list[ScheduledRequest]) -> torch.Tensor:
    """The logits each request samples from: ``logits`` itself when no request has
    penalties, biases or banned tokens (``min_tokens``), else a copy with them applied to
    those requests' rows.

    Everything here is a function of the request's tokens so far (prompt and output), which
    travel with it, so a migrated or recomputed request samples as it would have in place.
    """
    rows = [i for i, r in enumerate(requests) if r.sampling_params.shapes_logits or r.banned_token_ids]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        _shape_row(logits[i], requests[i])
    return logits


def _shape_row(row: torch.Tensor, r: ScheduledRequest) -> None:
    """Penalties and biases, in place, on one request's row: repetition (prompt and
    output), then frequency and presence (output), then the biases, then the banned
    tokens (``min_tokens``: EOS and stop ids may not come yet). Entry points refuse
    bias ids beyond the vocabulary; any that got here are left out, not a crash of the batch."""
    p, dev = r.sampling_params, row.device
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*r.prompt_token_ids, *r.output_token_ids}), dtype=torch.long, device=dev)
        v = row[seen]
        row[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and r.output_token_ids:
        out = torch.tensor(r.output_token_ids, dtype=torch.long, device=dev)
        counts = torch.bincount(out, minlength=row.shape[0])[:row.shape[0]].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    bias = [(t, b) for t, b in p.logit_bias if t < row.shape[0]]
    if bias:
        ids = torch.tensor([t for t, _ in bias], dtype=torch.long, device=dev)
        row.index_add_(0, ids, torch.tensor([b for _, b in bias], dtype=row.dtype, device=dev))
    banned = [t for t in r.banned_token_ids if t < row.shape[0]]
    if banned:
        row[torch.tensor(banned, dtype=torch.long, device=dev)] = float("-inf")


def sample(logits: torch.Tensor, requests: list[ScheduledRequest],
           want_logprobs: bool = False) -> tuple[list[int], list[float] | None]:
    """One token per row of ``logits`` [B, vocab] (float32).

    Logprobs, when asked for, are of the model's own distribution (log-softmax
    of the raw logits, before penalties, biases, temperature and filtering), as
    vLLM reports them by default.
    """
    shaped = shape_logits(logits, requests)
    tokens = shaped.argmax(dim=-1)
    sampled_rows = [i for i, r in enumerate(requests) if not r.sampling_params.is_greedy]
    if sampled_rows:
        tokens = tokens.clone()
        for i in sampled_rows:
            r = requests[i]
            p = r.sampling_params
            row = _filter(_tame(shaped[i] / p.temperature), p.top_k, p.top_p)
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
