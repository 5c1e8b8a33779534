"""Per-request sampling parameters, vLLM/OpenAI field names."""
from __future__ import annotations

from dataclasses import dataclass, field

from llumnix.core.errors import InvalidRequestError

# A request's work budget (docs/serving.md, "Bounds"): every field whose size multiplies the
# work of an engine step or of the gateway is bounded, so no request buys more than its share.
MAX_LOGIT_BIAS = 1024
"""Most tokens one request's ``logit_bias`` may name."""
MAX_STOP_TOKEN_IDS = 1024
"""Most ``stop_token_ids`` one request may name (each step masks them while under
``min_tokens``)."""
MAX_STOP_STRINGS = 4
"""Most stop strings (OpenAI's limit)."""
MAX_STOP_CHARS = 256
"""Longest stop string, in characters: every step decodes a window of the output as long
as the longest one."""
GREEDY_BELOW = 1e-5
"""A temperature under this samples greedily: logits divided by it overflow float32."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    """Most output tokens to generate."""
    min_tokens: int = 0
    """Fewest output tokens (vLLM's): until there are this many, EOS and the stop token ids
    are masked out of sampling, and no stop string ends the output."""
    temperature: float = 0.0
    """0 means greedy; so does anything below ``GREEDY_BELOW`` (vLLM's rule), where dividing
    the logits by it overflows."""
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
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the output already holds (OpenAI's; in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the output holds it (OpenAI's; in [-2, 2])."""
    repetition_penalty: float = 1.0
    """The logit of every token in the prompt or the output is divided by this when positive
    and multiplied by it when negative (vLLM's and transformers'; in (0, 2], 1 is off)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling (OpenAI's; bias in [-100, 100])."""
    stop_token_set: frozenset[int] = field(init=False, repr=False, compare=False)
    """``stop_token_ids`` as a set, made once: the stop check runs on every token."""

    def __post_init__(self) -> None:
        self._check_lists()
        object.__setattr__(self, "stop_token_set", frozenset(self.stop_token_ids))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be an integer >= 1", "max_tokens")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise InvalidRequestError("min_tokens must be an integer >= 0", "min_tokens")
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(f"min_tokens ({self.min_tokens}) must be at most max_tokens "
                                      f"({self.max_tokens})", "min_tokens")
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
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2]", name)
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidRequestError("repetition_penalty must be in (0, 2]", "repetition_penalty")
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise InvalidRequestError("logit_bias keys must be token ids (integers >= 0)", "logit_bias")
            if not -100.0 <= bias <= 100.0:
                raise InvalidRequestError("logit_bias values must be in [-100, 100]", "logit_bias")

    def _check_lists(self) -> None:
        """The lengths first, before anything walks the lists."""
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings", "stop")
        if any(not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS for s in self.stop):
            raise InvalidRequestError(f"stop strings must be non-empty strings of at most {MAX_STOP_CHARS} "
                                      "characters", "stop")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(f"stop_token_ids may name at most {MAX_STOP_TOKEN_IDS} tokens",
                                      "stop_token_ids")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens", "logit_bias")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def shapes_logits(self) -> bool:
        """Whether penalties or biases change the logits this request samples from."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)
