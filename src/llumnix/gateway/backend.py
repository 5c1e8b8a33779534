"""What the gateway needs from whatever serves requests: one engine in this
process, or a Llumnix cluster of instances behind LlumSched."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from llumnix.core.batch import RequestOutput
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest, TokenizerLike


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

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        """Undo a drain: the instance takes requests again."""


def model_names(backend: Backend) -> list[str]:
    """The model names a client may ask for: a backend that serves several lists them
    (``model_names``, the served model first), else its one ``model_name``."""
    names: list[str] | None = getattr(backend, "model_names", None)
    return list(names) if names else [backend.model_name]


def serves_model(backend: Backend, name: str) -> bool:
    """Whether a request naming ``name`` is the backend's: a backend that serves several
    answers (``serves_model``; pools match names and prefixes), else only the served name."""
    check = getattr(backend, "serves_model", None)
    return bool(check(name)) if check is not None else name == backend.model_name
