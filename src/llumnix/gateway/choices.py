"""A response's ``n`` choices, each an engine request of its own (served, and possibly
migrated, on its own): making them, running one into text steps with its metrics, and
merging the n streams."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NamedTuple

from llumnix.core.batch import RequestOutput
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest
from llumnix.gateway.context import GatewayContext
from llumnix.gateway.detokenizer import IncrementalDetokenizer
from llumnix.gateway.formatting import TokenLogprob


class Step(NamedTuple):
    """What one engine output adds to a choice."""

    text: str
    finish_reason: str | None
    num_output_tokens: int
    """Output tokens so far."""
    logprobs: list[TokenLogprob]
    """Of the new tokens, when asked for."""
    prompt_logprobs: list[TokenLogprob] | None
    """On the first step, when asked for: the prompt's tokens after the first, with theirs."""
    num_cached_tokens: int
    """Prompt tokens the prefix cache served."""


@dataclass(frozen=True)
class Reply:
    """A response under way: its id, one engine request per choice, and the shape asked for."""

    response_id: str
    gens: list[GenerateRequest]
    chat: bool
    stream: bool = False
    prefix: str = ""
    """Text every choice starts with: an echoed prompt."""
    as_ids: bool = False
    echo_only: bool = False
    """OpenAI's scoring form (echo, max_tokens 0): the answer is the prompt and its
    logprobs; the one token the engine generated to get there is left out."""
    include_usage: bool = False
    """Streamed: end with a chunk that has the usage and no choices."""

    @property
    def wants_logprobs(self) -> bool:
        return self.gens[0].params.logprobs is not None


def make_choices(response_id: str, prompt_ids: list[int], params: SamplingParams, n: int,
                 priority: int, arrival_time: float) -> list[GenerateRequest]:
    """One engine request per choice; with a seed, choice i samples with seed + i."""
    if n == 1:
        return [GenerateRequest(response_id, prompt_ids, params, priority, arrival_time)]
    return [GenerateRequest(f"{response_id}-{i}", prompt_ids,
                            params if params.seed is None else dataclasses.replace(params, seed=params.seed + i),
                            priority, arrival_time)
            for i in range(n)]


def _new_logprobs(out: RequestOutput) -> list[TokenLogprob]:
    tops = out.new_top_logprobs
    return [(t, lp, tops[j] if tops else None)
            for j, (t, lp) in enumerate(zip(out.new_token_ids, out.new_logprobs or (), strict=False))]


async def run_choice(ctx: GatewayContext, gen: GenerateRequest) -> AsyncIterator[Step]:
    """The request's steps (those that add text or logprobs, and the last), keeping the
    metrics; a request left unfinished (client gone, or an error) is aborted, freeing its KV."""
    metrics, backend = ctx.metrics, ctx.backend
    det = IncrementalDetokenizer(backend.tokenizer, gen.params.stop, gen.params.min_tokens)
    metrics.labels(metrics.in_flight).inc()
    first = last = None
    step: Step | None = None
    want_lp = gen.params.logprobs is not None
    n_cached = 0
    try:
        async for out in backend.generate(gen):
            last = time.monotonic()
            if first is None:
                first = last
                metrics.labels(metrics.ttft).observe(first - gen.arrival_time)
            text = det.add(out.new_token_ids, final=out.is_finished)
            reason = out.finish_reason
            if det.stopped and reason is None:
                reason = "stop"  # the stop string completed before the engine saw it
            if out.metrics is not None:
                n_cached = out.metrics.num_cached_tokens
            step = Step(text, reason, out.num_output_tokens, _new_logprobs(out) if want_lp else [],
                        out.prompt_logprobs, n_cached)
            if reason is not None:
                yield step
                metrics.requests.labels(model_name=ctx.model_name, finished_reason=reason).inc()
                break
            if text or step.logprobs or step.prompt_logprobs is not None:
                yield step
    finally:
        metrics.labels(metrics.in_flight).dec()
        if step is None or step.finish_reason is None:
            metrics.labels(metrics.aborted).inc()
            await backend.abort(gen.request_id)
        else:
            _record_finished(ctx, gen, step, first, last)


def _record_finished(ctx: GatewayContext, gen: GenerateRequest, step: Step,
                     first: float | None, last: float | None) -> None:
    m, n_out = ctx.metrics, step.num_output_tokens
    m.labels(m.prompt_tokens).inc(len(gen.prompt_token_ids))
    m.labels(m.prompt_tokens_cached).inc(step.num_cached_tokens)
    m.labels(m.generation_tokens).inc(n_out)
    if first is not None and last is not None:
        m.labels(m.e2e).observe(last - gen.arrival_time)
        if n_out > 1:
            m.labels(m.tpot).observe((last - first) / (n_out - 1))


async def merge_choices(ctx: GatewayContext, gens: list[GenerateRequest]) -> AsyncIterator[tuple[int, Step]]:
    """Every choice's steps as they come, tagged with the choice's index. If one choice
    fails, or the consumer stops (the client left), the others are stopped too: each
    one's ``run_choice`` then aborts its request and frees its KV."""
    if len(gens) == 1:  # no task or queue in the common case
        async for item in run_choice(ctx, gens[0]):
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Step | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, gen: GenerateRequest) -> None:
        try:
            async for item in run_choice(ctx, gen):
                queue.put_nowait((i, item))
            queue.put_nowait((i, None))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            queue.put_nowait((i, e))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(tasks)
        while left:
            i, got = await queue.get()
            if got is None:
                left -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield i, got
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
