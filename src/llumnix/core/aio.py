"""Awaiting with a time limit without losing a cancellation.

On Python 3.11 ``asyncio.wait_for`` returns the awaited result when it completes in the
same loop iteration as the awaiting task's cancellation (CPython gh-86296, fixed in
3.12): the cancellation is swallowed and the task goes on. For the gateway that meant a
choice whose client had left ran to its end (a whole generation nobody reads), counted
as finished rather than aborted. ``within`` awaits in the caller's own task under
``asyncio.timeout``, so a cancellation always propagates; every time-limited await in
``llumnix`` goes through it (``tests/core/test_aio.py``)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``await aw``, raising ``TimeoutError`` after ``timeout_s`` seconds (None: no limit)."""
    async with asyncio.timeout(timeout_s):
        return await aw
