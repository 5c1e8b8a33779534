"""The request path's HTTP/1.1 client: a POST whose reply is read as it streams, over
kept-alive connections, parsed by httptools (uvicorn's parser, already a serving
dependency). httpx's stack (anyio, httpcore, h11) cost about a third of the gateway's
CPU per request in front of engines that do no work; probes and scrapes, off the request
path, keep using httpx.

A connection goes back to its pool only after a reply read to its end on a connection the
server keeps open; one that a server closed while idle (a refused reuse: EOF before any
byte) is replaced by a fresh one once."""
from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from urllib.parse import urlsplit

import httptools

_Key = tuple[str, int, bool]
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HttpError(Exception):
    """The connection failed, or the reply is not HTTP."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        """The connection was refused: nothing listens there."""


class _Parsed:
    """httptools' callbacks: the reply's progress."""

    __slots__ = ("body", "has_headers", "is_complete", "keeps_alive", "parser")

    def __init__(self) -> None:
        self.body: deque[bytes] = deque()
        self.has_headers = False
        self.is_complete = False
        self.keeps_alive = False
        """Read at the reply's end (the parser forgets it after)."""
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        self.has_headers = True

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.is_complete = True
        self.keeps_alive = bool(self.parser.should_keep_alive())


class Reply:
    def __init__(self, reader: asyncio.StreamReader, first: bytes) -> None:
        self._reader = reader
        self._parsed = _Parsed()
        self._parser = self._parsed.parser
        self.status = 0
        self._feed(first)

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise HttpError(f"not an HTTP reply ({e})") from None

    async def _more(self) -> None:
        data = await self._reader.read(1 << 16)
        if not data:
            raise HttpError("the endpoint closed the connection mid-reply")
        self._feed(data)

    async def start(self) -> Reply:
        while not self._parsed.has_headers:
            await self._more()
        self.status = self._parser.get_status_code()
        return self

    @property
    def is_complete(self) -> bool:
        return self._parsed.is_complete

    @property
    def keeps_alive(self) -> bool:
        return self._parsed.keeps_alive

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes."""
        parsed = self._parsed
        while True:
            while parsed.body:
                yield parsed.body.popleft()
            if parsed.is_complete:
                return
            await self._more()

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])


class HttpPool:
    def __init__(self, connect_timeout_s: float, max_idle_per_host: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[_Key, list[_Conn]] = {}
        self._ssl: ssl.SSLContext | None = None

    @contextlib.asynccontextmanager
    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> AsyncGenerator[Reply, None]:
        """POST ``body`` (JSON) to ``url``; the reply once its headers are in."""
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        key = (parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls)
        head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                f"Content-Length: {len(body)}", "Accept: text/event-stream",
                *(f"{k}: {v}" for k, v in headers.items())]
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        reader, writer, first = await self._send(key, request)
        reply = Reply(reader, first)
        done = False
        try:
            yield await reply.start()
            done = reply.is_complete and reply.keeps_alive
        finally:
            if done and len(self._idle.setdefault(key, [])) < self.max_idle_per_host:
                self._idle[key].append((reader, writer))
            else:
                writer.close()

    async def _send(self, key: _Key, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """A connection with the request written and the reply's first bytes read."""
        idle = self._idle.get(key)
        while idle:
            reader, writer = idle.pop()
            with contextlib.suppress(OSError):
                writer.write(request)
                first = await reader.read(1 << 16)
                if first:
                    return reader, writer, first
            writer.close()  # closed by the server while idle: take another
        reader, writer = await self._connect(key)
        try:
            writer.write(request)
            first = await reader.read(1 << 16)
        except OSError as e:
            writer.close()
            raise HttpError(f"{type(e).__name__}: {e}") from None
        if not first:
            writer.close()
            raise HttpError("the endpoint closed the connection without a reply")
        return reader, writer, first

    async def _connect(self, key: _Key) -> _Conn:
        host, port, tls = key
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await asyncio.open_connection(host, port, ssl=self._ssl if tls else None, limit=1 << 20)
        except ConnectionRefusedError as e:
            raise HttpError(f"cannot connect ({e})", refused=True) from None
        except TimeoutError:
            raise HttpError(f"cannot connect (no answer within {self.connect_timeout_s:g} s)") from None
        except OSError as e:
            raise HttpError(f"cannot connect ({type(e).__name__}: {e})", refused=True) from None

    def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()
