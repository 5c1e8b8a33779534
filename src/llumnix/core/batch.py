"""The contract between the local scheduler, the executor and the update phase.

``SchedulerOutput`` says what to compute, ``ModelOutput`` says what was
sampled, and ``EngineCore.update`` joins them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llumnix.core.request import Request
from llumnix.core.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledRequest:
    request_id: str
    token_ids: list[int]
    """The tokens to compute this step: positions start_pos .. start_pos+len-1."""
    start_pos: int
    block_ids: list[int]
    """The request's block table, covering at least start_pos + len(token_ids) slots."""
    sampling_params: SamplingParams
    seed: int
    output_index: int
    """Index of the token about to be sampled; with ``seed`` it fixes the random draw."""
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    """The request's whole sequence so far (live lists, read by the penalties before the
    step's token is appended; left empty where no sampler reads them)."""
    banned_token_ids: tuple[int, ...] = ()
    """Tokens this step may not sample: EOS and the stop token ids while the output is
    shorter than ``min_tokens``."""
    sample: bool = True
    """False for a chunk of a prefill that does not reach the sequence's end (chunked
    prefill): its KV is written, no token is sampled, and the executor returns
    ``NO_TOKEN`` in its place."""

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


NO_TOKEN = -1
"""The sampled token of an entry that samples none (``ScheduledRequest.sample`` False)."""


@dataclass(slots=True)
class DecodeBatch:
    """A decode step's requests, as the scheduler left them: every one computes its last
    token and samples. Its ``ScheduledRequest`` entries are built from this only when an
    executor reads ``SchedulerOutput.scheduled``; an executor that needs only the batch's
    size and context (the simulator's latency model) never builds one per request per step.
    The counts are taken at scheduling, so the entries are those of that moment even if
    built later (the block tables are the live ones, as in every entry)."""

    requests: list[Request]
    tables: list[list[int]]
    starts: list[int]
    """Each request's ``num_computed_tokens``: its entry's ``start_pos``."""
    num_outputs: list[int]
    """Each request's output tokens: its entry's ``output_index``."""
    num_context_tokens: int = field(init=False, repr=False, compare=False)
    """Context tokens of the step: each request's ``start_pos`` plus the one it computes
    (a field set when built: the latency model reads it at every step, and CPython 3.11
    runs a property's getter in a C frame of its own)."""

    def __post_init__(self) -> None:
        self.num_context_tokens = sum(self.starts) + len(self.starts)

    def entries(self) -> list[ScheduledRequest]:
        out: list[ScheduledRequest] = []
        for req, table, start, n_out in zip(self.requests, self.tables, self.starts, self.num_outputs, strict=True):
            p = req.sampling_params
            prompt, outs = req.prompt_token_ids, req.output_token_ids
            n_prompt = len(prompt)
            tokens = outs[start - n_prompt:n_out] if start >= n_prompt else prompt[start:] + outs[:n_out]
            banned = req.banned_under_min_tokens if n_out < p.min_tokens else ()
            out.append(ScheduledRequest(req.request_id, tokens, start, table, p, req.seed, n_out, prompt, outs,
                                        banned, True))
        return out


