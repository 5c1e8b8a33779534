"""From an OpenAI request body to a ``Reply``: the model's limits checked, sampling
parameters settled, and one engine request per choice."""
from __future__ import annotations

import dataclasses
import time

from fastapi.responses import JSONResponse
from starlette.requests import Request

from llumnix.core.errors import InvalidRequestError
from llumnix.core.sampling_params import SamplingParams
from llumnix.gateway.backend import model_names, serves_model
from llumnix.gateway.choices import Reply, make_choices
from llumnix.gateway.context import GatewayContext
from llumnix.gateway.errors import error_response
from llumnix.gateway.fair import client_key
from llumnix.gateway.protocol import ChatCompletionRequest, CompletionRequest, new_id, parse_priority

PRIORITY_HEADER = "x-llumnix-priority"
SLO_CLASS_HEADER = "x-slo-class"


def check_model(ctx: GatewayContext, name: str) -> JSONResponse | None:
    """The 404 for a model this server does not serve, or None."""
    if serves_model(ctx.backend, name):
        return None
    ctx.reject(404)
    served = ", ".join(f"'{m}'" for m in model_names(ctx.backend))
    return error_response(404, f"the model '{name}' does not exist; this server serves {served}",
                          type_="NotFoundError", param="model", code="model_not_found")


def sampling_params(ctx: GatewayContext, body: CompletionRequest | ChatCompletionRequest,
                    prompt_ids: list[int]) -> SamplingParams:
    """The body's sampling parameters, checked against the model's vocabulary and context."""
    backend = ctx.backend
    if prompt_ids and (min(prompt_ids) < 0 or max(prompt_ids) >= backend.vocab_size):
        raise InvalidRequestError("prompt token ids must be in [0, vocab size)", "prompt")
    params = body.sampling_params(ctx.config.default_max_tokens)
    if any(t >= backend.vocab_size for t, _ in params.logit_bias):
        raise InvalidRequestError("logit_bias keys must be token ids in [0, vocab size)", "logit_bias")
    if any(not 0 <= t < backend.vocab_size for t in params.stop_token_ids):
        raise InvalidRequestError("stop_token_ids must be token ids in [0, vocab size)", "stop_token_ids")
    room = backend.max_model_len - len(prompt_ids)  # < 1: validate names the prompt
    if room >= 1 and params.max_tokens > room:
        if body.max_tokens is not None:  # asked for explicitly: refused, as OpenAI and vLLM do
            raise InvalidRequestError(
                f"this model's context is {backend.max_model_len} tokens and the prompt has "
                f"{len(prompt_ids)}, so max_tokens can be at most {room}, not {params.max_tokens}",
                "max_tokens")
        params = dataclasses.replace(params, max_tokens=room)  # the default fits what is left
    backend.validate(len(prompt_ids), params)
    return params


def prepare(ctx: GatewayContext, body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int],
            request: Request) -> Reply:
    """The response to serve: validated, with an engine request per choice."""
    params = sampling_params(ctx, body, prompt_ids)
    header = request.headers.get(PRIORITY_HEADER)
    priority = parse_priority(header if header is not None else body.priority)
    slo_class = request.headers.get(SLO_CLASS_HEADER, body.slo_class)
    if slo_class is not None:
        cls = ctx.config.slo.get(slo_class)  # an unknown class: a 400 naming slo_class
        if header is None and body.priority is None:  # a class runs at its priority
            priority = cls.priority
    chat = isinstance(body, ChatCompletionRequest)
    response_id = new_id("chatcmpl" if chat else "cmpl")
    gens = make_choices(response_id, prompt_ids, params, body.n, priority, time.monotonic(),
                        final_only=not body.stream, slo_class=slo_class)
    if body.model != ctx.model_name:  # another model the backend serves: it routes by the name
        gens = [dataclasses.replace(g, model=body.model) for g in gens]
    if ctx.fair is not None:
        ctx.fair.tag(gens, client_key(body.user, request))
    return Reply(response_id, gens, chat=chat, stream=body.stream, as_ids=body.return_tokens_as_token_ids,
                 echo_only=isinstance(body, CompletionRequest) and body.echo_only,
                 include_usage=body.stream_options is not None and body.stream_options.include_usage)
