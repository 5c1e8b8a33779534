"""OpenAI request/response shapes (pydantic) and their mapping onto SamplingParams."""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Priority
from llumnix.core.sampling_params import SamplingParams


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def parse_priority(value: str | int | None) -> int:
    """'high'/'normal', or vLLM's integers (lower value = more urgent; < 0 is high)."""
    if value is None:
        return Priority.NORMAL
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("high", "normal"):
            return Priority.HIGH if v == "high" else Priority.NORMAL
        try:
            value = int(v)
        except ValueError:
            raise InvalidRequestError("priority must be 'high', 'normal' or an integer",
                                      "priority") from None
    return Priority.HIGH if value < 0 else Priority.NORMAL


def _valid_unicode(v: object, param: str) -> object:
    """A string field JSON let carry a lone UTF-16 surrogate ("\\ud800"): the client's
    error, a 400 naming the field, not an answer that cannot be encoded."""
    if isinstance(v, str):
        try:
            v.encode()
        except UnicodeEncodeError as e:
            raise InvalidRequestError(f"{param} is not valid Unicode: a lone surrogate at character {e.start}",
                                      param) from None
    return v


class _Named(BaseModel):
    """A request that names the served model."""

    model: str

    @field_validator("model", mode="before")
    @classmethod
    def _model_unicode(cls, v: object) -> object:
        return _valid_unicode(v, "model")


MAX_N = 16
"""Most choices per request: each is an engine request of its own (no shared prefix)."""


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "functions": (None, []),
}
"""OpenAI (and vLLM) fields this server does not implement, with the values that ask for
nothing: any other value is refused rather than silently ignored."""


class _SamplingFields(_Named):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: object) -> object:
        if isinstance(data, dict):
            for key, neutral in _UNSUPPORTED.items():
                v = data.get(key)
                if not any(v == n and type(v) is not bool for n in neutral) and v is not None:
                    shown = ", ".join("null" if n is None else repr(n) for n in neutral)
                    raise InvalidRequestError(f"{key} is not supported by this server (accepted: {shown})", key)
        return data

    max_tokens: StrictInt | None = Field(default=None)
    temperature: StrictFloat = 1.0
    top_p: StrictFloat = 1.0
    top_k: StrictInt = 0
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    """``include_usage``: a last chunk with the usage and no choices (OpenAI's rule: only
    when asked, since a client reading ``choices[0]`` of every chunk would fail on it)."""
    logprobs: StrictBool | StrictInt | None = None
    return_tokens_as_token_ids: StrictBool = False
    """vLLM's extension: logprobs name tokens "token_id:N" instead of by their text."""
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    """vLLM's extension: until the output has this many tokens, neither EOS nor a stop
    token id nor a stop string ends it."""
    stop_token_ids: list[StrictInt] | None = None
    """vLLM's extension: token ids that end the output (kept in it, as EOS is)."""
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    """vLLM's extension (transformers' rule): > 1 discourages every token already seen."""
    logit_bias: dict[str, StrictFloat] | None = None
    """OpenAI's: token ids (as strings, JSON's keys) mapped to a bias added to their logits."""
    priority: str | int | None = None
    slo_class: str | None = None
    """Llumnix's: the request's SLO class (``scheduling.slo``); None: its priority's class."""
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int) -> int:
        if not 1 <= n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}]")
        return n

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        logprobs = self.logprobs
        if isinstance(logprobs, bool):
            logprobs = 0 if logprobs else None
        return SamplingParams(
            max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            stop=stop, ignore_eos=self.ignore_eos, logprobs=logprobs, min_tokens=self.min_tokens,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self._logit_bias(),
        )

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise InvalidRequestError(f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
            pairs.append((int(key), float(bias)))
        return tuple(sorted(pairs))


class CompletionRequest(_SamplingFields):
    prompt: str | list[int]
    echo: StrictBool = False

    @property
    def echo_only(self) -> bool:
        """OpenAI's form for scoring a prompt (eval harnesses' loglikelihood): echo with
        max_tokens 0 answers the prompt, with its logprobs when asked, and nothing more."""
        return self.echo and self.max_tokens == 0

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        # echo only: the engine generates one token (its prefill makes the prompt's
        # logprobs), which the answer leaves out
        fields = self.model_copy(update={"max_tokens": 1}) if self.echo_only else self
        params = _SamplingFields.sampling_params(fields, default_max_tokens)
        if self.echo and params.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=params.logprobs)
        return params

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: object) -> object:
        """A string or token ids; OpenAI's batch form (a list of those) with one prompt in it."""
        if isinstance(v, list) and v and all(isinstance(x, str | list) for x in v):
            if len(v) != 1:
                raise ValueError(f"a batch of {len(v)} prompts is not supported; send one prompt per request")
            v = v[0]
        if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                               for x in v)):
            return v
        raise ValueError("prompt must be a string or a list of token ids")


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str

    @field_validator("role", mode="before")
    @classmethod
    def _developer_is_system(cls, v: object) -> object:
        """OpenAI's newer name for the system role; chat templates know only 'system'."""
        return "system" if v == "developer" else v

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, v: object) -> object:
        """OpenAI's content-part form: the text parts joined; other parts (images, audio)
        cannot be served by a text model."""
        if not isinstance(v, list):
            return v
        texts = []
        for part in v:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"only text content parts are supported, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        params = super().sampling_params(default_max_tokens)
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
            if not 0 <= self.top_logprobs <= 20:
                raise InvalidRequestError("top_logprobs must be in [0, 20]", "top_logprobs")
            params = dataclasses.replace(params, logprobs=self.top_logprobs)
        return params


class TokenizeRequest(_Named):
    """vLLM's /tokenize: a prompt, or chat messages rendered with the chat template."""

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Named):
    tokens: list[StrictInt]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())
