"""``within``: a time-limited await that never swallows a cancellation, and the only one
in ``llumnix`` (Python 3.11's ``asyncio.wait_for`` returns a result that lands in the same
loop iteration as the cancellation, so a cancelled gateway choice ran on)."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from llumnix.core.aio import within

SRC = Path(__file__).resolve().parents[2] / "src" / "llumnix"


async def _cancel_as_the_result_lands(limit):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    async def waiter() -> str:
        try:
            await limit(fut, 5.0)
        except asyncio.CancelledError:
            return "cancelled"
        return "ran on"

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the task waits on fut now
    fut.set_result(1)  # the result and the cancellation in one loop iteration
    task.cancel()
    return await task


def test_a_cancellation_that_lands_with_the_result_still_cancels():
    assert asyncio.run(_cancel_as_the_result_lands(within)) == "cancelled"


def test_the_result_comes_back_and_the_limit_raises_timeout_error():
    async def main() -> None:
        assert await within(asyncio.sleep(0, "done"), 1.0) == "done"
        assert await within(asyncio.sleep(0, "unbounded"), None) == "unbounded"
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(5), 0.05)

    asyncio.run(main())


def test_no_module_awaits_with_asyncio_wait_for():
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if re.search(r"\basyncio\.wait_for\(|^from asyncio import .*\bwait_for\b", p.read_text(), re.M))
    assert users == [], f"use llumnix.core.aio.within, not asyncio.wait_for: {users}"
