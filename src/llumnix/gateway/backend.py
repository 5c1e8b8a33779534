"""What the gateway needs from whatever serves requests: one engine in this
process, or a Llumnix cluster of instances behind LlumSched."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from llumnix.core.batch import RequestOutput
from llumnix.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    admit_by: float | None = None
    """Wall-clock time after which an instance refuses this request when LlumSched
    forwards it: a gateway that stopped waiting for LlumSched by then places the request
    itself, so a late forward must not start a second copy."""
    client: str = ""
    """The gateway whose outbox gets this request's outputs (``Request.client``)."""
    epoch: int = 0
    """How many times the gateway has resumed it after an instance failure (``Request.epoch``)."""


class TokenizerLike(Protocol):
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str: ...


class Backend(Protocol):
    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: TokenizerLike

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise an InvalidRequestError for a request no instance could ever serve."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs in order, whichever instance produces them."""

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> dict[str, Any]: ...

    async def cluster_info(self) -> dict[str, Any]: ...

    async def drain_instance(self, instance_id: str) -> dict[str, Any]: ...
