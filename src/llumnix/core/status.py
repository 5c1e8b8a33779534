"""InstanceStatus: the snapshot an instance reports after a step.

Policies are pure functions of these snapshots, so everything they read
(blocks, queues, priorities, head-of-line demand) must be here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llumnix.core.evolve import evolve

if TYPE_CHECKING:
    from llumnix.core.batch import SchedulerOutput

MAX_STEP_SAMPLES = 64
"""Step samples one status carries (and one reader's merge of skipped statuses): the newest."""


@dataclass(slots=True)
class RequestBrief:
    """One request as a status snapshot shows it. Treated as immutable like the
    snapshot (policies build new briefs, never edit one); not ``frozen`` only because a
    frozen dataclass is five times slower to build, and engines build one per request
    per report."""

    request_id: str
    priority: int
    num_blocks: int
    """Blocks the request holds now (0 while queued)."""
    num_tokens: int
    arrival_time: float
    is_running: bool
    is_migrating: bool = False
    num_output_tokens: int = 0
    slo_class: str = ""
    """The request's SLO class by name (``Request.slo_class``; "": none named or resolved)."""


def request_brief(request_id: str, priority: int, num_blocks: int, num_tokens: int, arrival_time: float,
                  is_running: bool, is_migrating: bool, num_output_tokens: int, slo_class: str) -> RequestBrief:
    """``RequestBrief(...)`` of these fields, written one by one instead of calling the
    class (an engine builds one per request per report): in CPython 3.11 a class call goes
    through ``type.__call__`` and runs ``__init__`` in an interpreter frame of its own, a
    function call does not. ``tests/core/test_builders.py`` holds it equal to the class
    call and fails when a field is added and not written here."""
    brief: RequestBrief = object.__new__(RequestBrief)
    brief.request_id = request_id
    brief.priority = priority
    brief.num_blocks = num_blocks
    brief.num_tokens = num_tokens
    brief.arrival_time = arrival_time
    brief.is_running = is_running
    brief.is_migrating = is_migrating
    brief.num_output_tokens = num_output_tokens
    brief.slo_class = slo_class
    return brief


@dataclass(frozen=True, slots=True)
class StepSample:
    """One engine step as the latency predictor (``policy/predictor.py``) reads it: the
    shape of its batch and the seconds it held the engine."""

    num_prefill_tokens: int
    """Tokens the step's prefills computed (whole prompts or chunks)."""
    prefill_attention: int
    """Their attention's work: per prefill, context after the step squared less context
    before it squared (a whole prompt of n tokens: n * n)."""
    num_prefill_seqs: int
    num_decode_seqs: int
    num_context_tokens: int
    """Context tokens the decoding sequences read."""
    seconds: float


def step_sample(batch: SchedulerOutput, seconds: float) -> StepSample:
    """The sample of one executed step (decodes first in a mixed step: ``num_decodes``)."""
    if not batch.is_prefill:
        ctx = (batch.decode.num_context_tokens if batch.decode is not None
               else sum(r.context_len for r in batch.scheduled))
        return StepSample(0, 0, 0, batch.num_entries, ctx, seconds)
    sched = batch.scheduled
    nd = batch.num_decodes
    tokens = work = 0
    for r in sched[nd:]:
        n = len(r.token_ids)
        tokens += n
        work += (r.start_pos + n) ** 2 - r.start_pos ** 2
    return StepSample(tokens, work, len(sched) - nd, nd, sum(r.context_len for r in sched[:nd]), seconds)


@dataclass(frozen=True)
class InstanceStatus:
    instance_id: str
    timestamp: float
    num_total_blocks: int
    num_used_blocks: int
    num_watermark_blocks: int
    block_size: int
    max_num_seqs: int
    running: tuple[RequestBrief, ...] = ()
    waiting: tuple[RequestBrief, ...] = ()
    """Queued requests in service order; the first is the head of line."""
    head_of_line_demand: int = 0
    """Blocks the head-of-line queued request needs to be admitted (0 if none)."""
    num_preemptions: int = 0
    """Preemptions since the instance started."""
    num_prefix_cache_queries: int = 0
    """With prefix caching, tokens looked up in the prefix cache since the instance started
    (each admission of a sequence looks up all its tokens)."""
    num_prefix_cache_hits: int = 0
    """Of those, the tokens the cache held (not computed)."""
    num_reserved_blocks: int = 0
    """Blocks held for incoming migrations (included in num_used_blocks)."""
    num_shared_block_holds: int = 0
    """With prefix caching, how many more blocks the running requests' ``num_blocks`` add
    up to than they hold (a block shared by k requests is in k of them): virtual usage
    subtracts it, so each physical block counts once."""
    num_migrating_in: int = 0
    num_migrating_out: int = 0
    preempts_for_deadlines: bool = False
    """The engine's queue head may preempt running requests for blocks by the SLO classes'
    deadlines (``engine/objectives.py``; not with prefix caching, and never for a place in
    the batch): the latency predictor counts it in the TTFT to expect."""
    is_terminating: bool = False
    is_schedulable: bool = True
    step_id: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    evicted_prefix_keys: tuple[bytes, ...] = ()
    """Prefix-cache keys the engine evicted since its previous pushed report (``Llumlet.
    push``; empty in any other snapshot): an event, not state, so the meta store leaves
    it out. A router that remembers where it sent prefixes forgets these."""
    step_samples: tuple[StepSample, ...] = ()
    """The engine's steps since its previous pushed report, the newest ``MAX_STEP_SAMPLES``
    (``Llumlet.push``, when the ``slo`` policy's predictor reads them; an event like
    ``evicted_prefix_keys``): what the latency predictor is fitted on."""

    def with_running(self, briefs: tuple[RequestBrief, ...], blocks: int) -> InstanceStatus:
        """This snapshot with ``briefs`` running too, holding ``blocks`` more blocks (what
        dispatch sees between two reports: ``policy/pending.py``). A shallow copy with two
        fields set (``core/evolve.py``), once per dispatch."""
        return evolve(self, running=self.running + briefs, num_used_blocks=self.num_used_blocks + blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.num_total_blocks - self.num_used_blocks

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def batch_size(self) -> int:
        return len(self.running)
