"""The live-migration protocol as a pure state machine (paper section 4.3).

The driver (the simulator in virtual time, or the runtime coordinator over a
real transport) performs each action the machine asks for and reports the
outcome; the machine decides what comes next and keeps the record. It reads
no clock and does no I/O: times come in as arguments.

::

    start ──► RESERVE ──ok──► COPY ──copied──► post-stage check
                 │ refused        │                 │ request finished, aborted,
                 ▼                ▼ failure         │ or preempted: ABORTED
              ABORTED          ABORTED              ├─ few new blocks or stage limit ──► PAUSE
                                                    │        (the driver takes the request out of
                                                    │         its batch at a step boundary)
                                                    │        paused ──► RESERVE ──► COPY (last) ──► COMMIT
                                                    └─ otherwise: the next pre-copy stage (RESERVE)

Pre-copy stages send only full blocks, because the request keeps decoding
into its last block; the last stage sends everything left. Following a prefill
(``follow_prefill``), a stage copied while the request is still prefilling leads
to the next one (its next chunk's blocks, whatever the stage limit); after its first
token the usual rule applies (the driver pauses it at once behind prompt work). With prefix caching
the destination may already hold the request's leading blocks (``on_cached``,
before the first stage): they are adopted there and never sent. A request that
has no KV yet (queued) starts at COMMIT: it migrates as metadata. With
``max_stages == 1`` it starts at PAUSE: a blocking stop-and-copy, the baseline.
Downtime is the time the request is out of every batch: from PAUSE (right after its
last step on the source) to the start of the destination's first step that computes
it (``on_resumed``, after COMMITTED: the install waits for the destination's next
step boundary, and that step may still leave it out). It covers the last stage and
that wait, however long the sequence, which is what keeps it flat. A queued request
(no KV) never stalls and has none.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llumnix.migration import reasons


@dataclass(frozen=True)
class MigrationConfig:
    max_stages: int = 3
    """Most copy stages, the last (stop-and-copy) one included."""
    last_stage_max_blocks: int = 2
    """Go to the last stage once at most this many unsent blocks remain."""
    timeout_s: float = 10.0
    """A migration not committed within this many seconds is aborted by its driver (one
    following a prefill: within this many seconds of its last chunk's stage)."""
    follow_prefill: bool = False
    """A request still prefilling (chunked prefill) is pre-copied chunk by chunk: each
    stage sends the full blocks of the chunks finished since the last one while the next
    computes (these stages do not count toward ``max_stages``). With prompt work waiting on
    the source, the request is paused at the step boundary right after its first token and
    the last stage copies only the tail; without, the tail is pre-copied while it decodes
    (a PD hand-off). False: a prefilling request migrates as any running one."""
    merge_boundaries: bool = True
    """The source's work shares step boundaries (each costs up to a step's wait, 0.1-0.3 s
    on a loaded CPU): a round out of a source (``driver.migrate_next``) picks a request at
    the boundary that starts its migration and reads its first stage's blocks, reserving
    at the destination the whole table and a block; the post-stage check that finds the
    next stage the last pauses the request there when those blocks hold the rest. False:
    each at a boundary of its own (pick, start, first blocks; check, top-up, pause), the
    old way, the benchmarks' baseline."""

    def __post_init__(self) -> None:
        if self.max_stages < 1:
            raise ValueError("max_stages must be >= 1")
        if self.last_stage_max_blocks < 0:
            raise ValueError("last_stage_max_blocks must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")


class MigrationPhase(enum.IntEnum):
    RESERVE = 0  # waiting for the destination to reserve blocks for this stage
    COPY = 1  # waiting for this stage's blocks to be copied
    PAUSE = 2  # waiting for the source to take the request out of its batch
    COMMIT = 3  # waiting for the destination to install the request
    COMMITTED = 4
    ABORTED = 5

    @property
    def is_done(self) -> bool:
        return self >= MigrationPhase.COMMITTED


@dataclass
class StageRecord:
    index: int
    num_blocks: int
    is_last: bool
    start_time: float
    end_time: float | None = None
    src_block_ids: list[int] = field(default_factory=list)
    dst_block_ids: list[int] = field(default_factory=list)
    is_prefill: bool = False
    """Copied while the request was still prefilling (``follow_prefill``)."""


@dataclass(frozen=True)
class MigrationReport:
    request_id: str
    src_instance_id: str
    dst_instance_id: str
    committed: bool
    abort_reason: str | None
    num_stages: int
    num_blocks: int
    num_bytes: int
    downtime: float | None
    """Seconds the request was out of every batch: from its pause on the source to the
    start of the destination's first step with it (to the commit, where the driver never
    saw that step: ``marks`` then has no ``resumed``). None unless a running request
    committed: a queued one never stalls."""
    duration: float
    num_blocks_cached: int = 0
    """Leading blocks the destination already cached, adopted instead of sent."""
    start_time: float = 0.0
    end_time: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)
    """Instants recorded on the way, on the driver's clock: ``paused`` and ``resumed`` (the
    downtime's ends); the first stage's ``first_stage`` (begun), ``first_reserved``,
    ``first_sent`` (its KV written) and ``first_copied`` (after the source's post-stage
    check); the driver's own (where the last stage's time went) and its caller's before
    the start (``order_received``, ``dst_read``: from the order to ``start_time``)."""
    was_queued: bool = False
    """The request had no KV yet (it waited in the source's queue): moved as metadata."""
    abort_code: str | None = None
    """Why it aborted, as a ``migration.reasons`` code (what the metrics count); None if committed."""
    num_prefill_stages: int = 0
    """Stages copied while the request was still prefilling (``follow_prefill``)."""
    num_last_stage_blocks: int = 0
    """Blocks the last (stop-and-copy) stage sent: what the pause waited for."""


