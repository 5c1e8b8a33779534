"""A response's ``n`` choices, each an engine request of its own (served, and possibly
migrated, on its own): making them, running one into text steps with its metrics, and
merging the n streams."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import NamedTuple

from llumnix.core.batch import RequestMetrics, RequestOutput
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest
from llumnix.gateway.context import GatewayContext
from llumnix.gateway.detokenizer import IncrementalDetokenizer
from llumnix.gateway.formatting import TokenLogprob
from llumnix.gateway.request_log import FinishedRequest
from llumnix.policy.slo_dispatch import RequestShedError


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
    def model(self) -> str:
        """The model the request named where it is not the served one (a pool's), else ''."""
        return self.gens[0].model

    @property
    def wants_logprobs(self) -> bool:
        return self.gens[0].params.logprobs is not None


def make_choices(response_id: str, prompt_ids: list[int], params: SamplingParams, n: int,
                 priority: int, arrival_time: float, final_only: bool = False,
                 slo_class: str | None = None) -> list[GenerateRequest]:
    """One engine request per choice; with a seed, choice i samples with seed + i."""
    if n == 1:
        return [GenerateRequest(response_id, prompt_ids, params, priority, arrival_time, final_only=final_only,
                                slo_class=slo_class)]
    return [GenerateRequest(f"{response_id}-{i}", prompt_ids,
                            params if params.seed is None else dataclasses.replace(params, seed=params.seed + i),
                            priority, arrival_time, final_only=final_only, slo_class=slo_class)
            for i in range(n)]


def _new_logprobs(out: RequestOutput) -> list[TokenLogprob]:
    tops = out.new_top_logprobs
    return [(t, lp, tops[j] if tops else None)
            for j, (t, lp) in enumerate(zip(out.new_token_ids, out.new_logprobs or (), strict=False))]


class _Progress:
    """When a request's outputs came (the gateway's clock), observing TTFT and inter-token
    latency as they come and counting tokens for the throughput line."""

    __slots__ = ("ctx", "gen", "first", "last", "last_token")

    def __init__(self, ctx: GatewayContext, gen: GenerateRequest) -> None:
        self.ctx, self.gen = ctx, gen
        self.first: float | None = None
        self.last: float | None = None
        self.last_token: float | None = None

    def on_output(self, out: RequestOutput) -> None:
        self.last = now = time.monotonic()
        metrics, rlog, k = self.ctx.metrics, self.ctx.request_log, len(out.new_token_ids)
        if self.first is None:
            self.first = now
            m = out.metrics
            if self.gen.final_only and m is not None and m.ttft is not None and k > 1:
                # Sent whole at its end: the first token's time is the engine's, and the k
                # tokens' k - 1 gaps share the decode time evenly.
                self.first = min(now, self.gen.arrival_time + m.ttft)
                metrics.itl.observe((now - self.first) / (k - 1), k - 1)
            metrics.ttft.observe(self.first - self.gen.arrival_time)
            rlog.num_prompt_tokens += len(self.gen.prompt_token_ids)
        elif k and self.last_token is not None:
            metrics.itl.observe((now - self.last_token) / k, k)  # outputs that carry k tokens: k gaps
        if k:
            self.last_token = now
            rlog.num_generation_tokens += k

    def finished(self, step: Step, m: RequestMetrics | None) -> None:
        gen, first, last = self.gen, self.first, self.last
        n_prompt = len(gen.prompt_token_ids)
        ttft = None if first is None else first - gen.arrival_time
        e2e = None if last is None else last - gen.arrival_time
        decode = None if first is None or last is None else last - first
        self.ctx.metrics.observe_finished(m, n_prompt, step.num_output_tokens, ttft, decode, e2e)
        n_out = step.num_output_tokens
        tpot = decode / (n_out - 1) if decode is not None and n_out > 1 else None
        cls = self.ctx.config.slo.resolve(gen.slo_class, gen.priority)
        self.ctx.metrics.observe_slo(cls.name, cls.is_met(ttft, tpot))
        self.ctx.metrics.params_max_tokens.observe(gen.params.max_tokens)
        self.ctx.request_log.on_finished(FinishedRequest(
            gen.request_id, m.instance_id if m else "", n_prompt, step.num_cached_tokens,
            step.num_output_tokens, step.finish_reason or "", ttft, e2e,
            None if m is None else m.queue_time, m.num_migrations if m else 0, gen.slo_class))


@asynccontextmanager
async def _place(ctx: GatewayContext, gen: GenerateRequest) -> AsyncIterator[Callable[[int], None]]:
    """The choice's place in the fair share (waited for), when the gateway keeps one."""
    if ctx.fair is None:
        yield lambda _k: None
        return
    async with ctx.fair.slot(gen) as served:
        yield served


async def run_choice(ctx: GatewayContext, gen: GenerateRequest) -> AsyncIterator[Step]:
    """The request's steps (those that add text or logprobs, and the last), keeping the
    metrics; a request left unfinished (client gone, or an error) is aborted, freeing its KV."""
    metrics, backend, rlog = ctx.metrics, ctx.backend, ctx.request_log
    det = IncrementalDetokenizer(backend.tokenizer, gen.params.stop, gen.params.min_tokens)
    metrics.labels(metrics.in_flight).inc()
    rlog.ensure_running(backend.cluster_info)
    rlog.num_in_flight += 1
    progress = _Progress(ctx, gen)
    step: Step | None = None
    final: RequestMetrics | None = None
    want_lp = gen.params.logprobs is not None
    n_cached = 0
    engine_done = False
    placed = True
    try:
        async with _place(ctx, gen) as served:
            async for out in backend.generate(gen):
                served(len(out.new_token_ids))
                engine_done = out.is_finished
                progress.on_output(out)
                text = det.add(out.new_token_ids, final=out.is_finished)
                reason = out.finish_reason
                if det.stopped and reason is None:
                    reason = "stop"  # the stop string completed before the engine saw it
                if out.metrics is not None:
                    final = out.metrics
                    n_cached = final.num_cached_tokens
                step = Step(text, reason, out.num_output_tokens, _new_logprobs(out) if want_lp else [],
                            out.prompt_logprobs, n_cached)
                if reason is not None:
                    yield step
                    metrics.labels(metrics.requests, reason).inc()
                    break
                if text or step.logprobs or step.prompt_logprobs is not None:
                    yield step
    except RequestShedError:
        placed = False  # refused by dispatch: no instance has it (and the 429 goes out at once)
        raise
    finally:
        metrics.labels(metrics.in_flight).dec()
        rlog.num_in_flight -= 1
        if step is None or step.finish_reason is None:
            metrics.labels(metrics.aborted).inc()
            if placed:
                await backend.abort(gen.request_id)
        else:
            if not engine_done:  # the stop string was seen here first: the engine's copy still runs
                await backend.abort(gen.request_id)
            progress.finished(step, final)


async def merge_choices(ctx: GatewayContext, gens: list[GenerateRequest]) -> AsyncIterator[tuple[int, Step]]:
    """Every choice's steps as they come, tagged with the choice's index. If one choice
    fails, or the consumer stops (the client left), the others are stopped too: each
    one's ``run_choice`` then aborts its request and frees its KV."""
    ctx.metrics.params_n.observe(len(gens))
    if len(gens) == 1:  # no task or queue in the common case
        async for item in run_choice(ctx, gens[0]):
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Step | BaseException | None]] = asyncio.Queue()
    started = [False] * len(gens)

    async def pump(i: int, gen: GenerateRequest) -> None:
        started[i] = True
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
        for _ in range(started.count(False)):  # the client left before this choice began:
            ctx.metrics.labels(ctx.metrics.aborted).inc()  # aborted too, though nothing ran
