"""One serving instance: an engine stepping in its own thread, its llumlet, and an
outbox of token outputs per consumer (each gateway reads only its own requests').
Transport-agnostic: the Ray actor in ``actors.py`` and the request channel in
``channel.py`` read it, tests drive it directly.

Everything that touches the engine runs on the step thread, between two steps
(so at a step boundary): callers enqueue a command and wait for its result.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from llumnix.core.batch import RequestOutput
from llumnix.core.evolve import evolve
from llumnix.core.status import MAX_STEP_SAMPLES, InstanceStatus
from llumnix.engine import EngineCore
from llumnix.policy.llumlet import Llumlet

T = TypeVar("T")

log = logging.getLogger(__name__)


class InstanceServer:
    def __init__(self, engine: EngineCore, llumlet: Llumlet,
                 on_status: Callable[[InstanceStatus], None] | None = None,
                 status_interval_s: float = 0.05, idle_status_interval_s: float = 1.0,
                 on_step: Callable[[list[RequestOutput], bool], None] | None = None) -> None:
        self.engine = engine
        self.llumlet = llumlet
        self.instance_id = engine.instance_id
        self._on_status = on_status
        self.on_step = on_step
        """Called on the step thread after each step with its outputs and whether it ran
        prompt work (PD: a first token, or a prompt's chunk, wakes the hand-off worker)."""
        self._status_interval = status_interval_s
        self._idle_status_interval = idle_status_interval_s
        """With no request here a status changes only through a command (which reports
        at once): a heartbeat this often is enough, and costs nothing per request."""
        self.statuses: collections.deque[tuple[int, InstanceStatus]] = collections.deque(maxlen=64)
        """The latest pushed statuses, numbered: what the request channels forward (with
        the evicted prefix keys of every push since the one a channel sent last)."""
        self._status_seq = 0
        self._marks_of: Callable[[InstanceStatus], int] | None = None
        self._last_marks = -1
        self.marks_seq = 0
        """The number of the newest status whose rescheduling marks (``policy/trigger.py``)
        differ from the one before it: what LlumSched's line wants at once (``track_marks``)."""
        self._commands: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._standing: list[tuple[Callable[[], Any], Future[Any]]] = []
        """``call_until``'s calls, run at every step boundary until each has its answer (step thread only)."""
        self._outboxes: dict[str, _Outbox] = {}
        """Outputs not yet acknowledged, by the request's ``client`` tag."""
        self._final_only: set[str] = set()
        self._held: dict[str, RequestOutput] = {}
        """Of the requests whose consumer reads only the finished output (``hold_until_final``):
        their outputs so far, merged; step thread only."""
        self._last_read: dict[str, float] = {}
        self._outbox_cv = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"engine-{self.instance_id}", daemon=True)
        self._last_report = 0.0
        self._report_due = False
        """Commands ran since the last status: the next delivery carries one."""
        self.last_step_time = time.monotonic()
        self.step_log: collections.deque[tuple[float, float, int, float, bool, int, int]] = \
            collections.deque(maxlen=4096)
        """(start, end, batch size, CPU seconds of the step thread, prefill?, tokens computed,
        decodes among them) of recent steps, monotonic seconds: for benchmarks. A step whose
        wall time grows without its CPU time waited (for the GIL or a core)."""
        self.error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._commands.put((lambda: None, Future()))
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # -- commands (any thread) ---------------------------------------------------
    def run_at_boundary(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        if not self.is_alive:
            fut.set_exception(RuntimeError(f"instance {self.instance_id} is not running"))
            return fut
        self._commands.put((fn, fut))
        return fut

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        return self.run_at_boundary(fn).result(timeout)

    def call_until(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` at this boundary and, on the step thread, at every later one until
        it returns something other than False; return that. The step thread runs it right
        after each step, so a condition a step makes true is acted on at that very
        boundary, however late the caller's thread gets a core (a caller polling with
        ``call`` can miss steps under CPU contention). Raises TimeoutError after
        ``timeout`` seconds; then ``fn`` has stopped running, so nothing it would have done
        happens after the caller gave up."""
        fut: Future[Any] = Future()
        entry = (fn, fut)

        def first() -> None:
            if fut.set_running_or_notify_cancel():
                self._standing.append(entry)
                self._run_standing()

        deadline = time.monotonic() + timeout
        try:
            self.run_at_boundary(first).result(timeout)
            return fut.result(max(0.0, deadline - time.monotonic()))
        except TimeoutError:  # (the withdrawal runs after ``first``: commands run in order)
            self.call(lambda: self._withdraw(entry))  # on the step thread: it cannot run once more
            if fut.done():  # answered at the boundary the withdrawal waited for
                return fut.result()
            raise

    def get_outputs(self, timeout: float = 0.5, client: str = "") -> list[RequestOutput]:
        """Outputs of ``client``'s requests produced since its last call, taken: waits up
        to ``timeout`` for some (a caller that can lose a reply uses ``poll_outputs``)."""
        last, out = self.poll_outputs(timeout, client, ack=None)
        self.ack_outputs(client, last)
        return out

    def poll_outputs(self, timeout: float = 0.5, client: str = "",
                     ack: int | None = 0) -> tuple[int, list[RequestOutput]]:
        """``client``'s outputs after sequence number ``ack`` (those up to it are dropped:
        the caller has them), and the sequence number of the last one returned. Nothing is
        dropped until acknowledged, so a reply lost on the way (a reset connection, a call
        Ray retried) is sent again by the next poll. Waits up to ``timeout`` for some.
        Raises once the step thread has died, so nobody waits on it forever."""
        if ack is not None:
            self.ack_outputs(client, ack)
        last, out, _ = self.wait_outputs(client, after=None, timeout=timeout)
        return last, out

    def ack_outputs(self, client: str, upto: int) -> None:
        """``client`` has every output up to sequence number ``upto``: they are dropped."""
        with self._outbox_cv:
            self._box(client).ack(upto)

    def track_marks(self) -> None:
        """Mark each status whose rescheduling marks or lifecycle (terminating, schedulable)
        changed (``marks_seq``): a reader asked for those at once. One freeness per status
        on the step thread, from then on."""
        from llumnix.policy.trigger import marks_of

        llumlet = self.llumlet
        self._marks_of = lambda st: int(marks_of(st, llumlet.rescheduling, llumlet.freeness_cfg)) \
            | st.is_terminating << 8 | (not st.is_schedulable) << 9

    def wait_outputs(self, client: str, after: int | None, timeout: float, status_after: int | None = None,
                     wake: Callable[[], bool] | None = None,
                     marks_after: int | None = None) -> tuple[int, list[RequestOutput], int]:
        """``client``'s outputs numbered after ``after`` (None: every unacknowledged one),
        the number of the last, and the number of the newest pushed status; waits up to
        ``timeout`` for an output, a status newer than ``status_after`` (None: statuses do
        not end the wait; there always is one, so a poll woken by it would spin), a status
        with new marks numbered after ``marks_after`` (``track_marks``; None: not waited for) or
        ``wake()`` (checked under the outbox lock, which whoever makes it true must notify)."""
        now = time.monotonic()
        deadline = now + timeout
        with self._outbox_cv:
            self._last_read[client] = now
            box = self._box(client)
            while self.is_alive:
                if box.has_after(after) or (status_after is not None and self._status_seq > status_after) \
                        or (marks_after is not None and self.marks_seq > marks_after) \
                        or (wake is not None and wake()):
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not self._outbox_cv.wait(left):
                    break
            out, last = box.after(after), box.last
            self._forget_idle_clients(now)
            status_seq = self._status_seq
        if not out and not self.is_alive:
            raise RuntimeError(f"instance {self.instance_id} stopped: {self.error!r}")
        return last, out, status_seq

    def _box(self, client: str) -> _Outbox:
        """``client``'s outbox, made on first use (caller holds the outbox lock)."""
        box = self._outboxes.get(client)
        if box is None:
            box = self._outboxes[client] = _Outbox()
        return box

    @property
    def status_interval_s(self) -> float:
        """How often a busy engine reports."""
        return self._status_interval

    def newest_status(self, after: int) -> tuple[int, InstanceStatus | None]:
        """The newest pushed status and its number, or ``(after, None)`` when none is
        numbered after ``after``. It carries the evicted prefix keys and the step samples of
        every status since ``after`` (events, which the newest alone would drop; the rest
        is state, which it supersedes)."""
        with self._outbox_cv:
            newer = [(n, st) for n, st in self.statuses if n > after]
        if not newer:
            return after, None
        seq, newest = newer[-1]
        if len(newer) > 1:
            keys = tuple(k for _, st in newer for k in st.evicted_prefix_keys)
            if len(keys) != len(newest.evicted_prefix_keys):
                newest = evolve(newest, evicted_prefix_keys=keys)
            steps = tuple(x for _, st in newer for x in st.step_samples)[-MAX_STEP_SAMPLES:]
            if len(steps) != len(newest.step_samples):
                newest = evolve(newest, step_samples=steps)
        return seq, newest

    def notify_readers(self, fn: Callable[[], T], wake: bool = True) -> T:
        """Run ``fn`` under the outbox lock and (``wake``) wake every waiting reader."""
        with self._outbox_cv:
            result = fn()
            if wake:
                self._outbox_cv.notify_all()
            return result

    def status(self) -> InstanceStatus:
        return self.call(lambda: self.llumlet.report(time.time()))

    # -- the step thread ----------------------------------------------------------
    def _loop(self) -> None:
        cycle_from: float | None = None
        try:
            while not self._stop.is_set():
                busy = self.engine.has_unfinished_requests() and not self._only_paused()
                self._drain_commands(block=not busy)
                if self._final_only:
                    self._flush_departed()  # migrated out by a command, or by the last step
                if self._stop.is_set():
                    break
                if self.engine.has_unfinished_requests() and not self._only_paused():
                    t0, c0 = time.monotonic(), time.thread_time()
                    outputs = self.engine.step()
                    self.last_step_time = time.monotonic()
                    if self.llumlet.records_steps and self.engine.last_batch is not None:
                        # a busy engine's step holds it from the previous step's end (the
                        # status, the outputs and commands at the boundary are its cost too)
                        began = t0 if cycle_from is None else cycle_from
                        self.llumlet.on_step(self.engine.last_batch, self.last_step_time - began)
                    cycle_from = self.last_step_time
                    self._log_step(t0, c0, len(outputs))
                    self._deliver(outputs, force_report=any(o.is_finished for o in outputs))
                    if self.on_step is not None:
                        self.on_step(outputs, self.engine.last_step_was_prefill)
                    if self._standing:
                        self._run_standing()
                else:
                    cycle_from = None
                    self._deliver([], force_report=False)
        except BaseException as e:  # noqa: BLE001 - recorded, surfaced through is_alive/health
            self.error = e
            log.exception("instance %s: the step loop died", self.instance_id)
        finally:
            self._fail_pending()
            with self._outbox_cv:
                self._outbox_cv.notify_all()

    def _log_step(self, t0: float, c0: float, num_outputs: int) -> None:
        b = self.engine.last_batch
        # the batch's shape: tokens computed, decodes among them (a decode step's entries are
        # not built for this: one token each)
        shape = (0, 0) if b is None else (b.num_batched_tokens, b.num_decodes) if b.is_prefill \
            else (b.num_entries, b.num_entries)
        self.step_log.append((t0, self.last_step_time, num_outputs, time.thread_time() - c0,
                              self.engine.last_step_was_prefill, *shape))

    def _only_paused(self) -> bool:
        s = self.engine.scheduler
        return not s.running and not s.waiting

    def _drain_commands(self, block: bool) -> None:
        """Run the queued commands; ``block``: with nothing to step, wait for one until the
        next status report is due (an idle engine sleeps through its heartbeat interval)."""
        try:
            fn, fut = self._commands.get(timeout=self._until_report()) if block \
                else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except Exception as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)
            self._report_due = True  # reported once after the commands, with the next step's outputs
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                break
        if self._standing:  # the commands may have answered them (an abort, with no step to follow)
            self._run_standing()

    # -- final-only requests (step thread) -------------------------------------------
    def hold_until_final(self, request_id: str) -> None:
        """``request_id``'s consumer reads only its finished output (``GenerateRequest.
        final_only``): its outputs are merged here and published once, when it finishes, or
        when it leaves this engine otherwise (migrated, handed off: with the tokens made
        here, so the next instance's continue them). One frame a request instead of one a
        token, for both ends."""
        self._final_only.add(request_id)

    def forget(self, request_id: str) -> None:
        """Its consumer is gone (an abort): what is held for it is dropped, not sent."""
        self._final_only.discard(request_id)
        self._held.pop(request_id, None)

    def _flush_departed(self) -> None:
        gone = [rid for rid in self._final_only if rid not in self.engine.requests]
        if not gone:
            return
        for rid in gone:
            self._final_only.discard(rid)
        self._deliver([out for rid in gone if (out := self._held.pop(rid, None)) is not None], force_report=False)

    def _report_interval(self) -> float:
        return self._status_interval if self.engine.has_unfinished_requests() else self._idle_status_interval

    def _until_report(self) -> float:
        return max(0.0, self._last_report + self._report_interval() - time.monotonic())

    def _deliver(self, outputs: list[RequestOutput], force_report: bool) -> None:
        """Outputs and, when one is due, a status, under one lock and one wake-up: a
        channel sends them in one frame. A status is due every status interval, after a
        request finished, and after commands (coalesced: a burst of adds is one report,
        sent with the step that starts them; at once where no step follows)."""
        now = time.monotonic()
        status = None
        if force_report or self._report_due or now - self._last_report >= self._report_interval():
            self._last_report, self._report_due = now, False
            status = self.llumlet.push(time.time())
        marks = -1 if status is None or self._marks_of is None else int(self._marks_of(status))
        if not outputs and status is None:
            return
        held, final_only = self._held, self._final_only
        with self._outbox_cv:
            published = status is not None
            for out in outputs:
                rid = out.request_id
                if rid in final_only:
                    if rid in held:
                        out = held.pop(rid).then(out)
                    if not out.is_finished:
                        held[rid] = out
                        continue
                    final_only.discard(rid)
                self._box(out.client).items.append(out)
                published = True
            if status is not None:
                self._status_seq += 1
                self.statuses.append((self._status_seq, status))
                if marks != self._last_marks:
                    self._last_marks, self.marks_seq = marks, self._status_seq
            if published:  # a step whose outputs were all held wakes no channel writer
                self._outbox_cv.notify_all()
        if status is not None and self._on_status is not None:
            self._on_status(status)

    _IDLE_CLIENT_S = 120.0

    def _forget_idle_clients(self, now: float) -> None:
        """Drop the outbox of a consumer that has read nothing for two minutes (a gateway
        that went away), so its unread outputs do not pile up. Caller holds the lock."""
        idle = [c for c, t in self._last_read.items() if now - t > self._IDLE_CLIENT_S]
        for c in idle:
            del self._last_read[c]
            self._outboxes.pop(c, None)

    def _withdraw(self, entry: tuple[Callable[[], Any], Future[Any]]) -> None:
        if entry in self._standing:
            self._standing.remove(entry)

    def _run_standing(self) -> None:
        """``call_until``'s calls, at this boundary: each that answers (or raises) is done."""
        for entry in list(self._standing):
            fn, fut = entry
            try:
                got = fn()
            except Exception as e:  # noqa: BLE001 - handed to the caller
                self._standing.remove(entry)
                fut.set_exception(e)
                continue
            if got is not False:
                self._standing.remove(entry)
                fut.set_result(got)

    def _fail_pending(self) -> None:
        for _, fut in self._standing:
            fut.set_exception(RuntimeError(f"instance {self.instance_id} stopped"))
        self._standing.clear()
        while True:
            try:
                _, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RuntimeError(f"instance {self.instance_id} stopped"))


class _Outbox:
    """One consumer's outputs not yet acknowledged; ``items[i]`` has sequence number
    ``first + i`` (numbers start at 1 and only grow, so an ack of an older number is a no-op)."""

    __slots__ = ("first", "items")

    def __init__(self) -> None:
        self.items: list[RequestOutput] = []
        self.first = 1

    @property
    def last(self) -> int:
        """The sequence number of the newest output (``first - 1`` when there is none)."""
        return self.first + len(self.items) - 1

    def _skip(self, after: int | None) -> int:
        return 0 if after is None else max(0, after - self.first + 1)

    def has_after(self, after: int | None) -> bool:
        return len(self.items) > self._skip(after)

    def after(self, after: int | None) -> list[RequestOutput]:
        """The outputs numbered after ``after`` (None: every one kept)."""
        return self.items[self._skip(after):]

    def ack(self, upto: int) -> None:
        k = max(0, min(len(self.items), upto - self.first + 1))
        if k:
            del self.items[:k]
            self.first += k
