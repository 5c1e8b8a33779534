"""The request path's HTTP/1.1 client: a POST whose reply is read as it streams, over
kept-alive connections, parsed by httptools (uvicorn's parser, already a serving
dependency). httpx's stack (anyio, httpcore, h11) cost about a third of the gateway's
CPU per request in front of engines that do no work; probes and scrapes, off the request
path, keep using httpx.

A connection goes back to its pool only after a reply read to its end on a connection the
server keeps open; one that a server closed while idle (a refused reuse: EOF before any
byte) is replaced by a fresh one once.

Timeouts are per read, not per reply: a read waits at most until the reply's deadline
(the first byte's, then ``idle_timeout_s`` from the read's start), checked by one timer
per reply that re-arms itself only when it fires early. Time the caller spends between
reads (a slow client downstream) never counts, and a streamed chunk costs no timer work.
"""
from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from urllib.parse import urlsplit

import httptools

READ_BYTES = 1 << 16
"""The most bytes one read returns."""
MAX_HEAD_BYTES = 64 << 10
"""A reply whose status line and headers are longer is not one we read."""
MAX_DRAIN_BYTES = 64 << 10
"""What ``release_after_end`` reads past the caller's end (an SSE ``[DONE]``) before it
closes the connection instead of keeping it."""

_Key = tuple[str, int, bool]
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HttpError(Exception):
    """The connection failed, or the reply is not HTTP."""

    def __init__(self, message: str, refused: bool = False, fault: str = "") -> None:
        super().__init__(message)
        self.refused = refused
        """The connection was refused: nothing listens there."""
        self.fault = fault
        """What the server did wrong where it answered what no sane one does (garbage,
        oversized)."""


class ReadTimeout(HttpError):
    """A read waited past the reply's deadline."""


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
    """One reply being read; ``release()`` hands its connection back (or closes it)."""

    def __init__(self, pool: HttpPool, key: _Key, conn: _Conn, deadline: float, idle_timeout_s: float) -> None:
        self._pool = pool
        self._key = key
        self._reader, self._writer = conn
        self._parsed = _Parsed()
        self._parser = self._parsed.parser
        self._loop = asyncio.get_running_loop()
        self.status = 0
        self.deadline = deadline
        """Loop time by which the next read must return (until ``idle_timeout_s`` takes over)."""
        self.idle_timeout_s = idle_timeout_s
        self._first = True
        self._reading = False
        self._timer: asyncio.TimerHandle | None = None

    # -- reading ------------------------------------------------------------------------
    async def _read(self) -> bytes:
        """The next bytes of the connection (b"" at EOF); ReadTimeout past the deadline."""
        if not self._first:
            self.deadline = self._loop.time() + self.idle_timeout_s
        timer = self._timer
        if timer is None or timer.when() > self.deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(self.deadline, self._check)
        self._reading = True
        try:
            return await self._reader.read(READ_BYTES)
        finally:
            self._reading = False

    def _check(self) -> None:
        self._timer = None
        if not self._reading:
            return  # the next read arms a timer again
        if self._loop.time() < self.deadline:
            self._timer = self._loop.call_at(self.deadline, self._check)
            return
        self._reader.set_exception(ReadTimeout("the endpoint stopped answering (timeout)"))

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise HttpError(f"not an HTTP reply ({e})", fault="garbage") from None

    async def _more(self) -> None:
        data = await self._read()
        if not data:
            raise HttpError("the endpoint closed the connection mid-reply")
        self._feed(data)

    async def start(self, first: bytes) -> Reply:
        self._feed(first)
        num_bytes = len(first)
        while not self._parsed.has_headers:
            if num_bytes > MAX_HEAD_BYTES:
                raise HttpError(f"the endpoint's reply headers are over {MAX_HEAD_BYTES} bytes", fault="oversized")
            data = await self._read()
            if not data:
                raise HttpError("the endpoint closed the connection mid-reply")
            self._feed(data)
            num_bytes += len(data)
        self.status = self._parser.get_status_code()
        return self

    def idle(self) -> None:
        """From here on each read waits at most ``idle_timeout_s`` (the first byte is in)."""
        self._first = False

    def expire_at(self, deadline: float) -> None:
        """Every read from here on must return by ``deadline`` (loop time)."""
        self._first, self.deadline = True, deadline

    @property
    def is_complete(self) -> bool:
        return self._parsed.is_complete

    @property
    def keeps_alive(self) -> bool:
        return self._parsed.keeps_alive

    async def body(self) -> bytes | None:
        """The next piece of the body as it comes; None at its end."""
        parsed = self._parsed
        while not parsed.body:
            if parsed.is_complete:
                return None
            await self._more()
        return parsed.body.popleft()

    async def chunks(self) -> AsyncIterator[bytes]:
        while (data := await self.body()) is not None:
            yield data

    async def read(self, limit: int | None = None) -> bytes:
        """The body (its first ``limit`` bytes and a little more: the rest is not read)."""
        got: list[bytes] = []
        num_bytes = 0
        while (limit is None or num_bytes < limit) and (data := await self.body()) is not None:
            got.append(data)
            num_bytes += len(data)
        return b"".join(got)

    def release(self) -> None:
        """The connection back to the pool when the reply was read to its end and the
        server keeps it open; closed otherwise."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writer is None:
            return
        if self._parsed.is_complete and self._parsed.keeps_alive:
            self._pool.put(self._key, (self._reader, self._writer))
        else:
            self._writer.close()
        self._writer = None  # type: ignore[assignment]

    def release_after_end(self) -> None:
        """``release()`` once the rest of the body (the chunked terminator after an SSE
        ``[DONE]``) is in: at once when it is, else from a task, off the caller's path."""
        if self._parsed.is_complete or self._parsed.body:
            self.release()
        else:
            task = self._loop.create_task(self._drain())
            self._pool.draining.add(task)
            task.add_done_callback(self._pool.draining.discard)

    async def _drain(self) -> None:
        num_bytes = 0
        try:  # a body that goes on past its end marker is not worth its connection
            while num_bytes <= MAX_DRAIN_BYTES and (data := await self.body()) is not None:
                num_bytes += len(data)
        except (HttpError, OSError):
            pass
        finally:
            self.release()


