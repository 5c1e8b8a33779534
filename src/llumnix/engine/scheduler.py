"""Local scheduler: continuous batching with vLLM 0.1.x step semantics.

A step is either a prefill batch (admit queued requests in priority, then
FCFS, order while the token budget, the batch size and the KV watermark
allow) or, when nothing can be admitted, a decode batch of every running
request. When a decode step cannot get a block, the lowest-priority, most
recently arrived running request is preempted by recompute: its blocks are
freed and it re-queues to be prefilled again from its prompt and outputs.

With ``chunked_prefill`` a step mixes them: every running request's decode
first, then prefills (per priority level: those under way, then newly admitted
ones), each taking at most what is left of the token budget, so a long prompt is
prefilled over several steps while the batch keeps decoding. Admission is unchanged (a
request is admitted, and holds blocks for its whole sequence, only when they
fit), so memory, freeness and migration see the same request states; a request
mid-prefill is RUNNING with ``num_computed_tokens`` short of its sequence.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping

from llumnix.core.batch import ScheduledRequest, SchedulerOutput, decode_output
from llumnix.core.config import SchedulerConfig
from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Request, RequestStatus
from llumnix.engine.objectives import ORDERS, Objectives
from llumnix.kv.kv_manager import KVManager


def service_key(req: Request) -> tuple[bool, int, float]:
    """Order of service: higher priority first, then earlier arrival (with objectives,
    ``Objectives.key``; ``is_overdue`` is only ever set with them)."""
    return (req.is_overdue, -req.priority, req.arrival_time)


def chunk_size(req: Request, n: int, budget: int, others: bool) -> int:
    """Tokens of ``req``'s ``n`` left to prefill that this step computes: what the
    budget leaves; all of them for a request that asks for prompt logprobs (computed
    at once), or 0 if that would exceed the budget beside other prefills."""
    if req.sampling_params.prompt_logprobs is not None and n > budget:
        return 0 if others else n
    return min(n, budget)


class LocalScheduler:
    def __init__(self, config: SchedulerConfig, kv: KVManager, now: Callable[[], float]) -> None:
        self.config = config
        self.kv = kv
        self._now = now
        self.waiting: list[Request] = []  # sorted by (service_key, insertion)
        self.running: list[Request] = []
        self.paused: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_prefix_queried_tokens = 0
        """With prefix caching: tokens of the sequences looked up in the cache at their
        admissions, and of those, the tokens the cache held (vLLM's prefix-cache queries
        and hits, cumulative)."""
        self.num_prefix_hit_tokens = 0
        self._waiting_keys: list[tuple[bool, int, float, int]] = []
        self.waiting_version = 0
        """Counts the changes to ``waiting`` (a queued request's tokens and blocks do not
        change while it waits), so a status can reuse the briefs of an unchanged queue."""
        self.objectives: Objectives | None = None
        """Latency objectives per SLO class (``set_objectives``; None: the plain order)."""
        self._key: Callable[[Request], tuple[bool, int, float]] = service_key
        self.num_overdue = 0
        """Requests found overdue so far (``engine/objectives.py``)."""
        self.num_preempted_for_deadlines = 0
        """Running requests preempted so that a queued request gets its first token in time."""
        self._next_overdue = math.inf
        """The earliest time a queued request not yet overdue becomes so (or later: a
        request that left the queue is not taken back out of it)."""
        self._victims: list[str] = []
        """Requests this step's admission preempted (``Objectives.victims``)."""
        self._seq = itertools.count()
        self._blocked: tuple[Request, int] | None = None
        """The head of line the last admission left waiting for memory, and the free
        blocks it needs (fewer than its size when cached blocks hold its prefix)."""
        self._blocked_keys: tuple[Request, list[bytes]] | None = None
        """With prefix caching, the prefix-cache keys of that head of line: it is matched
        against the cache at every step it waits, and its tokens do not change meanwhile
        (a 1,000-token prompt on a cached prefix: ~110 us of hashing a step without them)."""

    # -- queues ------------------------------------------------------------
    def set_objectives(self, limits: Mapping[str, tuple[float, float]], order: str = "deadline") -> None:
        """Per SLO class name, (TTFT, TPOT) objectives in seconds, and how the queue serves
        them: ``overdue`` (a request past its TTFT with no token yet goes last) or
        ``deadline`` (and by deadline, preempting for first tokens); ``fcfs`` or no limits:
        the plain order (``engine/objectives.py``)."""
        if order not in ORDERS:
            raise InvalidRequestError(f"order must be one of {', '.join(ORDERS)}, got {order!r}", "order")
        if any(not isinstance(k, str) for k in limits):
            raise InvalidRequestError("objectives are keyed by SLO class name", "limits")
        self.objectives = Objectives(dict(limits), order == "deadline") if limits and order != "fcfs" else None
        self._key = service_key if self.objectives is None else self.objectives.key
        queued = list(self.waiting)
        self.waiting.clear()
        self._waiting_keys.clear()
        self._next_overdue = math.inf
        for req in queued:
            self.enqueue(req)

    def demote_overdue(self) -> int:
        """Mark the queued requests past their TTFT objective overdue and move them behind the
        rest; how many moved. Scans the queue only once the earliest such time has passed."""
        now = self._now()
        obj = self.objectives
        if obj is None or now < self._next_overdue:
            return 0
        late = [r for r in self.waiting if (d := obj.due(r)) is not None and d < now]
        for req in late:
            self.remove(req)
            req.is_overdue = True
            self.enqueue(req)
        self.num_overdue += len(late)
        self._next_overdue = min((d for r in self.waiting if (d := obj.due(r)) is not None), default=math.inf)
        return len(late)

    def enqueue(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        if self.objectives is not None and (due := self.objectives.due(req)) is not None:
            self._next_overdue = min(self._next_overdue, due)
        key = (*self._key(req), next(self._seq))
        i = bisect.bisect(self._waiting_keys, key)
        self._waiting_keys.insert(i, key)
        self.waiting.insert(i, req)
        self.waiting_version += 1

    def _pop_waiting_head(self) -> Request:
        self._waiting_keys.pop(0)
        self.waiting_version += 1
        return self.waiting.pop(0)

    def remove(self, req: Request) -> None:
        """Take a request out of whichever queue holds it (blocks untouched)."""
        if req.status == RequestStatus.WAITING:
            i = self.waiting.index(req)
            del self.waiting[i]
            del self._waiting_keys[i]
            self.waiting_version += 1
            self._forget_blocked(req)
        elif req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.PAUSED:
            del self.paused[req.request_id]

    def _forget_blocked(self, req: Request) -> None:
        """`req` left the queue: what the last admission counted for it is void (a
        preempted request comes back longer than it was when it last waited)."""
        if self._blocked is not None and self._blocked[0] is req:
            self._blocked = None
        if self._blocked_keys is not None and self._blocked_keys[0] is req:
            self._blocked_keys = None

    @property
    def head_of_line(self) -> Request | None:
        return self.waiting[0] if self.waiting else None

    def head_of_line_demand(self) -> int:
        """Free blocks the head of line needs to be admitted (0 with an empty queue): as
        the last admission counted them when memory stopped it, else its size in blocks."""
        if not self.waiting:  # (``head_of_line`` written out: read at every report)
            return 0
        head = self.waiting[0]
        if self._blocked is not None and self._blocked[0] is head:
            return self._blocked[1]
        return self.kv.num_blocks_for(head.num_tokens)

    # -- one step ------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self.objectives is not None:
            self.demote_overdue()
            out = self._schedule()
            if self._victims:
                out.preempted_request_ids[:0] = self._victims
                self._victims = []
            return out
        return self._schedule()

    def _schedule(self) -> SchedulerOutput:
        if self.config.chunked_prefill:
            return self._schedule_chunked()
        # A head of line still blocked on memory admits nothing (``_is_still_blocked``):
        # checked here, before ``_admit``'s call, at every step while it waits. With
        # objectives the head may preempt for its first token, so ``_admit`` always runs.
        if self.waiting and (self.kv.prefix is not None or self.objectives is not None
                             or not self._is_still_blocked(None)):
            admitted = self._admit(self.config.max_num_batched_tokens)
            if admitted:
                return SchedulerOutput([self._entry(r) for r, _ in admitted], is_prefill=True)
        return self._decode_step()

    def _schedule_chunked(self) -> SchedulerOutput:
        """Decodes, then prefills within the token budget: per priority level, highest
        first, the prefills under way (FCFS) and then the queued requests of that level.
        So a high-priority arrival does not wait out a long normal prompt's chunks, and
        within a level a prompt already started finishes first. A request mid-prefill holds
        its blocks already, so only the decodes grow (and may preempt, from the back of
        the service order)."""
        if self.objectives is not None and self.waiting:
            self._preempt_for_head()
        preempted = self._grow_running()
        decodes: list[ScheduledRequest] = []
        prefilling: list[Request] = []
        for req in self.running:
            if req.is_prefill:
                prefilling.append(req)
            else:
                decodes.append(self._entry(req))
        budget = self.config.max_num_batched_tokens - len(decodes)
        chunks: list[ScheduledRequest] = []
        prefilling.sort(key=self._key)
        levels = {r.priority for r in prefilling}
        if self.waiting:
            levels.add(self.waiting[0].priority)
        i = 0
        for level in sorted(levels, reverse=True):
            while budget > 0 and i < len(prefilling) and prefilling[i].priority >= level:
                req = prefilling[i]
                n = chunk_size(req, req.num_new_tokens, budget, bool(chunks))
                if n == 0:
                    break
                chunks.append(self._entry(req, n))
                budget -= n
                i += 1
            if budget > 0:
                for req, n in self._admit(budget, chunked=bool(chunks), min_priority=level):
                    chunks.append(self._entry(req, n))
                    budget -= n
        return SchedulerOutput(decodes + chunks, is_prefill=bool(chunks),
                               preempted_request_ids=preempted, num_decodes=len(decodes))

    def _admit(self, budget: int, *, chunked: bool | None = None,
               min_priority: int | None = None) -> list[tuple[Request, int]]:
        """Admit queued requests in service order while the batch size, the KV watermark
        and ``budget`` allow (and, with ``min_priority``, while the head of line has at
        least that priority); each with the tokens this step computes for it. Without
        chunking (``chunked`` None) a request is prefilled whole and the budget limits
        batching, never a lone request; with it (True: other prefills are in the step
        already) the last admitted request may get a chunk of its prefill."""
        admitted: list[tuple[Request, int]] = []
        num_tokens = 0
        caching = self.kv.prefix is not None
        while self.waiting:
            req = self.waiting[0]
            if min_priority is not None and req.priority < min_priority:
                break
            # With prefix caching the blocks that already hold the sequence's leading
            # tokens are taken as they are (not for prompt logprobs: those need the
            # prompt's every position computed).
            cached = None
            if caching and req.sampling_params.prompt_logprobs is None:
                memo = self._blocked_keys
                cached = (self.kv.match_prefix_keys(memo[1]) if memo is not None and memo[0] is req
                          else self.kv.match_prefix(req.prompt_token_ids, req.output_token_ids))
            hit = len(cached[0]) * self.kv.block_size if cached else 0
            n = req.num_new_tokens - hit
            if chunked is None:
                # The budget limits batching, never a lone request: a sequence grown
                # past the budget must still be re-prefillable after a preemption.
                if admitted and num_tokens + n > budget:
                    break
            else:
                if num_tokens >= budget:
                    break
                n = chunk_size(req, n, budget - num_tokens, chunked or bool(admitted))
                if n == 0:
                    break
            if len(self.running) + len(admitted) >= self.config.max_num_seqs:
                break
            if not self.kv.can_allocate(req.num_tokens, cached) and not (chunked is None
                                                                        and self._preempt_for(req, cached)):
                self._blocked = (req, self.kv.blocks_needed(req.num_tokens, cached))
                if cached is not None and (self._blocked_keys is None or self._blocked_keys[0] is not req):
                    self._blocked_keys = (req, self.kv.prefix_keys(req.prompt_token_ids, req.output_token_ids))
                break  # head-of-line blocking is deliberate (FCFS)
            self._pop_waiting_head()
            self._forget_blocked(req)
            self.kv.allocate(req.request_id, req.num_tokens, cached)
            if cached is not None:
                self.num_prefix_queried_tokens += req.num_tokens
                self.num_prefix_hit_tokens += hit
            if hit:
                req.num_computed_tokens = hit
                if req.first_scheduled_time is None:
                    req.num_cached_tokens = hit
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = self._now()
            admitted.append((req, n))
            num_tokens += n
        if admitted:
            self.running.extend(r for r, _ in admitted)
        return admitted

    @property
    def preempts_for_deadlines(self) -> bool:
        """Whether a queue head stopped by memory may preempt by deadline (``_preempt_for``)."""
        return self.objectives is not None and self.objectives.by_deadline and self.kv.prefix is None

    def _preempt_for(self, req: Request, cached: tuple[list[int], bytes] | None) -> bool:
        """With deadline objectives: preempt running requests whose keys come after the
        queue's head ``req`` (latest first) if their blocks make it fit; whether it fits.
        Not with prefix caching (a victim's blocks may be the head's cached prefix)."""
        obj = self.objectives
        if obj is None or self.kv.prefix is not None or not obj.may_preempt_for(req):
            return False
        victims = obj.victims(req, self.running, self._now())
        tables = self.kv.tables
        need = self.kv.blocks_needed(req.num_tokens, cached)
        if self.kv.num_free_blocks + sum(len(tables[v.request_id]) for v in victims) - need \
                < self.kv.num_watermark_blocks:
            return False  # all of them would not make room: preempt none
        while victims and not self.kv.can_allocate(req.num_tokens, cached):
            victim = victims.pop(0)
            self.preempt(victim)
            self._victims.append(victim.request_id)
            self.num_preempted_for_deadlines += 1
        return self.kv.can_allocate(req.num_tokens, cached)

    def _preempt_for_head(self) -> None:
        """Chunked prefill: the head that memory stops preempts for its first token before the step's
        decodes are taken (``_admit`` runs after them; issue 47's fair point, helper slo6)."""
        head = self.waiting[0]
        if len(self.running) < self.config.max_num_seqs and not self.kv.can_allocate(head.num_tokens):
            self._preempt_for(head, None)

    def _is_still_blocked(self, min_priority: int | None) -> bool:
        """The head of line that memory stopped at the last admission is still first, may
        be admitted as far as the batch size and ``min_priority`` go, and still does not
        fit: what ``_admit`` would find (without chunks or prefix caching, its demand is
        its token count's blocks, which do not change while it waits), at the cost of a
        comparison. A queue blocked for many steps is the common case under load, so
        ``schedule`` asks before it calls ``_admit`` at all."""
        blocked = self._blocked
        if blocked is None or not self.waiting or self.waiting[0] is not blocked[0]:
            return False
        if min_priority is not None and blocked[0].priority < min_priority:
            return False
        if len(self.running) >= self.config.max_num_seqs:
            return False
        return self.kv.num_free_blocks - blocked[1] < self.kv.num_watermark_blocks

    def _grow_running(self) -> list[str]:
        """Give every running request a slot for its next token, preempting as needed."""
        kv = self.kv
        block_size = kv.block_size
        tables = kv.tables
        growing: list[tuple[Request, int]] = []
        total = 0
        for req in self.running:  # every running request every decode step: counts read directly
            need = -(-(len(req.prompt_token_ids) + len(req.output_token_ids)) // block_size) \
                - len(tables.get(req.request_id, ()))
            if need > 0:
                growing.append((req, need))
                total += need
        if not total or total <= kv.num_free_blocks:
            # Common case: every request gets its block, so the order does not matter.
            for req, need in growing:
                kv.grow(req.request_id, need)
            return []
        return self._grow_with_preemption()

    def _decode_step(self) -> SchedulerOutput:
        """Every running request decodes: the batch's growth and its ``DecodeBatch`` in one
        pass (every step's hottest loop; the entries are built only if an executor reads
        them). The tables are the live ones, so growing them afterwards is what the
        executor sees; if the blocks do not suffice, the pass is dropped and the batch
        taken again after the preemptions."""
        kv = self.kv
        block_size = kv.block_size
        tables = kv.tables
        growing: list[tuple[str, int]] = []
        total = 0
        held: list[list[int]] = []
        starts: list[int] = []
        outs: list[int] = []
        for req in self.running:
            rid = req.request_id
            n_out = len(req.output_token_ids)
            table = tables[rid]
            n_tokens = len(req.prompt_token_ids) + n_out
            if n_tokens > len(table) * block_size:  # the blocks it needs are more than it holds
                need = -(-n_tokens // block_size) - len(table)
                growing.append((rid, need))
                total += need
            held.append(table)
            starts.append(req.num_computed_tokens)
            outs.append(n_out)
        if not total or total <= kv.num_free_blocks:  # (most steps grow no table: no count read)
            for rid, need in growing:
                kv.grow(rid, need)
            return decode_output(list(self.running), held, starts, outs, [])
        preempted = self._grow_with_preemption()
        running = self.running
        return decode_output(list(running), [tables[r.request_id] for r in running],
                             [r.num_computed_tokens for r in running], [len(r.output_token_ids) for r in running],
                             preempted)

    def _grow_with_preemption(self) -> list[str]:
        """Serve requests in service order; when blocks run out, preempt from the back."""
        queue = sorted(self.running, key=self._key)
        kept: list[Request] = []
        preempted: list[str] = []
        while queue:
            req = queue.pop(0)
            while not self.kv.can_append(req.request_id, req.num_tokens):
                victim = queue.pop() if queue else req
                self.preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                self.kv.append_slot(req.request_id, req.num_tokens)
                kept.append(req)
        self.running = kept
        return preempted

    def preempt(self, req: Request) -> None:
        """Recompute preemption: drop the KV, re-queue for a full prefill."""
        if req in self.running:
            self.running.remove(req)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        if req.preempted_at is None:
            req.preempted_at = self._now()
        self.num_preemptions += 1
        self.enqueue(req)

    def _entry(self, req: Request, num_tokens: int | None = None) -> ScheduledRequest:
        """The step's work for ``req``: its tokens from ``num_computed_tokens`` on, or the
        first ``num_tokens`` of them (a prefill chunk, which samples only if it reaches
        the sequence's end)."""
        p = req.sampling_params
        banned = req.banned_under_min_tokens if len(req.output_token_ids) < p.min_tokens else ()
        tokens = req.new_token_ids()
        sample = num_tokens is None or num_tokens >= len(tokens)
        if not sample:
            tokens = tokens[:num_tokens]
        return ScheduledRequest(
            req.request_id, tokens, req.num_computed_tokens,
            # The live table, not a copy: the batch is executed before the
            # scheduler runs again, and copying every table each step is the
            # simulator's hottest cost.
            self.kv.block_table(req.request_id),
            req.sampling_params, req.seed, len(req.output_token_ids),
            req.prompt_token_ids, req.output_token_ids, banned, sample,
        )
