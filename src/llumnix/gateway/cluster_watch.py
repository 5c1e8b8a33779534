"""``/admin/cluster?after=VERSION&wait=S``: the cluster's view as soon as it differs from
the version a client last saw (a long poll), so the page and ``llumnix top`` show a
change as it happens instead of at their next poll.

One refresher task per gateway, running only while someone watches, keeps the latest view
and its version; every watcher shares it (a thousand open watches cost one refresher).
The refresher follows the backend's own change notice where it has one
(``watch_cluster``: LlumSched answers when its view changes, ``cluster/cluster_pulse.py``),
else reads ``cluster_info`` every ``POLL_S``. The version moves only when the view differs
in what a reader sees (``view_key``: clocks and counters of polls left out), at most once
per ``MIN_GAP_S``: an idle cluster wakes nobody. Watchers waiting at once are bounded
(``MAX_WAITERS``, then 429); the server's shutdown answers them at once (``close``)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from llumnix.core.aio import within

log = logging.getLogger(__name__)

VOLATILE = frozenset({"age_s", "num_passes", "num_frames", "published_at", "behind_s"})
"""Fields that move with the clock or with every poll, not with the cluster's state."""


def view_key(doc: Any) -> str:
    """What a reader of ``doc`` sees, as a string: equal keys, nothing to redraw. An
    instance silent for over 5 s is shown as such: its age counts as that flag only."""
    return repr(_strip(doc))


def _strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: (v > 5 if k == "age_s" and isinstance(v, int | float) else _strip(v))
                for k, v in doc.items() if k not in VOLATILE or k == "age_s"}
    if isinstance(doc, list | tuple):
        return [_strip(v) for v in doc]
    return doc


class TooManyWatches(Exception):
    pass


class ClusterWatch:
    MAX_WAITERS = 64
    """Long polls waiting at once; one more is answered 429."""
    MAX_WAIT_S = 30.0
    """The longest a long poll waits (a client asking more gets this)."""
    MIN_GAP_S = 0.1
    """Coalescing: at most one new version this often (ten a second)."""
    POLL_S = 0.5
    """Between two reads of a backend with no change notice (lite, mixed; LlumSched away)."""
    SOURCE_WAIT_S = 20.0
    """How long one ``watch_cluster`` call may wait in the backend for a change."""
    FIRST_READ_S = 10.0
    """How long a watch waits for a refresher's first read (before it: no view to answer)."""
    IDLE_STOP_S = 10.0
    """The refresher stops once nobody has watched for this long."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._boot = secrets.token_hex(4)  # a restarted gateway's versions never match an old one's
        self._num_versions = 0
        self._key: str | None = None
        self.doc: dict[str, Any] | None = None
        """The latest view read, or None before the first."""
        self.failure: Exception | None = None
        """Why the latest read failed (None: it did not)."""
        self._fresh = False  # read by the running refresher (a stopped one's view may be old)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_wanted = 0.0
        self.num_waiting = 0
        self.closed = False

    @property
    def version(self) -> str:
        return f"{self._boot}-{self._num_versions}"

    async def wait(self, after: str, wait_s: float) -> dict[str, Any]:
        """The view once its version differs from ``after`` (at once if it already does),
        or after ``wait_s`` whatever it is; raises the read's failure, or ``TooManyWatches``."""
        loop = asyncio.get_running_loop()
        self._ensure_running()
        # a refresher just started owes a first read, however short the wait asked for
        deadline = loop.time() + max(min(wait_s, self.MAX_WAIT_S), 0.0 if self._fresh else self.FIRST_READ_S)
        if not self._answerable(after):
            if self.num_waiting >= self.MAX_WAITERS:
                raise TooManyWatches(f"{self.num_waiting} watches of /admin/cluster are open, the most this "
                                     "gateway keeps; poll /admin/cluster without after= instead")
            self.num_waiting += 1
            try:
                while not self._answerable(after) and (left := deadline - loop.time()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await within(self._changed.wait(), left)
            finally:
                self.num_waiting -= 1
        self._last_wanted = loop.time()
        if self.doc is None or (self.failure is not None and self._fresh):
            raise self.failure or TimeoutError("no view of the cluster yet")
        return self.doc

    def _answerable(self, after: str) -> bool:
        return self.closed or (self._fresh and (self.failure is not None or self.version != after))

    def close(self) -> None:
        """The server is stopping: every watch answers now, and the refresher ends."""
        self.closed = True
        self._wake()
        if self._task is not None:
            self._task.cancel()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a test client's requests may each run on a loop of their own
            self._loop, self._task, self._changed = loop, None, asyncio.Event()
        self._last_wanted = loop.time()
        if self._task is None and not self.closed:
            self._fresh = False
            self._task = loop.create_task(self._refresh(), name="cluster-watch")

    def _publish(self, doc: dict[str, Any]) -> None:
        key = view_key(doc)
        if key != self._key:
            self._key = key
            self._num_versions += 1
        self.doc, self.failure, self._fresh = doc, None, True
        self._wake()

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        watch = getattr(self._backend, "watch_cluster", None)
        seen: Any = None
        try:
            while not self.closed and (self.num_waiting or loop.time() - self._last_wanted < self.IDLE_STOP_S):
                started, pause = loop.time(), self.MIN_GAP_S
                try:
                    if watch is not None:
                        try:
                            seen, doc = await watch(seen, self.SOURCE_WAIT_S)
                        except Exception as e:  # noqa: BLE001 - no notice now: read, and try again later
                            log.debug("cluster watch: the backend's notice failed (%s)", type(e).__name__)
                            seen, pause = None, self.POLL_S
                            doc = await self._backend.cluster_info()
                    else:
                        doc, pause = await self._backend.cluster_info(), self.POLL_S
                    self._publish(doc)
                except Exception as e:  # noqa: BLE001 - the watchers answer it (admin._answer's rules)
                    self.failure, self._fresh, pause = e, True, self.POLL_S
                    self._wake()
                await asyncio.sleep(max(0.0, started + pause - loop.time()))
        finally:
            self._task = None
