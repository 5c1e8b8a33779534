"""Per-request sampling parameters, vLLM/OpenAI field names."""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    """Most output tokens to generate."""
    temperature: float = 0.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 or -1 disables."""
    seed: int | None = None
    """Seed of the request's random stream; None lets the engine draw one."""
    stop: tuple[str, ...] = ()
    """Stop strings; the output is cut before the first match."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end generation (kept in the output, like EOS)."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks use this for fixed output lengths)."""
    logprobs: int | None = None
    """Return the log-probability of each sampled token and this many top alternatives."""
    prompt_logprobs: int | None = None
    """Return the log-probability of each prompt token after the first (under the tokens
    before it) and this many top alternatives; computed once, at the first prefill."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be an integer >= 1", "max_tokens")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError("temperature must be in [0, 2]", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise InvalidRequestError("top_k must be -1, 0 or a positive integer", "top_k")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError("logprobs must be in [0, 20]", "logprobs")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise InvalidRequestError("prompt_logprobs must be in [0, 20]", "prompt_logprobs")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings", "stop")
        if len(self.stop) > 4:
            raise InvalidRequestError("at most 4 stop strings", "stop")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
