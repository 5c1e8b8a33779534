"""One request's outputs as the gateway releases them to its client: strictly in token
order, whichever instance produced them (a late output from a previous instance and an
early one from the next cannot swap or repeat)."""
from __future__ import annotations

import asyncio
from typing import Any

from llumnix.core.batch import RequestOutput
from llumnix.core.errors import RequestFailedError
from llumnix.core.wire import GenerateRequest


class OutputStream:
    """One request's outputs, released strictly in token order: a late output from a
    previous instance and an early one from the next cannot swap or repeat."""

    def __init__(self, request: GenerateRequest) -> None:
        self.request = request
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.next_index = 1  # the number of the next token to release (1 = the first)
        self.held: dict[int, RequestOutput] = {}
        self.token_ids: list[int] = []
        """Every token released so far: what a resumed request continues from."""
        self.instance_id: str | None = None
        self.is_finished = False
        self.is_recovering = False
        self.num_resumes = 0

    def offer(self, out: RequestOutput) -> None:
        if self.is_finished:
            return
        if out.finish_reason == "error":
            # The engine ended it after every token it had released (outputs come in order).
            self.is_finished = True
            self.held.clear()
            self.queue.put_nowait(RequestFailedError(out.error or "the engine failed on this request"))
            return
        first = out.num_output_tokens - len(out.new_token_ids) + 1  # its first token's number
        if first < self.next_index:
            return  # a duplicate
        self.held[first] = out  # one token, or several merged (a final-only request's)
        while self.next_index in self.held:
            o = self.held.pop(self.next_index)
            self.queue.put_nowait(o)
            self.token_ids.extend(o.new_token_ids)
            self.next_index += len(o.new_token_ids)
            if o.is_finished:
                self.is_finished = True
                self.held.clear()
                return


PRESENT = object()
"""``ClusterBackend.submit``: the request is already on the instance; nothing to add."""


def is_live(streams: dict[str, OutputStream], stream: OutputStream) -> bool:
    """The stream is still the one registered for its request (the client is there)."""
    return streams.get(stream.request.request_id) is stream


def actor_key(actor: Any) -> str:
    """An actor handle's identity (its actor id; the object's id for test doubles)."""
    key = getattr(actor, "_actor_id", None)
    return key.hex() if key is not None else str(id(actor))
