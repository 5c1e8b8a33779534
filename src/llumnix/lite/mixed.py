"""``MixedBackend``: one gateway over named pools, each a ``Backend`` of its own: the
``ClusterBackend`` of our own instances (full mode: LlumSched, migration) and a
``LiteBackend`` per pool of external endpoints. It routes as lite mode routes between
its pools (``routing.route``: by model name or ``prefix*``, weight, fallback chain) and
leaves dispatch within a pool, retries and resumes inside it, to the pool's backend.

A pool's health is its backend's ``health()`` (none serving: unavailable), read every
``health_interval_s`` off the request path, and a pool that just failed a request before
any output counts as unhealthy until the next read. A request goes to its first choice
among healthy pools; when that pool fails before any output the next pool takes it, and
when it fails after output the next pool resumes it from the prompt and the output so far
(as a pool resumes within itself), so the client's stream goes on with no gap or repeat.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from llumnix.core.aio import within
from llumnix.core.batch import RequestOutput
from llumnix.core.errors import InvalidRequestError, LlumnixError, RequestFailedError, UpstreamError
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest, TokenizerLike
from llumnix.gateway.backend import Backend
from llumnix.lite.config import PoolConfig
from llumnix.lite.outputs import continuation
from llumnix.lite.routing import route

log = logging.getLogger(__name__)


@dataclass
class Member:
    """A named pool: its routing config (``endpoints`` empty for an internal pool) and
    the backend that serves it."""

    cfg: PoolConfig
    backend: Backend
    healthy: bool = True

    @property
    def name(self) -> str:
        return self.cfg.name

    def has_healthy(self) -> bool:
        return self.healthy


class MixedBackend:
    def __init__(self, members: list[Member], tokenizer: TokenizerLike, model_name: str, vocab_size: int,
                 seed: int = 0, health_interval_s: float = 1.0) -> None:
        self.members = {m.name: m for m in members}
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.vocab_size = vocab_size
        self.health_interval_s = health_interval_s
        self._rng = random.Random(seed)
        self._watcher: asyncio.Task[None] | None = None
        self.num_fallbacks = 0
        """Requests served (or resumed) by a pool other than their first choice."""
        self.num_resumed = 0
        """Requests resumed in another pool after theirs failed mid-stream."""

    @property
    def max_model_len(self) -> int:
        return min(m.backend.max_model_len for m in self.members.values())

    @property
    def model_names(self) -> list[str]:
        names = [self.model_name]
        for m in self.members.values():
            names += getattr(m.backend, "model_names", [m.backend.model_name])
        return [n for n in dict.fromkeys(names) if self.serves_model(n)]

    def serves_model(self, name: str) -> bool:
        return any(m.cfg.weight > 0 and m.cfg.serves(name) for m in self.members.values())

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        for m in self.members.values():
            if hasattr(m.backend, "start"):
                await m.backend.start()
        await self._check_health()
        self._watcher = asyncio.create_task(self._watch(), name="mixed-health")

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        for m in self.members.values():
            if hasattr(m.backend, "stop"):
                await m.backend.stop()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self._check_health()

    async def _check_health(self) -> None:
        async def read(m: Member) -> None:
            try:
                m.healthy = (await within(m.backend.health(), 5.0)).get("status") != "unavailable"
            except Exception as e:  # noqa: BLE001 - a pool that cannot say is not serving
                log.warning("mixed: pool %s health unknown (%s)", m.name, e)
                m.healthy = False

        await asyncio.gather(*(read(m) for m in self.members.values()))

    # -- requests -----------------------------------------------------------------------
    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """What no pool could serve; each pool checks the rest when a request reaches it."""
        errors = []
        for m in self.members.values():
            try:
                m.backend.validate(num_prompt_tokens, params)
                return
            except InvalidRequestError as e:
                errors.append(e)
        raise errors[0]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        model = request.model or self.model_name
        order = route(list(self.members.values()), model, self._rng)
        first = order[0] if order else None
        order = [m for m in order if m.healthy] + [m for m in order if not m.healthy]
        refused: InvalidRequestError | None = None
        errors: list[str] = []
        sent: list[int] = []  # output token ids released so far
        n_sent = 0  # the pools' count of them
        upstream = False  # the last failure was an external pool's
        current = request
        for m in order:
            try:
                m.backend.validate(len(current.prompt_token_ids), current.params)
            except InvalidRequestError as e:
                refused = refused or e
                continue
            if m is not first:
                self.num_fallbacks += 1
            try:
                async for out in self._run(m, current, model, n_sent):
                    sent += out.new_token_ids
                    n_sent = out.num_output_tokens
                    yield out
                return
            except InvalidRequestError:
                raise
            except LlumnixError as e:
                upstream = isinstance(e, UpstreamError)
                errors.append(f"{m.name}: {e}")
                if not sent:
                    m.healthy = False  # until the next health read
                else:
                    current = continuation(request, sent, n_sent)
                    self.num_resumed += 1
                log.warning("mixed: %s failed in pool %s after %d output tokens (%s); %s", request.request_id,
                            m.name, n_sent, e, "resuming elsewhere" if sent else "trying another pool")
        if refused is not None and not errors:
            raise refused
        if sent:  # an engine we do not own that failed it is not our bug (no 500)
            raise (UpstreamError if upstream else RequestFailedError)(
                f"the request failed mid-stream and no pool could resume it ({'; '.join(errors)}); "
                "the output so far is all there is")
        raise LlumnixError(f"no pool could serve the request ({'; '.join(errors) or 'none is healthy'})")

    async def _run(self, m: Member, request: GenerateRequest, model: str, base: int) -> AsyncIterator[RequestOutput]:
        """The pool's outputs, counted on from ``base`` tokens released before; a pool that
        does not serve the model by name gets the request as its own served model."""
        own = request.model if m.cfg.serves(model) else ""
        if own != request.model:
            request = dataclasses.replace(request, model=own)
        async with contextlib.aclosing(m.backend.generate(request)) as outs:  # type: ignore[type-var]
            async for out in outs:
                if base:
                    out.num_output_tokens += base
                yield out

    async def abort(self, request_id: str) -> None:
        await asyncio.gather(*(m.backend.abort(request_id) for m in self.members.values()))

    # -- admin --------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        states = await asyncio.gather(*(m.backend.health() for m in self.members.values()))
        instances: dict[str, Any] = {}
        serving: list[str] = []
        for s in states:
            instances.update(s.get("instances", {}))
            serving += s.get("serving", [])
        kinds = {s.get("status") for s in states}
        status = "ok" if kinds == {"ok"} else "unavailable" if kinds == {"unavailable"} else "degraded"
        return {"status": status, "instances": instances, "serving": sorted(serving),
                "target": sum(int(s.get("target", 0)) for s in states), "replacing": [],
                "pools": {m.name: s for m, s in zip(self.members.values(), states, strict=True)}}

    async def cluster_info(self) -> dict[str, Any]:
        infos = await asyncio.gather(*(m.backend.cluster_info() for m in self.members.values()))
        instances = [dict(i, pool=m.name) for m, info in zip(self.members.values(), infos, strict=True)
                     for i in info.get("instances", []) if isinstance(i, dict)]
        full = next((i for i in infos if "migrations" in i), {})  # the internal pool's
        return {"source": "mixed", "instances": instances, "migrations": full.get("migrations"),
                "num_dispatched": sum(int(i.get("num_dispatched", 0)) for i in infos),
                "pools": [{"name": m.name, "models": list(m.cfg.models), "weight": m.cfg.weight,
                           "fallback": m.cfg.fallback, "healthy": m.healthy, "info": info}
                          for m, info in zip(self.members.values(), infos, strict=True)],
                "gateway": {"num_fallbacks": self.num_fallbacks, "num_resumed": self.num_resumed,
                            "num_failed_instances": sum(int(i.get("gateway", {}).get("num_failed_instances", 0))
                                                        for i in infos),
                            "num_retired_instances": 0}}

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        return await self._owner(instance_id).drain_instance(instance_id)

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        return await self._owner(instance_id).undrain_instance(instance_id)

    def _owner(self, instance_id: str) -> Backend:
        for m in self.members.values():
            known = getattr(m.backend, "instances", None) or getattr(m.backend, "endpoints", None) or {}
            if instance_id in known:
                return m.backend
        raise InvalidRequestError(f"no instance or endpoint {instance_id!r}", "instance_id")
