"""Stopping a response's work when its client goes away, without a second task per
request doing the work: ``with ClientWatch(receive) as client:`` cancels the current
task if the client disconnects inside the block; the block then ends quietly with
``client.left`` set (any other cancellation, a server stopping, goes on up)."""
from __future__ import annotations

import asyncio
from typing import Any


class ClientWatch:
    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self._active = False
        self._watch: asyncio.Future[None] | None = None
        self._task: asyncio.Task[Any] | None = None

    @property
    def left(self) -> bool:
        w = self._watch
        return w is not None and w.done() and not w.cancelled()

    def __enter__(self) -> ClientWatch:
        self._task = asyncio.current_task()
        self._active = True
        self._watch = asyncio.ensure_future(self._disconnected())
        self._watch.add_done_callback(self._on_done)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        self._active = False
        assert self._watch is not None and self._task is not None
        self._watch.cancel()
        if exc_type is asyncio.CancelledError and self.left:
            self._task.uncancel()
            return True  # the client left: nobody to answer
        return False

    def _on_done(self, watch: asyncio.Future[None]) -> None:
        if self._active and not watch.cancelled() and self._task is not None:
            self._task.cancel()

    async def _disconnected(self) -> None:
        """The body has been read, so the next ASGI message is the disconnect: waiting
        for it costs nothing (no polling)."""
        while (await self._receive())["type"] != "http.disconnect":
            pass
