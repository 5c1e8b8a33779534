"""Helpers of ``LiteBackend``'s request path: a finished request's usage as checked
against what was streamed, its metrics, and the continuation of a request resumed
mid-stream."""
from __future__ import annotations

import dataclasses
import time

from llumnix.core.batch import RequestMetrics
from llumnix.core.wire import GenerateRequest
from llumnix.lite.client import Chunk


def continuation(request: GenerateRequest, sent: list[int], n_sent: int) -> GenerateRequest:
    """The rest of a request whose endpoint failed mid-stream: its prompt and the output
    released so far as the new prompt (a recompute, as full mode resumes a lost instance's
    requests), for the tokens it has left. Greedy output goes on as it would have;
    sampled output goes on as a valid sample."""
    p = request.params
    left = max(1, p.max_tokens - n_sent)
    params = dataclasses.replace(p, max_tokens=left, min_tokens=min(left, max(0, p.min_tokens - n_sent)))
    return dataclasses.replace(request, prompt_token_ids=[*request.prompt_token_ids, *sent], params=params)


def finished_metrics(request: GenerateRequest, n_out: int, n_cached: int) -> RequestMetrics:
    """What the gateway reads of a finished request's metrics (it times the rest itself)."""
    return RequestMetrics(arrival_time=request.arrival_time, first_scheduled_time=None, first_token_time=None,
                          finish_time=time.monotonic(), num_prompt_tokens=len(request.prompt_token_ids),
                          num_output_tokens=n_out, num_preemptions=0, preemption_loss=0.0,
                          priority=request.priority, num_cached_tokens=n_cached)


def checked_usage(final: Chunk, num_streamed: int, max_tokens: int, num_prompt: int) -> tuple[int, int, str]:
    """(output tokens, cached tokens, what was wrong): the engine's usage where it is
    possible (integers; at least the tokens streamed, at most ``max_tokens``; cached at
    most the prompt), else what the gateway saw and why the engine's figure was not taken."""
    n, cached = final.num_completion_tokens, final.num_cached_tokens or 0
    if final.usage_error:
        return num_streamed, 0, f"usage: {final.usage_error}"
    if n is None:
        return num_streamed, 0, ""  # no usage sent (llama.cpp's server): what was streamed
    if not num_streamed <= n <= max_tokens:
        return num_streamed, 0, (f"usage: completion_tokens {n} is impossible ({num_streamed} streamed, "
                                 f"max_tokens {max_tokens})")
    if not 0 <= cached <= num_prompt:
        return n, 0, f"usage: cached_tokens {cached} is impossible (the prompt has {num_prompt})"
    return n, cached, ""