class MigrationProtocol:
    def __init__(self, request_id: str, src_instance_id: str, dst_instance_id: str,
                 config: MigrationConfig, now: float, *, has_kv: bool = True,
                 bytes_per_block: int = 0) -> None:
        self.request_id = request_id
        self.src_instance_id = src_instance_id
        self.dst_instance_id = dst_instance_id
        self.config = config
        self.bytes_per_block = bytes_per_block
        self.start_time = now
        self.was_queued = not has_kv
        # No KV (a queued request): metadata only. One stage allowed: stop-and-copy.
        if not has_kv:
            self.phase = MigrationPhase.COMMIT
        elif config.max_stages == 1:
            self.phase = MigrationPhase.PAUSE
        else:
            self.phase = MigrationPhase.RESERVE
        self.stages: list[StageRecord] = []
        self.num_blocks_sent = 0
        self.num_blocks_cached = 0
        self.paused_at: float | None = None
        self.resumed_at: float | None = None
        """When the destination's first step with the request began (the driver's clock)."""
        self.end_time: float | None = None
        self.abort_reason: str | None = None
        self.abort_code: str | None = None
        self._pending_blocks: list[int] = []
        self.marks: dict[str, float] = {}
        self.num_prefill_stages = 0
        """Stages copied while the request was still prefilling (``follow_prefill``)."""
        self._progress_time = now
        """Where the timeout counts from: the start, or the last prefill stage's copy."""

    # -- what the driver asks ---------------------------------------------
    @property
    def is_last_stage(self) -> bool:
        return self.paused_at is not None

    @property
    def pending_blocks(self) -> list[int]:
        """Source block ids of the current stage (set by ``begin_stage``)."""
        return self._pending_blocks

    @property
    def num_blocks_done(self) -> int:
        """Leading blocks of the table the destination has: adopted from its cache or sent.
        The next stage sends the table from here on."""
        return self.num_blocks_cached + self.num_blocks_sent

    def is_timed_out(self, now: float) -> bool:
        return not self.phase.is_done and now - self._progress_time > self.config.timeout_s

    def time_left(self, now: float) -> float:
        """Seconds until ``is_timed_out`` without further progress."""
        return max(0.0, self._progress_time + self.config.timeout_s - now)

    def is_last_next(self, num_unsent_blocks: int) -> bool:
        """During a pre-copy stage (not following a prefill): whether ``on_copied`` with this
        many blocks unsent will go to the last stage (PAUSE)."""
        return (num_unsent_blocks <= self.config.last_stage_max_blocks
                or len(self.stages) - self.num_prefill_stages + 1 >= self.config.max_stages)

    # -- transitions ----------------------------------------------------------
    def on_cached(self, num_blocks: int) -> None:
        """Before the first stage: the destination adopted this many of the request's
        leading blocks from its prefix cache (their reservation is part of the request's)."""
        if self.stages or self.phase not in (MigrationPhase.RESERVE, MigrationPhase.PAUSE):
            raise RuntimeError(f"migration of {self.request_id}: cached blocks only before the first stage")
        if num_blocks < 0:
            raise ValueError("num_blocks must be >= 0")
        self.num_blocks_cached = num_blocks

    def begin_stage(self, new_src_blocks: list[int], now: float) -> MigrationPhase:
        """Start a stage with the source blocks not yet sent (full ones, unless paused).

        A pre-copy stage with nothing new to send is skipped: straight to PAUSE.
        """
        self._expect(MigrationPhase.RESERVE)
        if not new_src_blocks and not self.is_last_stage:
            self.phase = MigrationPhase.PAUSE
            return self.phase
        self._pending_blocks = list(new_src_blocks)
        self.stages.append(StageRecord(len(self.stages), len(new_src_blocks), self.is_last_stage, now,
                                       src_block_ids=list(new_src_blocks)))
        if len(self.stages) == 1:
            self.marks["first_stage"] = now
        return self.phase

    def on_reserved(self, dst_block_ids: list[int] | None, now: float) -> MigrationPhase:
        """The destination reserved blocks for this stage (None: refused)."""
        self._expect(MigrationPhase.RESERVE)
        if dst_block_ids is None:
            return self.abort("destination refused to reserve blocks", now, reasons.REFUSED)
        if len(dst_block_ids) != len(self._pending_blocks):
            return self.abort("destination reserved the wrong number of blocks", now)
        self.stages[-1].dst_block_ids = list(dst_block_ids)
        if len(self.stages) == 1:
            self.marks["first_reserved"] = now
        self.phase = MigrationPhase.COPY
        return self.phase

    def on_copied(self, now: float, *, request_alive: bool, num_unsent_blocks: int,
                  is_prefilling: bool = False) -> MigrationPhase:
        """The stage's copy finished. ``request_alive``: still running on the source,
        not finished, aborted or preempted since the migration began.
        ``num_unsent_blocks``: blocks of its table not yet sent (after this stage).
        ``is_prefilling``: its first token is not out yet (read with ``request_alive``)."""
        self._expect(MigrationPhase.COPY)
        stage = self.stages[-1]
        stage.end_time = now
        if stage.index == 0:
            self.marks["first_copied"] = now
        self.num_blocks_sent += stage.num_blocks
        self._pending_blocks = []
        if self.is_last_stage:
            self.phase = MigrationPhase.COMMIT
        elif not request_alive:
            return self.abort("the request finished, was aborted or was preempted", now, reasons.SOURCE_FINISHED)
        elif self.config.follow_prefill and is_prefilling:
            stage.is_prefill = True
            self.num_prefill_stages += 1
            self._progress_time = now
            self.phase = MigrationPhase.RESERVE  # the next chunk's blocks
        elif self.is_last_next(num_unsent_blocks):
            self.phase = MigrationPhase.PAUSE
        else:
            self.phase = MigrationPhase.RESERVE
        return self.phase

    def on_paused(self, now: float, *, request_alive: bool) -> MigrationPhase:
        """The source took the request out of its batch (at a step boundary)."""
        self._expect(MigrationPhase.PAUSE)
        if not request_alive:
            return self.abort("the request ended before its last stage", now, reasons.SOURCE_FINISHED)
        self.paused_at = now
        self.marks["paused"] = now
        self.phase = MigrationPhase.RESERVE
        return self.phase

    def on_committed(self, now: float) -> MigrationPhase:
        """The destination installed the request; the source must now free its copy."""
        self._expect(MigrationPhase.COMMIT)
        self.phase = MigrationPhase.COMMITTED
        self.end_time = now
        return self.phase

    def on_resumed(self, now: float) -> None:
        """The destination's first step with the (running) request began: its downtime ends."""
        if self.phase != MigrationPhase.COMMITTED or self.paused_at is None:
            raise RuntimeError(f"migration of {self.request_id}: resumed before a paused request committed")
        if self.resumed_at is None:
            self.resumed_at = now
            self.marks["resumed"] = now

    @property
    def is_final(self) -> bool:
        """The report will not change: aborted, committed as metadata, or committed and
        resumed on the destination."""
        return self.phase == MigrationPhase.ABORTED or (self.phase == MigrationPhase.COMMITTED and (
            self.paused_at is None or self.resumed_at is not None))

    def abort(self, reason: str, now: float, code: str = reasons.OTHER) -> MigrationPhase:
        """Either side failed, or a check said stop (``reason`` for a person, ``code``
        one of ``migration.reasons``'). The driver frees the destination's reservation
        and, if the source paused it, resumes the request."""
        if self.phase.is_done:
            return self.phase
        self.phase = MigrationPhase.ABORTED
        self.abort_reason = reason
        self.abort_code = code
        self.end_time = now
        return self.phase

    # -- record ---------------------------------------------------------------
    def report(self) -> MigrationReport:
        end = self.end_time if self.end_time is not None else self.start_time
        downtime = None
        if self.phase == MigrationPhase.COMMITTED and self.paused_at is not None:
            downtime = (end if self.resumed_at is None else self.resumed_at) - self.paused_at
        blocks = sum(s.num_blocks for s in self.stages if s.end_time is not None)
        return MigrationReport(
            request_id=self.request_id, src_instance_id=self.src_instance_id,
            dst_instance_id=self.dst_instance_id, committed=self.phase == MigrationPhase.COMMITTED,
            abort_reason=self.abort_reason, num_stages=len(self.stages), num_blocks=blocks,
            num_bytes=blocks * self.bytes_per_block, downtime=downtime, duration=end - self.start_time,
            num_blocks_cached=self.num_blocks_cached, start_time=self.start_time, end_time=end, marks=dict(self.marks),
            was_queued=self.was_queued, abort_code=self.abort_code, num_prefill_stages=self.num_prefill_stages,
            num_last_stage_blocks=sum(s.num_blocks for s in self.stages if s.is_last and s.end_time is not None),
        )

    def check_invariants(self) -> None:
        assert len(self.stages) - self.num_prefill_stages <= self.config.max_stages, "more stages than allowed"
        assert self.num_prefill_stages == sum(1 for s in self.stages if s.is_prefill)
        assert sum(1 for s in self.stages if s.is_last) <= 1, "two last stages"
        assert self.num_blocks_sent == sum(s.num_blocks for s in self.stages if s.end_time is not None)
        if self.phase == MigrationPhase.COMMITTED and self.stages:
            assert self.stages[-1].is_last, "committed without a stop-and-copy stage"
        dst = [b for s in self.stages for b in s.dst_block_ids]
        assert len(dst) == len(set(dst)), "a destination block reserved twice"

    def _expect(self, phase: MigrationPhase) -> None:
        if self.phase != phase:
            raise RuntimeError(f"migration of {self.request_id}: expected {phase.name}, in {self.phase.name}")