@dataclass(slots=True, init=False)
class SchedulerOutput:
    """One step's work. Treated as immutable; slotted, not frozen, as ``ScheduledRequest``
    and ``RequestOutput``: one is built per step, and a frozen one costs three times as much.
    A decode step of the paper's engine carries its ``DecodeBatch`` and builds ``scheduled``
    from it when first read."""

    is_prefill: bool
    """The step computes a prefill (or a chunk of one); with ``is_mixed``, beside decodes."""
    preempted_request_ids: list[str]
    num_decodes: int
    """With chunked prefill, how many entries are decodes (one token each); they come
    first in ``scheduled``. Without it a step is all prefill or all decode and this is 0."""
    decode: DecodeBatch | None
    is_empty: bool = field(repr=False, compare=False)
    """No entries: set when built, as the entries do not change (read at every step; a
    field, as CPython 3.11 runs a property's getter in a C frame of its own)."""
    _scheduled: list[ScheduledRequest] | None = field(repr=False, compare=False)

    def __init__(self, scheduled: list[ScheduledRequest] | None, is_prefill: bool,
                 preempted_request_ids: list[str] | None = None, num_decodes: int = 0,
                 decode: DecodeBatch | None = None) -> None:
        if (scheduled is None) == (decode is None):
            raise ValueError("a SchedulerOutput has either its entries or a DecodeBatch")
        self._scheduled = scheduled
        self.is_prefill = is_prefill
        self.preempted_request_ids = [] if preempted_request_ids is None else preempted_request_ids
        self.num_decodes = num_decodes
        self.decode = decode
        self.is_empty = not (decode.requests if decode is not None else scheduled)

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        if self._scheduled is None:
            assert self.decode is not None
            self._scheduled = self.decode.entries()
        return self._scheduled

    @property
    def request_ids(self) -> list[str]:
        """The entries' request ids, in order (without building a decode step's entries)."""
        if self.decode is not None:
            return [r.request_id for r in self.decode.requests]
        return [r.request_id for r in self.scheduled]

    @property
    def num_entries(self) -> int:
        return len(self.decode.requests) if self.decode is not None else len(self.scheduled)

    @property
    def is_mixed(self) -> bool:
        """Prefill chunks and decodes in one step (chunked prefill)."""
        return self.is_prefill and self.num_decodes > 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.scheduled)

    def halves(self) -> tuple[SchedulerOutput, SchedulerOutput]:
        """The first and second half of the entries as batches of their own (decodes stay
        first in each), for finding which entries a failed step concerns."""
        mid = len(self.scheduled) // 2
        parts = []
        for entries, num_decodes in ((self.scheduled[:mid], min(self.num_decodes, mid)),
                                     (self.scheduled[mid:], max(0, self.num_decodes - mid))):
            parts.append(SchedulerOutput(entries, self.is_prefill and len(entries) > num_decodes,
                                         num_decodes=num_decodes))
        return parts[0], parts[1]


def decode_output(requests: list[Request], tables: list[list[int]], starts: list[int], num_outputs: list[int],
                  preempted_request_ids: list[str]) -> SchedulerOutput:
    """``SchedulerOutput(None, False, preempted_request_ids, decode=DecodeBatch(requests,
    tables, starts, num_outputs))``, a decode step of the paper's engine (every step but
    the prefills), with every field written here instead of calling the two classes (see
    ``token_output``; ``tests/core/test_builders.py`` holds it equal to the class calls)."""
    decode: DecodeBatch = object.__new__(DecodeBatch)
    decode.requests = requests
    decode.tables = tables
    decode.starts = starts
    decode.num_outputs = num_outputs
    decode.num_context_tokens = sum(starts) + len(starts)
    out: SchedulerOutput = object.__new__(SchedulerOutput)
    out._scheduled = None
    out.is_prefill = False
    out.preempted_request_ids = preempted_request_ids
    out.num_decodes = 0
    out.decode = decode
    out.is_empty = not requests
    return out


PromptLogprob = tuple[int, float, list[tuple[int, float]] | None]
"""A prompt token, its logprob under the tokens before it, and (when asked for) the most
likely tokens at its position with their logprobs, most likely first."""


