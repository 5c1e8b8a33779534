"""Decode shield (``llumnix`` dispatch option ``shield: true``; not in the paper): send a
long prompt where its prefill hurts the fewest young decoding requests.

Without chunked prefill (the paper's engine; ``SchedulerConfig.chunked_prefill``
is the engine-side answer to the same stall) a step is a prefill batch or a decode
batch, so a new prompt's prefill stalls every running request on its instance for
the whole prefill. The stall costs a request ``prefill_time / (its output tokens - 1)`` of
decode latency per token: negligible for a long answer, large for a short one.
The P99 decode latency of every Figure 11 trace is made of such requests (short
answers, never preempted, hit by another request's long prefill). Output lengths
are unknown at dispatch, but they are heavy-tailed, so a request that has
produced ``k`` tokens is short with a probability that falls like ``1/k``:

    harm(instance) = sum over running requests with k < YOUNG_TOKENS of 1 / max(k, 1)

The picker keeps Llumnix's freeness as the first concern: eligible are the
candidates whose (min-max normalised) freeness score is within ``SLACK`` of the
best and where the prompt fits now (free blocks beyond the queue's demand and the
watermark), so it never waits for memory the freest instance has; among them it
picks the lowest harm, then the highest score, then the lowest id.

The shield adapts to load: it picks exactly as ``max-score`` does while any candidate
has a queue (requests wait, so time to first token, not stalls, decides the tail, and a
request is best sent where the freeness points), when the candidates together have less
than ``MIN_FREE_FRACTION`` of their blocks free (memory and preemptions decide it), and
for a prompt shorter than ``MIN_PROMPT_TOKENS`` (a prefill no longer than about two
decode steps). The constants were set on a few single-seed runs, not tuned per trace;
the queue rule was added after ten seeds showed the shield cost S-S, a trace that
queues, 3.7% of P99 decode at its lower rate (``benchmarks/sim/beyond.md``).
"""
from __future__ import annotations

from llumnix.core.status import InstanceStatus
from llumnix.policy.freeness import fits_now

MIN_PROMPT_TOKENS = 512
"""Prompts at least this long get the shield (prefill about 110 ms on the A10 model)."""
SLACK = 0.5
"""Candidates within this much of the best normalised freeness score are eligible."""
YOUNG_TOKENS = 64
"""Requests with fewer output tokens than this count as young (possibly short)."""
MIN_FREE_FRACTION = 0.2
"""The shield is on only while the candidates have at least this fraction of their blocks free."""


def is_loaded(cands: list[InstanceStatus]) -> bool:
    """A queue somewhere, or too little free memory across the candidates, to trade any
    of the freeness's balance for stalls."""
    if any(s.num_waiting for s in cands):
        return True
    free = sum(s.num_free_blocks for s in cands)
    return free < MIN_FREE_FRACTION * sum(s.num_total_blocks for s in cands)


def stall_harm(status: InstanceStatus) -> float:
    """Expected per-token damage a prefill here does, in units of one stall (see above)."""
    return sum(1.0 / max(r.num_output_tokens, 1) for r in status.running
               if r.num_output_tokens < YOUNG_TOKENS)


def shield_pick(cands: list[InstanceStatus], scores: list[float], num_prompt_tokens: int | None,
                ) -> InstanceStatus:
    """The candidate to dispatch to (``cands`` sorted by id, ``scores`` in [0, 1] or summed)."""
    best = max(scores)
    freest = cands[scores.index(best)]  # what max-score picks: the first best
    if num_prompt_tokens is None or num_prompt_tokens < MIN_PROMPT_TOKENS or is_loaded(cands):
        return freest
    eligible = [(stall_harm(s), -v, k) for k, (s, v) in enumerate(zip(cands, scores, strict=True))
                if v >= best - SLACK and fits_now(s, num_prompt_tokens)]
    return cands[min(eligible)[2]] if eligible else freest
