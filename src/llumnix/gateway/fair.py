"""The gateway's fair share (``--fair-share N``, off by default): each choice of a request
takes one of N places before it reaches the backend, and waits for one in a virtual-token-
counter queue keyed by client (``policy/fair_share.py``), so a client with costly work
queued cannot put it all ahead of another client's request, as the engines' FCFS queues
would. The client is the request's OpenAI ``user`` field, else the peer's address.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.requests import Request

from llumnix.core.wire import GenerateRequest
from llumnix.policy.fair_share import FairConfig, FairShare

MAX_CLIENT_CHARS = 256
"""A ``user`` longer than this is cut: a client name, not a payload kept per client."""
MAX_TAGGED = 1 << 16
"""Choices tagged with their client and not started yet (a stream whose client left before
it began never starts): past this, the oldest tag is dropped and its choice counts as no one's."""


def client_key(user: str | None, request: Request) -> str:
    """Whose share a request counts against: its ``user``, else its peer's address."""
    if user:
        return "user:" + user[:MAX_CLIENT_CHARS]
    return "addr:" + (request.client.host if request.client is not None else "")


class FairGate:
    def __init__(self, config: FairConfig) -> None:
        self.share = FairShare(config)
        self._clients: OrderedDict[str, str] = OrderedDict()  # request id -> client, prepare() to slot()
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._tickets = itertools.count()

    def tag(self, gens: list[GenerateRequest], client: str) -> None:
        for g in gens:
            self._clients[g.request_id] = client
        while len(self._clients) > MAX_TAGGED:
            self._clients.popitem(last=False)

    @asynccontextmanager
    async def slot(self, gen: GenerateRequest) -> AsyncIterator[Callable[[int], None]]:
        """A place for ``gen`` (waiting for it in the fair queue); yields what to call with
        each output's token count, so the client's counter follows what it is served."""
        client = self._clients.pop(gen.request_id, "")
        ticket = next(self._tickets)
        if not self.share.arrive(client, ticket):
            fut = asyncio.get_running_loop().create_future()
            self._waiting[ticket] = fut
            try:
                await fut
            except asyncio.CancelledError:
                if not self.share.cancel(client, ticket):  # a place came with the cancel: hand it on
                    self._release(client)
                raise
            finally:
                self._waiting.pop(ticket, None)
        self.share.charge(client, prompt_tokens=len(gen.prompt_token_ids))
        try:
            yield lambda k: self.share.charge(client, output_tokens=k)
        finally:
            self._release(client)

    def _release(self, client: str) -> None:
        for _, ticket in self.share.finish(client):
            fut = self._waiting.get(ticket)
            if fut is not None and not fut.done():
                fut.set_result(None)