@dataclass(slots=True)
class ModelOutput:
    """What one step computed (treated as immutable; slotted, not frozen, as
    ``SchedulerOutput``)."""

    sampled_token_ids: list[int]
    """One token per scheduled request, in the order of SchedulerOutput.scheduled
    (``NO_TOKEN`` for an entry that samples none)."""
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per scheduled request, the most likely tokens and their logprobs (as many as the
    batch's largest ``logprobs`` asks for), when any request asked for alternatives."""
    elapsed: float | None = None
    """Seconds the step took, when the executor knows (the simulator's latency model)."""
    prompt_logprobs: list[list[PromptLogprob] | None] | None = None
    """Per scheduled request, when some request's first prefill asked for them (and the
    executor computes them): its prompt tokens after the first with their logprobs."""


def timed_output(sampled_token_ids: list[int], elapsed: float) -> ModelOutput:
    """``ModelOutput(sampled_token_ids, elapsed=elapsed)``, what a modelled step returns
    (the simulator's executor, once per step), with every field written here instead of
    calling the class (see ``token_output``; ``tests/core/test_builders.py``)."""
    out: ModelOutput = object.__new__(ModelOutput)
    out.sampled_token_ids = sampled_token_ids
    out.logprobs = None
    out.top_logprobs = None
    out.elapsed = elapsed
    out.prompt_logprobs = None
    return out


@dataclass(frozen=True)
class RequestMetrics:
    """Timing of a finished request, in the engine clock's seconds."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    preemption_loss: float
    priority: int
    num_cached_tokens: int = 0
    """Prompt tokens whose KV the prefix cache held at the first admission."""
    instance_id: str = ""
    """The instance that finished the request."""
    num_migrations: int = 0
    """Live migrations the request went through (committed)."""

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival at the instance to the first admission (vLLM's queue time)."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def decode_per_token(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)


@dataclass(slots=True)
class RequestOutput:
    """What a step produced for one request: the stream the gateway forwards.

    Per-step messages (this and ScheduledRequest) are slotted, not frozen: one is built
    per request per step, and a frozen dataclass costs five times as much to build."""

    request_id: str
    new_token_ids: list[int]
    num_output_tokens: int
    finish_reason: str | None = None
    new_logprobs: list[float] | None = None
    stop_reason: int | str | None = None
    metrics: RequestMetrics | None = None
    """Set on the output that finishes the request."""
    client: str = ""
    """The request's consumer tag (``Request.client``): which outbox it goes to."""
    epoch: int = 0
    """The request's fencing token (``Request.epoch``)."""
    new_top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per new token, its ``SamplingParams.logprobs`` most likely alternatives (token id,
    logprob), most likely first; None unless alternatives were asked for."""
    prompt_logprobs: list[PromptLogprob] | None = None
    """On a request's first output, when ``SamplingParams.prompt_logprobs`` asked for them:
    each prompt token after the first with its logprob (and alternatives)."""
    error: str | None = None
    """With finish reason ``"error"``: why the engine ended the request (one line)."""

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def then(self, later: RequestOutput) -> RequestOutput:
        """This output followed by ``later`` (the same request's next) as one: what a
        consumer that fell behind forwards, one chunk instead of several."""
        def cat(a: list[Any] | None, b: list[Any] | None) -> list[Any] | None:
            return None if a is None and b is None else [*(a or ()), *(b or ())]

        return RequestOutput(self.request_id, [*self.new_token_ids, *later.new_token_ids], later.num_output_tokens,
                             later.finish_reason, cat(self.new_logprobs, later.new_logprobs), later.stop_reason,
                             later.metrics, later.client, later.epoch,
                             cat(self.new_top_logprobs, later.new_top_logprobs),
                             self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs,
                             later.error)


def token_output(request_id: str, token: int, num_output_tokens: int, finish_reason: str | None,
                 stop_reason: int | str | None, metrics: RequestMetrics | None, client: str,
                 epoch: int) -> RequestOutput:
    """``RequestOutput(request_id, [token], num_output_tokens, finish_reason, None,
    stop_reason, metrics, client, epoch)``: one sampled token without logprobs, what a
    decode step gives each request. Every field is written here instead of calling the
    class: in CPython 3.11 a class call goes through ``type.__call__`` and runs
    ``__init__`` in an interpreter frame of its own, a function call does not (one output
    per request per step: the simulator's most built object). ``tests/core/
    test_builders.py`` holds it equal to the class call and fails when a field is added
    and not written here."""
    out: RequestOutput = object.__new__(RequestOutput)
    out.request_id = request_id
    out.new_token_ids = [token]
    out.num_output_tokens = num_output_tokens
    out.finish_reason = finish_reason
    out.new_logprobs = None
    out.stop_reason = stop_reason
    out.metrics = metrics
    out.client = client
    out.epoch = epoch
    out.new_top_logprobs = None
    out.prompt_logprobs = None
    out.error = None
    return out


class Executor(Protocol):
    """Runs one scheduled batch. The model executor runs a network; the
    simulator's returns placeholder tokens and a modelled latency."""

    def execute(self, batch: SchedulerOutput) -> ModelOutput: ...


class KVBlockIO(Protocol):
    """Moves KV blocks in and out of an executor's cache, for migration."""

    @property
    def bytes_per_block(self) -> int: ...

    def gather_blocks(self, block_ids: list[int]) -> bytes | memoryview: ...

    def scatter_blocks(self, block_ids: list[int], data: bytes | memoryview) -> None: ...
