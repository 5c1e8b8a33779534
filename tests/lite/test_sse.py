"""What the gateway reads of an engine's stream, on literal bytes: SSE lines split in
linear time under a cap, chunks whose types are checked rather than coerced, and usage
taken only where it is possible."""
from __future__ import annotations

import time

import pytest

from llumnix.lite.client import Chunk, EndpointError, ReplyLimits, parse_chunk
from llumnix.lite.outputs import checked_usage
from llumnix.lite.sse import MIN_LINE_BYTES, LineTooLong, SseLines


def _split(pieces: list[bytes], cap: int = MIN_LINE_BYTES) -> list[bytes]:
    lines = SseLines(cap)
    return [line for p in pieces for line in lines.feed(p)]


def test_lines_come_whole_however_the_body_is_cut():
    body = b'data: {"a": 1}\n\n: keep-alive\r\ndata: [DONE]\n\n'
    want = [b'data: {"a": 1}', b"", b": keep-alive\r", b"data: [DONE]", b""]
    for size in (1, 2, 3, 7, len(body)):
        assert _split([body[i:i + size] for i in range(0, len(body), size)]) == want


def test_a_line_past_the_cap_is_refused_as_soon_as_the_buffer_passes_it():
    lines = SseLines(MIN_LINE_BYTES)
    piece = b"x" * 1000
    fed = 0
    with pytest.raises(LineTooLong, match=f"over {MIN_LINE_BYTES} bytes"):
        while True:
            lines.feed(piece)
            fed += len(piece)
    assert MIN_LINE_BYTES - len(piece) < fed <= MIN_LINE_BYTES
    assert _split([b"y" * (MIN_LINE_BYTES - 1), b"\n"]) == [b"y" * (MIN_LINE_BYTES - 1)]  # at the cap: fine
    with pytest.raises(ValueError, match="max_line_bytes"):
        SseLines(MIN_LINE_BYTES - 1)


def test_a_long_line_costs_linear_time():
    """64 MiB in 64 KiB reads: joining the buffer to each read again (as before) copied
    about 32 GiB; in place it is 64 MiB and a split of each read."""
    lines = SseLines(128 << 20)
    piece = b"z" * (64 << 10)
    t0 = time.process_time()
    for _ in range(1024):
        assert lines.feed(piece) == []
    assert lines.feed(b"\n") == [piece * 1024]
    assert time.process_time() - t0 < 2.0


def test_reply_budget_grows_with_max_tokens():
    limits = ReplyLimits(1.0, 1.0, 1 << 20)
    assert limits.max_reply_bytes(0) == 2 << 20 and limits.max_reply_bytes(10) == (2 << 20) + 40960


@pytest.mark.parametrize("payload", [
    b'{"choices": [{"text": "a", "token_ids": [1, true]}]}',
    b'{"choices": [{"text": "a", "token_ids": [1.0]}]}',
    b'{"choices": [{"text": "a", "token_ids": ["1"]}]}',
    b'{"choices": [{"text": "a", "token_ids": 5}]}',
    b'{"choices": [{"text": 5}]}',
    b'{"choices": [{"text": "a", "finish_reason": 3}]}',
    b'{"choices": [{"text": "a", "stop_reason": [1]}]}',
    b'{"choices": [5]}',
    b'[1, 2]',
    b'not json'])
def test_a_chunk_of_the_wrong_types_is_garbage_not_coerced(payload):
    with pytest.raises(EndpointError) as e:
        parse_chunk(payload)
    assert e.value.fault == "garbage" and e.value.endpoint_fault


@pytest.mark.parametrize(("usage", "n", "cached", "error"), [
    (b'{"completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}', 7, 3, ""),
    (b'{"completion_tokens": 7, "prompt_tokens_details": null}', 7, 0, ""),
    (b'{"completion_tokens": 1e18}', None, None, "not integers"),
    (b'{"completion_tokens": true}', None, None, "not integers"),
    (b'{"completion_tokens": "7"}', None, None, "not integers"),
    (b'{"prompt_tokens": 3}', None, None, "not integers"),
    (b'{"completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 2.5}}', None, None, "not integers"),
    (b'[7]', None, None, "not an object")])
def test_usage_is_read_only_as_integers(usage, n, cached, error):
    chunk = parse_chunk(b'{"choices": [], "usage": ' + usage + b"}")
    assert (chunk.num_completion_tokens, chunk.num_cached_tokens) == (n, cached)
    assert error in chunk.usage_error and bool(error) == bool(chunk.usage_error)


@pytest.mark.parametrize(("n", "cached", "error", "want"), [
    (6, 2, "", (6, 2, "")),  # possible: the engine's figures (a chunk may carry several tokens)
    (None, None, "", (4, 0, "")),  # none sent: what was streamed
    (3, 0, "", (4, 0, "completion_tokens 3 is impossible")),  # fewer than streamed
    (17, 0, "", (4, 0, "completion_tokens 17 is impossible")),  # more than max_tokens
    (-1, 0, "", (4, 0, "impossible")),
    (10**18, 0, "", (4, 0, "impossible")),
    (6, 11, "", (6, 0, "cached_tokens 11 is impossible")),  # more than the prompt
    (6, -1, "", (6, 0, "cached_tokens -1 is impossible")),
    (None, None, "usage is not integers", (4, 0, "usage is not integers"))])
def test_usage_is_taken_only_where_possible(n, cached, error, want):
    final = Chunk(finish_reason="stop", num_completion_tokens=n, num_cached_tokens=cached, usage_error=error)
    got = checked_usage(final, num_streamed=4, max_tokens=16, num_prompt=10)
    assert got[:2] == want[:2] and want[2] in got[2] and bool(got[2]) == bool(want[2])
