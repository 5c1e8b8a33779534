"""A request's state inside one engine: token lists and progress counters.

Progress is counters, not phase flags: a step computes the tokens from
``num_computed_tokens`` up to ``num_tokens`` and appends one sampled token.
A fresh or recompute-preempted request has ``num_computed_tokens == 0`` (a
prefill); a decoding one is exactly one token behind.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

from llumnix.core.sampling_params import SamplingParams


class Priority(enum.IntEnum):
    """Scheduling/execution priority levels; higher value is served first."""

    NORMAL = 0
    HIGH = 1


class RequestStatus(enum.IntEnum):
    """Ordered so that ``status > PAUSED`` means finished."""

    WAITING = 0
    RUNNING = 1
    PAUSED = 2  # out of the batch for a migration's last stage; blocks kept
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6  # a step failed on this request (see EngineCore.step); blocks freed

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PAUSED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = Priority.NORMAL
    seed: int = 0
    """The resolved seed of the request's random stream (see model/sampler)."""
    eos_token_id: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    # Timing and accounting, in the engine clock's seconds.
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0
    """Prompt tokens whose KV the prefix cache held at the first admission (not computed)."""
    num_preemptions: int = 0
    preemption_loss: float = 0.0
    """Seconds from each preemption until the recompute finished, summed."""
    preempted_at: float | None = None
    num_migrations: int = 0
    """Live migrations committed (counted where the request is installed)."""
    client: str = ""
    """Opaque tag of the consumer of this request's outputs (a gateway's id): outputs
    carry it, so each gateway reads only its own; it travels with the request when it
    migrates."""
    epoch: int = 0
    """Fencing token, bumped by the gateway each time it resumes the request after an
    instance failure; outputs carry it. An output of an older epoch comes from a copy
    that must not exist (say a migration that committed as its source died), and the
    gateway stops that copy."""
    slo_class: str = ""
    """The request's SLO class by name, resolved once where it enters (named by the client
    or the trace, else its priority's: ``EngineCore.add_request``); "": none. It travels
    with the request when it migrates, and engines order their queues by its objectives
    (``engine/objectives.py``)."""
    is_overdue: bool = False
    """Queued past its time-to-first-token objective (``engine/objectives.py``):
    served after every queued request that is not, and preempted first."""
    can_stop_on_token: bool = field(init=False, repr=False, compare=False)
    """Whether a sampled token can end the request (EOS unless ignored, a stop token id, a
    stop string); if not, only its length does, and the engine's per-token check is one
    test (``EngineCore.update``)."""

    def __post_init__(self) -> None:
        p = self.sampling_params
        self.can_stop_on_token = bool((self.eos_token_id is not None and not p.ignore_eos)
                                      or p.stop_token_set or p.stop)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next step must compute for this request."""
        return self.num_tokens - self.num_computed_tokens

    @cached_property
    def banned_under_min_tokens(self) -> tuple[int, ...]:
        """The tokens masked out of sampling until ``min_tokens`` are out: EOS (unless
        ignored) and the stop token ids. Made once per request, not at every step."""
        p = self.sampling_params
        eos = () if self.eos_token_id is None or p.ignore_eos else (self.eos_token_id,)
        return (*eos, *sorted(p.stop_token_set))

    def new_token_ids(self) -> list[int]:
        """The tokens from num_computed_tokens on, without copying the whole sequence."""
        start = self.num_computed_tokens
        n_prompt = len(self.prompt_token_ids)
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:]
        return self.prompt_token_ids[start:] + self.output_token_ids

    @property
    def is_prefill(self) -> bool:
        return self.num_new_tokens > 1 or self.num_computed_tokens == 0

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.sampling_params.max_tokens
