"""A deadline for reading each HTTP request, headers and body together.

uvicorn waits for a request's bytes as long as the client keeps the connection open: a
connection that sends half its headers, or declares a 1,000-byte body and sends 2, holds a
socket and its buffers for ever (3,000 such connections stayed open in issue 43's probe).
Here a request must arrive whole within ``read_timeout_s`` of its first byte, or of the
connection's opening for its first request; otherwise the connection is closed. The time
the app then takes to answer is not bounded here (a long stream is fine), nor is the idle
time between requests (uvicorn's keep-alive timeout closes those)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_S = 30.0


class ReadDeadlineProtocol(HttpToolsProtocol):
    read_timeout_s = DEFAULT_READ_TIMEOUT_S
    on_server_shutdown: ClassVar[Callable[[], None] | None] = None
    """Called as the server starts its shutdown, before it waits for requests under way:
    the long polls of ``/admin/cluster`` answer then instead of holding it up."""
    _last_logged = 0.0
    _num_closed = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        hook = type(self).on_server_shutdown
        if hook is not None:
            hook()
        super().shutdown()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # the first request's clock started with the connection
            self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.read_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cls = ReadDeadlineProtocol
        cls._num_closed += 1
        now = time.monotonic()
        if now - cls._last_logged > 10.0:  # one line per 10 s however many come
            cls._last_logged = now
            log.warning("closed a connection from %s whose request did not arrive within %.0f s "
                        "(%d so far; --http-read-timeout)", self.client, self.read_timeout_s, cls._num_closed)
        self.transport.close()


def read_deadline_protocol(read_timeout_s: float,
                           on_server_shutdown: Callable[[], None] | None = None) -> type[ReadDeadlineProtocol]:
    """uvicorn's ``http=`` class with this deadline (and shutdown hook)."""
    return type("ReadDeadlineProtocol", (ReadDeadlineProtocol,),
                {"read_timeout_s": read_timeout_s, "on_server_shutdown": on_server_shutdown})


def http_protocol(app: Any) -> type[ReadDeadlineProtocol]:
    """The ``http=`` class for a gateway app: its config's ``http_read_timeout_s``; the
    server's shutdown ends the app's long polls (``ClusterWatch.close``)."""
    ctx = app.state.gateway
    return read_deadline_protocol(ctx.config.http_read_timeout_s, ctx.cluster_watch.close)
