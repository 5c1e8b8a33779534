"""``LiteBackend``: the gateway's ``Backend`` over engines Llumnix does not own.

The gateway tokenizes, formats, streams and counts exactly as in full mode; this
backend dispatches each request with the pool's policy pipeline (``pool.py``), sends it
to the endpoint (``client.py``) and turns the streamed chunks back into
``RequestOutput``s. The engine's text is what the client gets: each text delta is
encoded with the gateway's tokenizer (byte-level BPE decodes its encoding back to the
same text, so the gateway's incremental detokenizer, stop strings and formatting work
unchanged) unless the engine sends its token ids, which are used once checked against the
vocabulary. Usage counts the engine's tokens (its final usage chunk where the figures are
possible, else one per streamed chunk); output past ``max_tokens`` is cut there. What no
sane engine sends counts against the endpoint (``engine_faults``; docs/lite.md).

Failures: a request whose endpoint fails before any output was produced is sent to the
next endpoint (the pool's dispatch, excluding those tried; then the fallback pool), up
to ``max_attempts``; one that fails after outputs were produced is resumed on another
from its output so far, else ends with an ``UpstreamError``, which the gateway streams as
an error event. Nothing is ever sent twice.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx

from llumnix.core.batch import RequestOutput
from llumnix.core.errors import InvalidRequestError, RequestTooLongError, UpstreamError
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest, TokenizerLike
from llumnix.lite.client import TOKEN_PROMPTS, Chunk, EndpointError, ReplyLimits, request_body, stream_chunks
from llumnix.lite.config import LiteConfig
from llumnix.lite.endpoint import Endpoint
from llumnix.lite.http import HttpPool
from llumnix.lite.outputs import checked_usage, continuation, finished_metrics
from llumnix.lite.pool import Pool
from llumnix.lite.routing import route

log = logging.getLogger(__name__)

TEXT_PER_TOKEN = 64
"""Characters of text per token of ``max_tokens`` an engine may stream (or the tokenizer's
longest token where longer): a token averages about 4, and an engine with a tokenizer
other than the gateway's (``kind: openai``) may have longer ones."""
TEXT_SLACK = 256
"""Characters beyond that, so a reply of one or two long tokens is never cut."""