class HttpPool:
    def __init__(self, connect_timeout_s: float, max_idle_per_host: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[_Key, list[_Conn]] = {}
        self._ssl: ssl.SSLContext | None = None
        self.draining: set[asyncio.Task[None]] = set()
        """Replies finished for their caller whose connection waits for the body's end."""
        self._heads: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[_Key, bytes]] = {}
        """Per URL and headers: the connection key and the request's head up to its length."""

    async def open(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float,
                   idle_timeout_s: float | None = None) -> Reply:
        """POST ``body`` (JSON) to ``url``; the reply once its headers are in, which
        must be within ``timeout_s`` (connecting included). The caller ``release()``s it."""
        key, head = self._head(url, headers)
        request = b"%s%d\r\n\r\n%s" % (head, len(body), body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        idle_s = timeout_s if idle_timeout_s is None else idle_timeout_s
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            reply = Reply(self, key, conn, deadline, idle_s)
            with contextlib.suppress(OSError):
                conn[1].write(request)
                first = await reply._read()
                if first:
                    return await self._started(reply, first)
            conn[1].close()  # closed by the server while idle: take another
        conn = await self._connect(key)
        reply = Reply(self, key, conn, deadline, idle_s)
        try:
            conn[1].write(request)
            first = await reply._read()
        except OSError as e:
            conn[1].close()
            raise HttpError(f"{type(e).__name__}: {e}") from None
        except BaseException:
            conn[1].close()
            raise
        if not first:
            conn[1].close()
            raise HttpError("the endpoint closed the connection without a reply")
        return await self._started(reply, first)

    @staticmethod
    async def _started(reply: Reply, first: bytes) -> Reply:
        try:
            return await reply.start(first)
        except BaseException:
            reply.release()
            raise

    @contextlib.asynccontextmanager
    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   timeout_s: float = 3600.0) -> AsyncGenerator[Reply, None]:
        """``open`` as a context: the connection is released on the way out."""
        reply = await self.open(url, body, headers, timeout_s)
        try:
            yield reply
        finally:
            reply.release()

    def _head(self, url: str, headers: dict[str, str]) -> tuple[_Key, bytes]:
        cache_key = (url, tuple(headers.items()))
        got = self._heads.get(cache_key)
        if got is None:
            parts = urlsplit(url)
            tls = parts.scheme == "https"
            key = (parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls)
            head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                    "Accept: text/event-stream", *(f"{k}: {v}" for k, v in headers.items()), "Content-Length: "]
            got = self._heads[cache_key] = (key, "\r\n".join(head).encode())
            if len(self._heads) > 4096:  # URLs come from the config: this only guards a leak
                self._heads.clear()
        return got

    def put(self, key: _Key, conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle_per_host:
            idle.append(conn)
        else:
            conn[1].close()

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
