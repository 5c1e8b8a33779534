"""The gateway's view of a Ray cluster: dispatch through LlumSched, collect every
request's outputs from whichever instance produces them, in order."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from llumnix.core.batch import RequestOutput
from llumnix.core.errors import LlumnixError, RequestTooLongError
from llumnix.core.sampling_params import SamplingParams
from llumnix.gateway.backend import GenerateRequest, TokenizerLike
from llumnix.policy import DispatchRequest

log = logging.getLogger(__name__)


class _Stream:
    """One request's outputs, released strictly in token order: a late output from a
    previous instance and an early one from the next cannot swap or repeat."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.next_index = 1  # num_output_tokens of the next output to release
        self.held: dict[int, RequestOutput] = {}
        self.instance_id: str | None = None

    def offer(self, out: RequestOutput) -> None:
        if out.num_output_tokens < self.next_index:
            return  # a duplicate
        self.held[out.num_output_tokens] = out
        while self.next_index in self.held:
            o = self.held.pop(self.next_index)
            self.queue.put_nowait(o)
            self.next_index += len(o.new_token_ids)


class ClusterBackend:
    def __init__(self, llumsched: Any, instances: dict[str, Any], info: dict[str, Any],
                 tokenizer: TokenizerLike) -> None:
        self.llumsched = llumsched
        self.instances = dict(instances)
        self.model_name = info["model"]
        self.max_model_len = int(info["max_model_len"])
        self.vocab_size = int(info["vocab_size"])
        self._usable_blocks = int(info["num_blocks"]) - int(info["watermark"] * info["num_blocks"])
        self._block_size = int(info["block_size"])
        self.tokenizer = tokenizer
        self._streams: dict[str, _Stream] = {}
        self._pollers: list[asyncio.Task] = []
        self.dispatch_timeout_s = 1.0
        self.num_fallback_dispatches = 0

    async def start(self) -> None:
        for iid, actor in self.instances.items():
            self._pollers.append(asyncio.create_task(self._poll(iid, actor), name=f"poll-{iid}"))

    async def stop(self) -> None:
        for t in self._pollers:
            t.cancel()
        for t in self._pollers:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _poll(self, iid: str, actor: Any) -> None:
        while True:
            try:
                outs = await actor.get_outputs.remote(0.5)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the instance died: fail its requests
                self._fail_instance(iid, e)
                await asyncio.sleep(1.0)
                continue
            for out in outs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.offer(out)

    def _fail_instance(self, iid: str, err: BaseException) -> None:
        for stream in self._streams.values():
            if stream.instance_id == iid:
                stream.queue.put_nowait(LlumnixError(f"instance {iid} failed: {err}"))

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        if num_prompt_tokens + 1 > self.max_model_len:
            raise RequestTooLongError(f"the prompt has {num_prompt_tokens} tokens; this model's context is "
                                      f"{self.max_model_len} tokens including at least one output token",
                                      "prompt")
        most = min(num_prompt_tokens + params.max_tokens, self.max_model_len)
        if -(-most // self._block_size) > self._usable_blocks:
            raise RequestTooLongError(f"the request needs up to {most} tokens of KV cache but an instance "
                                      f"holds {self._usable_blocks * self._block_size}", "max_tokens")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        stream = self._streams[request.request_id] = _Stream()
        try:
            iid = await self._dispatch(request)
            if iid is None:
                raise LlumnixError("no instance is available to serve the request")
            stream.instance_id = iid
            try:
                await self.instances[iid].add_request.remote(request)
            except Exception as e:  # noqa: BLE001 - surfaced to the client as one clear error
                raise LlumnixError(f"instance {iid} could not take the request: {e}") from e
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.is_finished:
                    return
        finally:
            self._streams.pop(request.request_id, None)

    async def _dispatch(self, request: GenerateRequest) -> str | None:
        """LlumSched decides; if it does not answer within a second (dead or
        restarting), the gateway falls back to its own round-robin so serving goes on."""
        try:
            return await asyncio.wait_for(self.llumsched.dispatch.remote(DispatchRequest(
                request.request_id, len(request.prompt_token_ids), request.priority,
                request.arrival_time)), timeout=self.dispatch_timeout_s)
        except Exception as e:  # noqa: BLE001 - any LlumSched failure means: use the fallback
            ids = sorted(self.instances)
            if not ids:
                return None
            self.num_fallback_dispatches += 1
            log.warning("LlumSched unavailable (%s); dispatching %s by round-robin",
                        type(e).__name__, request.request_id)
            return ids[self.num_fallback_dispatches % len(ids)]

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        iid = stream.instance_id if stream else None
        targets = [self.instances[iid]] if iid in self.instances else list(self.instances.values())
        for actor in targets:
            with contextlib.suppress(Exception):
                if await actor.abort.remote(request_id):
                    return

    async def health(self) -> dict[str, Any]:
        states = {}
        for iid, actor in self.instances.items():
            try:
                states[iid] = bool(await asyncio.wait_for(actor.health.remote(), 2.0))
            except Exception:  # noqa: BLE001 - an unreachable instance is unhealthy
                states[iid] = False
        return {"status": "ok" if any(states.values()) else "unavailable", "instances": states}

    async def cluster_info(self) -> dict[str, Any]:
        return await self.llumsched.cluster_info.remote()

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        if instance_id not in self.instances:
            from llumnix.core.errors import InvalidRequestError

            raise InvalidRequestError(f"no instance {instance_id!r}", "instance_id")
        return await self.llumsched.drain.remote(instance_id)