class LiteBackend:
    def __init__(self, config: LiteConfig, tokenizer: TokenizerLike, model_name: str, vocab_size: int,
                 max_model_len: int = 8192, seed: int = 0) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.pools = {p.name: Pool(p, config, seed + i) for i, p in enumerate(config.pools)}
        self.endpoints: dict[str, Endpoint] = {i: e for p in self.pools.values() for i, e in p.endpoints.items()}
        self._rng = random.Random(seed)
        self._client: httpx.AsyncClient | None = None
        """Probes and scrapes (off the request path)."""
        self._http: HttpPool | None = None
        """Requests to the engines."""
        self._watchers: list[asyncio.Task[None]] = []
        self._encoded: dict[str, tuple[int, ...]] = {}
        """Text deltas and their encoding (a delta's encoding is the same every time)."""
        self.num_retries = 0
        """Requests sent again after their endpoint failed before any output."""
        self.num_fallbacks = 0
        """Requests served by a pool other than their first choice."""
        self.num_failed_mid_stream = 0
        self.num_resumed = 0
        """Requests resumed on another endpoint after theirs failed mid-stream."""
        self.engine_faults: Counter[str] = Counter()
        """Answers no sane engine gives, by kind (garbage, oversized, token_id, usage,
        max_tokens): each counted against its endpoint's health too."""
        self._limits = ReplyLimits(config.first_byte_timeout_s, config.idle_timeout_s, config.max_line_bytes)
        self._text_per_token = max(TEXT_PER_TOKEN, getattr(tokenizer, "max_token_bytes", None) or 0)
        """Characters of text a streamed token may bring, at most (on average over a reply)."""

    @property
    def model_names(self) -> list[str]:
        """What /v1/models lists: the served model, the pools' model names and the models
        their endpoints report where a pool takes any name or a ``prefix*``; only names
        some pool routes."""
        names = [self.model_name]
        for p in self.pools.values():
            names += p.cfg.models
            if not p.cfg.models or any(m.endswith("*") for m in p.cfg.models):
                names += [m for e in p.endpoints.values() for m in e.models]
        return [m for m in dict.fromkeys(names) if not m.endswith("*") and self.serves_model(m)]

    def serves_model(self, name: str) -> bool:
        """A pool with traffic of its own (weight > 0) serves the name (or its prefix)."""
        return any(p.cfg.weight > 0 and p.cfg.serves(name) for p in self.pools.values())

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        timeout = httpx.Timeout(connect=self.config.connect_timeout_s, read=None, write=10.0, pool=None)
        self._client = httpx.AsyncClient(limits=limits, timeout=timeout)
        self._http = HttpPool(self.config.connect_timeout_s)
        await asyncio.gather(*(e.probe(self._client) for e in self.endpoints.values()))
        known = [e.max_model_len for e in self.endpoints.values() if e.max_model_len]
        if known:
            self.max_model_len = min(self.max_model_len, *known)
        self._watchers = [asyncio.create_task(e.watch(self._client), name=f"watch-{i}")
                          for i, e in self.endpoints.items()]

    async def stop(self) -> None:
        for t in self._watchers:
            t.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
        if self._http is not None:
            self._http.close()

    # -- requests -----------------------------------------------------------------------
    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        if num_prompt_tokens + 1 > self.max_model_len:
            raise RequestTooLongError(f"the prompt has {num_prompt_tokens} tokens; this model's context is "
                                      f"{self.max_model_len} tokens including at least one output token", "prompt")
        if params.logprobs is not None or params.prompt_logprobs is not None:
            raise InvalidRequestError("logprobs are not available in lite mode (the engines' token ids "
                                      "are not known to the gateway)", "logprobs")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        # A name no pool serves reaches here only as another pool's fallback: any pool takes it.
        pools = route(list(self.pools.values()), request.model or self.model_name, self._rng) or \
            sorted(self.pools.values(), key=lambda p: -p.cfg.weight)
        tried: set[str] = set()
        errors: list[str] = []
        sent: list[int] = []  # output token ids released so far
        n_sent = 0  # the engines' count of them
        current = request
        for n in range(self.config.max_attempts):
            got = self._dispatch(current, pools, tried)
            if got is None:
                break
            pool, ep = got
            if n and not sent:
                self.num_retries += 1
            if pool is not pools[0]:
                self.num_fallbacks += 1
            try:
                async with contextlib.aclosing(self._run(ep, current, n_sent)) as outs:
                    async for out in outs:
                        sent += out.new_token_ids
                        n_sent = out.num_output_tokens
                        yield out
                return
            except EndpointError as e:
                if e.endpoint_fault:
                    ep.on_request_failed(str(e), e.refused)
                if e.fault:
                    self.engine_faults[e.fault] += 1
                if e.client_error:
                    raise InvalidRequestError(f"the engine refused the request: {e}") from None
                errors.append(f"{ep.endpoint_id}: {e}")
                if sent and not self.config.resume:
                    self.num_failed_mid_stream += 1
                    raise UpstreamError(f"endpoint {ep.endpoint_id} failed mid-stream ({e}); "
                                             "the output so far is all there is") from None
                if sent:
                    current = continuation(request, sent, n_sent)
                    self.num_resumed += 1
                log.warning("lite: %s failed on %s after %d output tokens (%s); %s on another endpoint",
                            request.request_id, ep.endpoint_id, n_sent, e, "resuming" if sent else "trying")
        if sent:
            self.num_failed_mid_stream += 1
            raise UpstreamError(f"the request's endpoint failed mid-stream and no other could resume it "
                                     f"({'; '.join(errors)}); the output so far is all there is")
        tried_on = "; ".join(errors) if errors else "none is healthy"
        raise UpstreamError(f"no endpoint could serve the request ({tried_on})")

    def _dispatch(self, request: GenerateRequest, pools: list[Pool], tried: set[str]) -> tuple[Pool, Endpoint] | None:
        for pool in pools:
            ep = pool.dispatch(request.request_id, request.prompt_token_ids, request.priority, tried)
            if ep is not None:
                tried.add(ep.endpoint_id)
                return pool, ep
        return None

    async def _run(self, ep: Endpoint, request: GenerateRequest,
                   base: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """One attempt on ``ep``: its outputs, the last one finished; EndpointError on
        failure. ``base``: output tokens released before (a resumed request counts on).
        An engine that streams past ``max_tokens`` is cut there (finish ``length``), and
        impossible usage is replaced by what was streamed: both count against it."""
        assert self._http is not None, "LiteBackend.start() was not awaited"
        rid, lrs, max_tokens = request.request_id, ep.lrs, request.params.max_tokens
        prompt: list[int] | str = request.prompt_token_ids if ep.kind in TOKEN_PROMPTS else \
            self.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        body = request_body(ep.engine_model(request.model or self.model_name), ep.kind, prompt, request.params)
        n_out, ok, fault, final_ids = base, False, ("", ""), []
        text_left = TEXT_SLACK + max_tokens * self._text_per_token
        try:
            async with contextlib.aclosing(stream_chunks(self._http, ep.url, body, ep.headers,
                                                         self._limits)) as chunks:
                final: Chunk | None = None
                async for chunk in chunks:  # the finish chunk comes last, with the usage
                    # More text than max_tokens tokens can hold is past max_tokens too (and
                    # is not encoded: a 4 MB delta cost the gateway 5 CPU-seconds).
                    over = chunk.token_ids is None and (text_left := text_left - len(chunk.text)) < 0
                    ids = [] if over else self._ids(chunk)
                    n_new = len(ids) if chunk.token_ids is not None else int(bool(chunk.text))
                    if over or n_out + n_new > base + max_tokens:  # hanging up aborts it on the engine
                        final_ids = ids[:base + max_tokens - n_out] if chunk.token_ids is not None else []
                        if n_out == base and not final_ids:  # nothing usable: another may do better
                            raise EndpointError(f"streamed past max_tokens ({max_tokens}) before any output",
                                                fault="max_tokens")
                        final, n_out = Chunk(finish_reason="length"), n_out + len(final_ids)
                        fault = ("max_tokens", f"streamed past max_tokens ({max_tokens}); cut there")
                        break
                    if chunk.finish_reason is not None:
                        final, final_ids, n_out = chunk, ids, n_out + n_new
                        break
                    if not ids:
                        continue
                    n_out += n_new
                    lrs.on_tokens(rid, n_new)
                    yield RequestOutput(rid, ids, n_out)
                if final is None:
                    raise EndpointError("the stream ended without a finish reason")
                if final.finish_reason not in ("stop", "length"):
                    raise EndpointError(f"the engine ended the request ({final.finish_reason})")
            ok = True
            n_usage, n_cached, problem = checked_usage(final, n_out - base, max_tokens, len(request.prompt_token_ids))
            fault = fault if fault[0] or not problem else ("usage", problem)
            n_out = base + n_usage
            yield RequestOutput(rid, final_ids, n_out, final.finish_reason, stop_reason=final.stop_reason,
                                metrics=finished_metrics(request, n_out, n_cached))
        finally:
            if ok and fault[0]:
                self._on_fault(ep, *fault)
            elif ok:
                ep.health.on_success(time.time())
            lrs.on_finish(rid, failed=not ok)

    def _on_fault(self, ep: Endpoint, fault: str, message: str) -> None:
        """The engine misbehaved on a request it still answered: it counts against its health."""
        self.engine_faults[fault] += 1
        ep.on_request_failed(message, refused=False)
        log.warning("lite: endpoint %s misbehaved: %s", ep.endpoint_id, message)

    def _ids(self, chunk: Chunk) -> list[int]:
        streamed = chunk.token_ids
        if streamed is not None:
            if streamed and (min(streamed) < 0 or max(streamed) >= self.vocab_size):
                bad = next(t for t in streamed if not 0 <= t < self.vocab_size)
                raise EndpointError(f"the endpoint streamed token id {bad}, outside the gateway's vocabulary "
                                    f"(0 to {self.vocab_size - 1})", fault="token_id")
            return streamed
        text = chunk.text
        if not text:
            return []
        ids = self._encoded.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if len(text) <= 32:  # deltas are a token or a few: the same words come back
                if len(self._encoded) >= 1 << 16:
                    self._encoded.clear()
                self._encoded[text] = ids
        return list(ids)

    async def abort(self, request_id: str) -> None:
        """Nothing to do here: the gateway stops reading, the stream's close ends the HTTP
        request, and an OpenAI server aborts a request whose connection closed."""

    # -- admin --------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        states = {i: e.can_serve() for i, e in self.endpoints.items()}
        serving = sorted(i for i, ok in states.items() if ok)
        status = "unavailable" if not serving else "ok" if len(serving) == len(states) else "degraded"
        return {"status": status, "instances": states, "serving": serving, "target": len(states),
                "replacing": []}

    async def cluster_info(self) -> dict[str, Any]:
        instances = [s for p in self.pools.values() for s in p.summaries()]
        ejections = sum(e.health.num_ejections for e in self.endpoints.values())
        return {"source": "lite", "instances": instances, "dispatch_policy": self.config.dispatch,
                "pools": [{"name": p.name, "models": list(p.cfg.models), "weight": p.cfg.weight,
                           "fallback": p.cfg.fallback, "endpoints": sorted(p.endpoints)} for p in self.pools.values()],
                "num_dispatched": sum(e.lrs.num_dispatched for e in self.endpoints.values()),
                "gateway": {"num_failed_instances": ejections, "num_retired_instances": 0,
                            "num_resumed": self.num_resumed,
                            "num_retries": self.num_retries, "num_fallbacks": self.num_fallbacks,
                            "num_failed_mid_stream": self.num_failed_mid_stream,
                            "engine_faults": dict(self.engine_faults),
                            "instances": sorted(self.endpoints)}}

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        return self._set_drained(instance_id, True)

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        return self._set_drained(instance_id, False)

    def _set_drained(self, instance_id: str, drained: bool) -> dict[str, Any]:
        ep = self.endpoints.get(instance_id)
        if ep is None:
            raise InvalidRequestError(f"no endpoint {instance_id!r}", "instance_id")
        ep.set_drained(drained)
        return {"instance_id": instance_id, "is_drained": drained, "num_in_flight": ep.lrs.num_in_flight}
