"""The gateway's end of an instance's request channel (``channel.py``), on asyncio:
adds go out as frames, outputs, statuses and add results come back in one frame
per engine step, each handed to the ``LinkSink`` as it arrives.

Each connection is an ``asyncio.Protocol`` (``_Line``): the handshake and the frames
are cut out of the bytes in ``data_received`` itself, with no coroutine woken per frame
(a stream reader costs two awaits and a future a frame)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from llumnix.cluster.channel import ClientEnd, pack
from llumnix.core.aio import within
from llumnix.core.batch import RequestOutput
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest


class LinkSink(Protocol):
    def on_outputs(self, instance_id: str, outputs: list[RequestOutput]) -> None: ...

    def on_statuses(self, instance_id: str, statuses: list[InstanceStatus]) -> None: ...

    def on_add_result(self, instance_id: str, request_id: str, error: BaseException | None) -> None: ...


def _quiet(fut: asyncio.Future[None]) -> None:
    """Mark ``fut``'s error as seen: a line that broke is reported once, by whoever waits."""
    if not fut.cancelled():
        fut.exception()


class _Line(asyncio.Protocol):
    """One connection of a link: the bytes go through a ``ClientEnd`` as they come, each
    whole frame handed to the link at once."""

    def __init__(self, link: InstanceLink) -> None:
        loop = asyncio.get_running_loop()
        self.link = link
        self.end = ClientEnd(link.token, link.client, link.acked, link.on_frame, f"instance {link.instance_id}")
        self.transport: asyncio.Transport | None = None
        self.proven: asyncio.Future[None] = loop.create_future()
        """Set once the instance proved the token (``open`` waits for it)."""
        self.closed: asyncio.Future[None] = loop.create_future()
        """Failed when the line breaks (``run`` waits for it)."""
        for fut in (self.proven, self.closed):
            fut.add_done_callback(_quiet)

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionError(f"the channel to {self.link.instance_id} closed"))

    def fail(self, err: ConnectionError) -> None:
        for fut in (self.proven, self.closed):
            if not fut.done():
                fut.set_exception(err)
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            reply = self.end.feed(data)
            if reply and self.transport is not None:
                self.transport.write(reply)
            if self.end.is_proven and not self.proven.done():
                self.proven.set_result(None)
        except Exception as e:  # noqa: BLE001 - a line that speaks nonsense is closed (and reopened)
            self.fail(e if isinstance(e, ConnectionError) else ConnectionError(
                f"the channel to {self.link.instance_id} sent a bad frame: {e!r}"))


class InstanceLink:
    def __init__(self, instance_id: str, address: tuple[str, int], token: bytes, client: str,
                 sink: LinkSink) -> None:
        self.instance_id = instance_id
        self.address = address
        self.token, self.client, self._sink = token, client, sink
        self._line: _Line | None = None
        self.acked = 0
        """Sequence number of the last output this gateway has: a reconnect resumes after it."""
        self.last_frame_at = time.monotonic()
        self._ack_timer: asyncio.TimerHandle | None = None

    ACK_DELAY_S = 0.2
    """Acks only let the instance drop what this gateway has: they need not be prompt
    (and one due when a request goes out rides with it)."""

    @property
    def is_open(self) -> bool:
        line = self._line
        return line is not None and line.transport is not None and not line.transport.is_closing()

    async def open(self, timeout_s: float = 5.0) -> None:
        """Connect and prove, both ways, that each end holds the cluster's token."""
        self._line = None
        line = _Line(self)
        try:
            await within(asyncio.get_running_loop().create_connection(lambda: line, *self.address),
                         timeout_s)
            await within(asyncio.shield(line.proven), timeout_s)
        except BaseException:
            line.fail(ConnectionError(f"the channel to {self.instance_id} did not open"))
            raise
        self._line = line
        self.last_frame_at = time.monotonic()

    def add(self, request: GenerateRequest) -> None:
        """Send ``request`` (its result comes back through ``on_add_result``)."""
        line = self._line
        if line is None or line.transport is None or line.transport.is_closing():
            raise ConnectionError(f"the channel to {self.instance_id} is closed")
        frame = pack(("add", request))
        if self._ack_timer is not None:  # an ack is due: it goes with the add, in one write
            self._ack_timer.cancel()
            self._ack_timer = None
            frame = pack(("ack", self.acked)) + frame
        line.transport.write(frame)

    def close(self) -> None:
        if self._line is not None:
            self._line.fail(ConnectionError(f"the channel to {self.instance_id} was closed"))

    async def run(self) -> None:
        """Wait until the line breaks (raises ConnectionError); frames reach the sink
        meanwhile, as they come."""
        assert self._line is not None
        try:
            await self._line.closed
        finally:
            self.close()

    def on_frame(self, _kind: str, last: int, outs: list[RequestOutput], statuses: list[InstanceStatus],
                 results: list[tuple[str, BaseException | None]]) -> None:
        sink, iid = self._sink, self.instance_id
        self.last_frame_at = time.monotonic()
        if statuses:
            sink.on_statuses(iid, statuses)
        for rid, err in results:
            sink.on_add_result(iid, rid, err)
        if outs:
            sink.on_outputs(iid, outs)
        if last > self.acked:
            self.acked = last
            if self._ack_timer is None:  # one ack per ACK_DELAY_S, not a syscall per frame
                self._ack_timer = asyncio.get_running_loop().call_later(self.ACK_DELAY_S, self._send_ack)

    def _send_ack(self) -> None:
        self._ack_timer = None
        if self.is_open:
            assert self._line is not None and self._line.transport is not None
            self._line.transport.write(pack(("ack", self.acked)))
