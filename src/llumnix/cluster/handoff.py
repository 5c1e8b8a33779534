"""A prefill instance's hand-off worker: each request leaves for a decode instance
through the live migration, side by side (the flow and LlumSched's part: ``cluster/pd.py``)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from llumnix.core.batch import RequestOutput
from llumnix.core.request import RequestStatus
from llumnix.logging_setup import migration_line

log = logging.getLogger(__name__)

STOP_AND_COPY = {"max_stages": 1}
"""The hand-off's migration overrides behind prefill work."""
FOLLOW_PREFILL = {"follow_prefill": True}
"""The hand-off's migration overrides for a request still in its prefill chunks."""
Destination = tuple[str, Any]
"""A hand-off's destination: its instance id and actor handle."""
Candidate = tuple[str, int, bool]
"""A request to hand off: its id, the blocks it holds, whether it is still prefilling."""


class HandoffWorker:
    """On an instance whose role is ``prefill``: hands each request off to a decode
    instance, up to ``max_in_flight`` at once, each on its own thread: a request past its
    first token, and (``follow_prefill``) one still prefilling, whose finished chunks are
    then pre-copied while the next ones compute, and which is paused at the boundary right
    after its first token when prompt work waits here, so that the last stage copies only
    the tail (``MigrationConfig.follow_prefill``; a one-chunk prompt is then copied whole,
    but without waiting out the next step, a prefill chunk). Side by side, because a
    followed prompt's hand-off lasts as long as its remaining chunks: one at a time, a
    request past its first token waited behind it, decoding here a token per prefill chunk.
    ``ask(request_id, num_blocks)`` asks LlumSched for a destination, ``migrate(request_id,
    dst_id, dst, overrides)`` runs the live migration (``MigrationConfig`` overrides or None;
    several may run at once) and returns its report, ``done(report)`` tells LlumSched. A
    request the decode pool has no room for keeps decoding (or prefilling) here."""

    GLANCE_S = 1.0
    """With no wake, a look this often for work the hooks did not announce (a safety net)."""

    def __init__(self, server: Any, ask: Callable[[str, int], Destination | None],
                 migrate: Callable[[str, str, Any, dict[str, Any] | None], dict[str, Any]],
                 done: Callable[[dict[str, Any]], None], retry_s: float = 0.2,
                 stop_and_copy: bool = True, follow_prefill: bool = True, max_in_flight: int = 8) -> None:
        self.server = server
        self.stop_and_copy = stop_and_copy
        """Pause at once behind prefill work (``PDConfig.stop_and_copy_behind_prefill``)."""
        self.follow_prefill = follow_prefill
        """Start a prompt's hand-off while it prefills (``PDConfig.precopy_prefill_chunks``)."""
        self._ask = ask
        self._migrate = migrate
        self._done = done
        self.retry_s = retry_s
        self.max_in_flight = max_in_flight
        """Hand-offs running at once (every prompt prefilling here is followed, and requests
        past their first token move beside them)."""
        self.role = "mixed"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pd-handoff", daemon=True)
        self._lock = threading.Lock()
        self._in_flight: dict[str, threading.Thread] = {}
        self._failed = False
        """A hand-off failed since the last round: offer the rest again after ``retry_s``."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop, and wait for the hand-offs in flight to end (committed or aborted, both
        block pools exact again)."""
        self._stop.set()
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        if self._thread.is_alive() and self._thread is not me:  # it starts no hand-off once ended
            self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            threads = list(self._in_flight.values())
        for t in threads:
            if t is not me:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def set_role(self, role: str) -> None:
        self.role = role
        self._wake.set()  # a flip to prefill hands off the decodes it holds

    def on_step(self, outputs: list[RequestOutput], prefill: bool) -> None:
        """The step thread's hook, after each step: a request's first token, or (following
        prompts) a step of prompt work (a chunk samples nothing: no output tells), wakes
        the worker at once."""
        if self.role == "prefill" and ((prefill and self.follow_prefill) or any(
                o.num_output_tokens == len(o.new_token_ids) and not o.is_finished for o in outputs)):
            self._wake.set()

    def _may_have_work(self) -> bool:
        """A lock-free glance (off the step thread) at whether a request is prefilling here
        with no hand-off yet."""
        busy = self._in_flight
        return any(not r.output_token_ids and r.request_id not in busy
                   for r in list(self.server.engine.scheduler.running))

    def candidates(self) -> tuple[list[Candidate], bool]:
        """Every request to hand off (none in flight): those past their first token (oldest
        first), then those still prefilling (oldest first); and whether prompt work waits
        here (a queued prompt, or one still in its chunks). Read off the step thread,
        without waiting for a boundary (a prompt's chunk may take a second on a CPU):
        migrate() reads the request's state again at its own first boundary."""
        eng, migrating = self.server.engine, self.server.llumlet.migrating_out
        with self._lock:
            busy = set(self._in_flight)
        reqs = [r for r in list(eng.requests.values()) if r.status == RequestStatus.RUNNING
                and r.request_id not in migrating and r.request_id not in busy
                and (r.output_token_ids or self.follow_prefill)]
        reqs.sort(key=lambda r: (not r.output_token_ids, r.arrival_time))
        sched = eng.scheduler
        prefilling = bool(sched.waiting) or any(not r.output_token_ids for r in list(sched.running))
        return [(r.request_id, eng.kv.num_blocks_of(r.request_id), not r.output_token_ids) for r in reqs], prefilling

    def _loop(self) -> None:
        waiting = False
        while not self._stop.is_set():
            woken = self._wake.wait(self.retry_s if waiting else self.GLANCE_S)
            self._wake.clear()
            if self._stop.is_set() or self.role != "prefill":
                waiting = False
                continue
            with self._lock:
                failed, self._failed = self._failed, False
            if failed:  # offered again after retry_s
                waiting = True
                continue
            if not (woken or waiting or (self.follow_prefill and self._may_have_work())):
                continue
            try:
                waiting = self.hand_off_all()
            except Exception:  # noqa: BLE001 - offered again at the next wake
                log.exception("PD hand-off round failed")
                waiting = True

    def overrides(self, is_prefilling: bool, prompt_work_waits: bool) -> dict[str, Any] | None:
        """The hand-off's ``MigrationConfig`` overrides. With prompt work waiting here, this
        instance's next steps are prefill chunks: a request decoding beside them waits one
        such step per token, so it is paused at once and copied in one stage (stop-and-copy)
        rather than pre-copied while it decodes here (as the simulator's flow)."""
        if is_prefilling:
            return FOLLOW_PREFILL
        return STOP_AND_COPY if prompt_work_waits and self.stop_and_copy else None

    def hand_off_all(self) -> bool:
        """Start a hand-off for each candidate while fewer than ``max_in_flight`` run; True
        when some must be offered again later (the decode pool is full)."""
        todo, prompt_work = self.candidates()
        for request_id, num_blocks, is_prefilling in todo:
            if self._stop.is_set() or self.role != "prefill" or self.num_in_flight >= self.max_in_flight:
                return False  # a hand-off's end wakes the worker
            dst = self._ask(request_id, num_blocks)
            if dst is None:
                return True  # the decode pool is full: the rest would not fit either
            t = threading.Thread(target=self._hand_off, name=f"pd-handoff-{request_id}", daemon=True,
                                 args=(request_id, dst, self.overrides(is_prefilling, prompt_work)))
            with self._lock:
                self._in_flight[request_id] = t
            t.start()
        return False

    def _hand_off(self, request_id: str, dst: Destination, overrides: dict[str, Any] | None) -> None:
        """One hand-off, on its own thread; its end wakes the worker (a committed one may
        leave room for the next) or marks a retry (a failed one is offered again)."""
        try:
            report = self._migrate(request_id, dst[0], dst[1], overrides)
        except Exception as e:  # noqa: BLE001 - counted as a failed hand-off; offered again
            report = {"committed": False, "abort_reason": f"{type(e).__name__}: {e}"}
        report.setdefault("request_id", request_id)
        report.setdefault("dst_instance_id", dst[0])
        if report.get("abort_code") != "source_finished":  # a request that ended first needs no hand-off
            log.info("%s", migration_line(report, "PD hand-off"))
        try:
            self._done(report)
        finally:
            with self._lock:
                self._in_flight.pop(request_id, None)
                self._failed = self._failed or not report.get("committed")
            if report.get("committed"):
                self._wake.set()
