"""The request path's HTTP client (``lite/http.py``) against raw asyncio servers: chunked
streams in pieces, kept-alive connections reused and replaced when the server closed
them, a refused port and a reply that is not HTTP."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from llumnix.cluster.startup import free_port
from llumnix.lite.http import HttpError, HttpPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


def _chunked(*parts: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    port = free_port()
    server = await asyncio.start_server(handler, "127.0.0.1", port)
    return server, f"http://127.0.0.1:{port}/v1/completions"


def test_a_chunked_stream_arrives_whole_and_the_connection_is_reused():
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            reply = _chunked(b"data: " + body + b"\n\n", b"data: [DONE]\n\n")
            for i in range(0, len(reply), 7):  # in small pieces, with pauses
                writer.write(reply[i:i + 7])
                await writer.drain()
                await asyncio.sleep(0)

    async def run() -> list[bytes]:
        server, url = await _serve(handler)
        pool = HttpPool(1.0)
        got = []
        for i in range(3):
            async with pool.post(url, b'{"n": %d}' % i, {"X-Test": "1"}) as reply:
                assert reply.status == 200
                got.append(await reply.read())
        pool.close()
        server.close()
        return got

    got = asyncio.run(run())
    assert got == [b'data: {"n": %d}\n\ndata: [DONE]\n\n' % i for i in range(3)]
    assert len(connections) == 1


def test_a_connection_the_server_closed_while_idle_is_replaced():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive as far as the client knows, then gone

    async def run() -> list[bytes]:
        server, url = await _serve(handler)
        pool = HttpPool(1.0)
        got = []
        for _ in range(3):
            async with pool.post(url, b"{}", {}) as reply:
                got.append(await reply.read())
            await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        server.close()
        return got

    assert asyncio.run(run()) == [b"ok"] * 3


def test_a_refused_port_and_a_reply_that_is_not_http_are_http_errors():
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"this is not http at all\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> tuple[HttpError, HttpError]:
        pool = HttpPool(1.0)
        with pytest.raises(HttpError) as refused:
            async with pool.post(f"http://127.0.0.1:{free_port()}/x", b"{}", {}):
                pass
        server, url = await _serve(garbage)
        with pytest.raises(HttpError) as bad:
            async with pool.post(url, b"{}", {}):
                pass
        server.close()
        return refused.value, bad.value

    refused, bad = asyncio.run(run())
    assert refused.refused and not bad.refused and "not an HTTP reply" in str(bad)


def test_a_read_waits_at_most_its_deadline_and_time_between_reads_does_not_count():
    """The first byte within the open's timeout, each later read within idle_timeout_s of
    its start; a caller that holds a piece longer than that between reads is not cut off."""
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"3\r\ntwo\r\n0\r\n\r\n")
        await writer.drain()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def run() -> tuple[list[bytes], float, float]:
        pool = HttpPool(1.0)
        server, url = await _serve(slow)
        reply = await pool.open(url, b"{}", {}, timeout_s=1.0, idle_timeout_s=0.3)
        got = [await reply.body()]
        reply.idle()
        await asyncio.sleep(0.5)  # the caller holds the piece past the idle timeout
        got += [await reply.body(), await reply.body()]
        reply.release()
        server.close()
        server, url = await _serve(hang)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(HttpError, match="timeout"):
            async with pool.post(url, b"{}", {}, timeout_s=0.2) as r:
                assert await r.body() == b"one"
                await r.body()
        waited = loop.time() - t0
        t0 = loop.time()
        reply = await pool.open(url, b"{}", {}, timeout_s=5.0, idle_timeout_s=0.2)
        await reply.body()
        reply.idle()
        with pytest.raises(HttpError, match="timeout"):
            await reply.body()
        reply.release()
        server.close()
        return got, waited, loop.time() - t0

    got, first_byte_wait, idle_wait = asyncio.run(run())
    assert got == [b"one", b"two", None]
    assert 0.15 < first_byte_wait < 1.5 and 0.15 < idle_wait < 1.5


def test_endless_headers_and_a_huge_body_are_read_no_further_than_their_caps():
    sent = {"head": 0, "body": 0}

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, part: str) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 500 Oops\r\n" + (b"" if part == "head" else b"Content-Length: 1000000000\r\n\r\n"))
        line = b"X-Pad: " + b"a" * 1000 + b"\r\n" if part == "head" else b"b" * 1024
        try:
            for _ in range(200_000):  # 200 MB, unless the client hangs up
                writer.write(line)
                sent[part] += len(line)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async def run() -> tuple[HttpError, bytes]:
        pool = HttpPool(1.0)
        server, url = await _serve(lambda r, w: endless(r, w, "head"))
        with pytest.raises(HttpError) as head:
            await pool.open(url, b"{}", {}, timeout_s=30.0)
        server.close()
        server, url = await _serve(lambda r, w: endless(r, w, "body"))
        reply = await pool.open(url, b"{}", {}, timeout_s=30.0)
        body = await reply.read(100_000)
        reply.release()
        server.close()
        return head.value, body

    head, body = asyncio.run(run())
    assert "headers are over" in str(head) and head.fault == "oversized"
    assert 100_000 <= len(body) < 100_000 + (64 << 10) and sent["body"] < 50 << 20 and sent["head"] < 50 << 20


def test_a_body_that_goes_on_past_its_end_marker_is_drained_no_further_than_the_cap():
    sent = [0]

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.05)  # [DONE] reaches the caller alone; then garbage without end
        junk = b": more\n" * 1000
        try:
            for _ in range(20_000):  # 140 MB unless the client hangs up
                writer.write(b"%x\r\n%s\r\n" % (len(junk), junk))
                sent[0] += len(junk)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async def run() -> float:
        pool = HttpPool(1.0)
        server, url = await _serve(chatty)
        reply = await pool.open(url, b"{}", {}, timeout_s=5.0, idle_timeout_s=5.0)
        assert await reply.body() == b"data: [DONE]\n\n"
        t0 = asyncio.get_running_loop().time()
        reply.release_after_end()
        await asyncio.gather(*pool.draining)
        waited = asyncio.get_running_loop().time() - t0
        server.close()
        return waited

    waited = asyncio.run(run())
    assert waited < 2.0 and sent[0] < 50 << 20
