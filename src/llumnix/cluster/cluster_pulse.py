"""LlumSched's ``/admin/cluster`` view as a watch: a gateway's call waits until the view
differs from the version it last saw (``ClusterWatch``, the dashboard's long polls).

Where LlumSched's state moves (a status read, a migration or hand-off reported, a member
come or gone, a round) it calls ``note``, which costs nothing while nobody watches and
otherwise only wakes the watch. The watch then builds the view and compares what a reader
sees (``view_key``); a view equal to the last one (an idle instance's status each second)
sends it back to waiting. Builds are at least ``MIN_GAP_S`` apart: a busy cluster's
statuses cost one build per gap, not one per status."""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from llumnix.gateway.cluster_watch import view_key


class ClusterPulse:
    MIN_GAP_S = 0.1

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._boot = random.getrandbits(32)  # a restarted LlumSched's versions never match an old one's
        self._num_versions = 0
        self._num_notes = 0
        self._key: str | None = None
        self._last_build = 0.0
        self.num_watching = 0
        self.closed = False

    def note(self) -> None:
        """Something in the view may have changed (any thread, any lock held)."""
        if self.num_watching:
            with self._cv:
                self._num_notes += 1
                self._cv.notify_all()

    def close(self) -> None:
        """Every watch answers now (its owner is stopping)."""
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def watch(self, seen: Any, timeout_s: float,
              build: Callable[[], dict[str, Any]]) -> tuple[tuple[int, int], dict[str, Any]]:
        """``build()``'s view and its version once that differs from ``seen``, or after
        ``timeout_s`` as it is."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self.num_watching += 1
        try:
            while True:
                time.sleep(max(0.0, self._last_build + self.MIN_GAP_S - time.monotonic()))
                with self._cv:
                    notes = self._num_notes
                self._last_build = time.monotonic()
                doc = build()
                key = view_key(doc)
                with self._cv:
                    if key != self._key:
                        self._key = key
                        self._num_versions += 1
                    version = (self._boot, self._num_versions)
                    left = deadline - time.monotonic()
                    same = (tuple(seen) if isinstance(seen, list | tuple) else seen) == version
                    if not same or left <= 0 or self.closed:
                        return version, doc
                    self._cv.wait_for(lambda: self._num_notes != notes or self.closed, left)  # noqa: B023 - called here
        finally:
            with self._cv:
                self.num_watching -= 1
