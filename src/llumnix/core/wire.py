"""What crosses from the HTTP gateway to whatever serves requests (one engine in this
process, or a cluster of instances): the request, and the tokenizer both sides use."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llumnix.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    """When the gateway took it, on the gateway's monotonic clock (``wall_arrival`` for dispatch)."""
    admit_by: float | None = None
    """Wall-clock time after which an instance refuses this request when LlumSched
    forwards it: a gateway that stopped waiting for LlumSched by then places the request
    itself, so a late forward must not start a second copy."""
    client: str = ""
    """The gateway whose outbox gets this request's outputs (``Request.client``)."""
    epoch: int = 0
    """How many times the gateway has resumed it after an instance failure (``Request.epoch``)."""
    model: str = ""
    """The model the client named, where it is not the served one ("": the served model);
    a backend that serves several routes by it."""
    slo_class: str | None = None
    """The SLO class the client named (``slo_class`` / ``X-SLO-Class``; None: its priority's)."""
    final_only: bool = False
    """The consumer reads only the finished output (a response answered whole): an
    instance may merge the request's outputs and send them once, at its end, or when it
    leaves that instance (vLLM's ``FINAL_ONLY``). A hint: outputs sent token by token are
    read the same way."""


def wall_arrival(request: GenerateRequest, now: float | None = None) -> float:
    """``request``'s arrival on the wall clock that dispatch runs on (``now``: the wall
    clock's reading, if the caller has one): the gateway stamps arrivals on its monotonic
    clock, which means nothing to another process's."""
    import time

    now = time.time() if now is None else now
    return now - (time.monotonic() - request.arrival_time)


class TokenizerLike(Protocol):
    eos_token_id: int | None

    @property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of text one token covers (a text of B bytes has at least
        B / this many tokens), or None where no such bound holds."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str: ...

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """The token ids a chat prefills, special-token text inside messages encoded as
        plain text (only the template's own markers are control tokens)."""

    def warm_up(self) -> None:
        """Build what serving needs now, before requests come (not on the event loop)."""
