"""An engine's SSE body as lines, in bounded memory and linear time.

The body arrives in pieces (a read is at most ``READ_BYTES``); a piece's complete lines
are split off in one C call, and only a line that spans pieces is buffered, in a
bytearray that grows in place (joining the buffer to each piece again made a 300 MB line
cost the gateway a minute of CPU). A line longer than ``max_line_bytes`` is the engine's
failure, refused as soon as the buffer passes the cap, not after the line ends.
"""
from __future__ import annotations

from llumnix.lite.http import READ_BYTES

MIN_LINE_BYTES = READ_BYTES
"""The smallest line cap: a line inside one read is never longer than it, so only lines
that span reads need checking."""


class LineTooLong(Exception):
    """A line passed the cap (the bytes so far are dropped)."""


class SseLines:
    __slots__ = ("_partial", "max_line_bytes", "num_bytes")

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < MIN_LINE_BYTES:
            raise ValueError(f"max_line_bytes must be >= {MIN_LINE_BYTES}")
        self.max_line_bytes = max_line_bytes
        self.num_bytes = 0
        """Bytes fed so far (the whole reply's budget is the caller's)."""
        self._partial = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes (without their ``\\n``); the rest is kept."""
        self.num_bytes += len(data)
        partial = self._partial
        if partial:
            end = data.find(b"\n")
            if end < 0:
                self._keep(data)
                return []
            self._keep(data[:end])
            first = bytes(partial)
            partial.clear()
            lines = data[end + 1:].split(b"\n")
            rest = lines.pop()
            lines.insert(0, first)
        else:
            lines = data.split(b"\n")
            rest = lines.pop()
        if rest:
            self._keep(rest)
        return lines

    def _keep(self, data: bytes) -> None:
        if len(self._partial) + len(data) > self.max_line_bytes:
            self._partial.clear()
            raise LineTooLong(f"the endpoint streamed a line over {self.max_line_bytes} bytes")
        self._partial += data
