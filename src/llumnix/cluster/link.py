"""The gateway's end of an instance's request channel (``channel.py``), on asyncio:
adds go out as frames, outputs, statuses and add results come back in one frame
per engine step, each handed to the ``LinkSink`` as it arrives."""
from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import time
from typing import Protocol

from llumnix.cluster.channel import HEADER, MAX_FRAME, NONCE, mac, pack
from llumnix.core.batch import RequestOutput
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest


class LinkSink(Protocol):
    def on_outputs(self, instance_id: str, outputs: list[RequestOutput]) -> None: ...

    def on_statuses(self, instance_id: str, statuses: list[InstanceStatus]) -> None: ...

    def on_add_result(self, instance_id: str, request_id: str, error: BaseException | None) -> None: ...


class InstanceLink:
    def __init__(self, instance_id: str, address: tuple[str, int], token: bytes, client: str,
                 sink: LinkSink) -> None:
        self.instance_id = instance_id
        self.address = address
        self._token, self._client, self._sink = token, client, sink
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.acked = 0
        """Sequence number of the last output this gateway has: a reconnect resumes after it."""
        self.last_frame_at = time.monotonic()
        self._ack_timer: asyncio.TimerHandle | None = None

    ACK_DELAY_S = 0.05
    """Acks only let the instance drop what this gateway has: they need not be prompt."""

    @property
    def is_open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def open(self, timeout_s: float = 5.0) -> None:
        """Connect and prove, both ways, that each end holds the cluster's token."""
        async def handshake() -> None:
            reader, writer = await asyncio.open_connection(*self.address)
            nonce = os.urandom(NONCE)
            server_nonce = await reader.readexactly(NONCE)
            writer.write(nonce + mac(self._token, server_nonce) + pack((self._client, self.acked)))
            proof = await reader.readexactly(32)
            if proof != mac(self._token, nonce):
                writer.close()
                raise ConnectionError(f"instance {self.instance_id}'s channel failed to prove the cluster token")
            self._reader, self._writer = reader, writer

        await asyncio.wait_for(handshake(), timeout_s)
        self.last_frame_at = time.monotonic()

    def add(self, request: GenerateRequest) -> None:
        """Send ``request`` (its result comes back through ``on_add_result``)."""
        if self._writer is None or self._writer.is_closing():
            raise ConnectionError(f"the channel to {self.instance_id} is closed")
        self._writer.write(pack(("add", request)))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _send_ack(self) -> None:
        self._ack_timer = None
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack(("ack", self.acked)))

    async def run(self) -> None:
        """Read frames until the line breaks (raises ConnectionError / EOF)."""
        assert self._reader is not None and self._writer is not None
        reader, writer, sink, iid = self._reader, self._writer, self._sink, self.instance_id
        try:
            while True:
                (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                if n > MAX_FRAME:
                    raise ConnectionError(f"a {n}-byte frame from {iid} is over the channel's limit")
                _, last, outs, statuses, results = pickle.loads(await reader.readexactly(n))
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
        except asyncio.IncompleteReadError as e:
            raise ConnectionError(f"the channel to {iid} closed") from e
        finally:
            with contextlib.suppress(Exception):
                writer.close()

