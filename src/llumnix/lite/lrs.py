"""The Local Real-time State (LRS): what lite mode knows of one endpoint it does not own.

No llumlet reports from inside an external engine, so LlumSched keeps its own books:
every request it sent there, its prompt tokens and the tokens streamed back so far,
updated on dispatch, on every streamed chunk and on completion (no polling on the
request path). A scrape of the engine's Prometheus metrics, when there is one, is folded
in with its age: it shows load the gateway did not send (other clients) and the engine's
own KV usage and capacity. ``status()`` turns the books into the ``InstanceStatus`` every
dispatch policy reads, so lite and full mode share one policy pipeline.

    in flight, in dispatch order:   r1  r2  r3 | r4  r5
                                    running     | queued   (max_num_seqs = 3)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llumnix.core.status import InstanceStatus, RequestBrief

BLOCK_SIZE = 16
"""Tokens per block of the LRS's estimate (the engines' own block sizes differ; only
ratios matter to the policies)."""
DEFAULT_CAPACITY_TOKENS = 16384
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class EngineLoad:
    """One scrape of an engine's metrics; None where the engine does not say."""

    timestamp: float
    num_running: int | None = None
    num_waiting: int | None = None
    kv_usage: float | None = None
    """Fraction of the engine's KV cache in use."""
    capacity_tokens: int | None = None


@dataclass(slots=True)
class _InFlight:
    priority: int
    num_prompt_tokens: int
    dispatched_at: float
    num_output_tokens: int = 0


class LocalState:
    def __init__(self, endpoint_id: str, capacity_tokens: int = 0, max_num_seqs: int = 0,
                 max_scrape_age_s: float = 2.0, changed: set[str] | None = None) -> None:
        self.endpoint_id = endpoint_id
        self.changed: set[str] = set() if changed is None else changed
        """Where every event adds this endpoint's id (a pool's set, shared by its
        endpoints): its status is rebuilt only after its books changed."""
        self._capacity_tokens = capacity_tokens
        self._max_num_seqs = max_num_seqs
        self.max_scrape_age_s = max_scrape_age_s
        """A scrape older than this is not folded in (the books alone count)."""
        self._in_flight: dict[str, _InFlight] = {}
        self.load: EngineLoad | None = None
        self.num_dispatched = 0
        self.num_finished = 0
        self.num_failed = 0
        self.num_output_tokens = 0

    # -- events -----------------------------------------------------------------------
    def on_dispatch(self, request_id: str, num_prompt_tokens: int, priority: int, now: float) -> None:
        self._in_flight[request_id] = _InFlight(priority, num_prompt_tokens, now)
        self.num_dispatched += 1
        self.changed.add(self.endpoint_id)

    def on_tokens(self, request_id: str, num_new: int) -> None:
        r = self._in_flight.get(request_id)
        if r is not None:
            r.num_output_tokens += num_new
            self.num_output_tokens += num_new
            self.changed.add(self.endpoint_id)

    def on_finish(self, request_id: str, failed: bool = False) -> None:
        if self._in_flight.pop(request_id, None) is not None:
            if failed:
                self.num_failed += 1
            else:
                self.num_finished += 1
            self.changed.add(self.endpoint_id)

    def on_scrape(self, load: EngineLoad) -> None:
        self.load = load
        self.changed.add(self.endpoint_id)

    # -- views ------------------------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def capacity_tokens(self) -> int:
        if self._capacity_tokens:
            return self._capacity_tokens
        if self.load is not None and self.load.capacity_tokens:
            return self.load.capacity_tokens
        return DEFAULT_CAPACITY_TOKENS

    @property
    def max_num_seqs(self) -> int:
        return self._max_num_seqs or DEFAULT_MAX_NUM_SEQS

    def fresh_load(self, now: float) -> EngineLoad | None:
        load = self.load
        return load if load is not None and now - load.timestamp <= self.max_scrape_age_s else None

    def valid_until(self, now: float) -> float:
        """When a status built at ``now`` goes out of date with no event: when the scrape
        it folds in gets too old (never without one)."""
        load = self.fresh_load(now)
        return math.inf if load is None else load.timestamp + self.max_scrape_age_s

    def status(self, now: float, is_schedulable: bool = True) -> InstanceStatus:
        """The books as an ``InstanceStatus``: the first ``max_num_seqs`` requests in
        flight run, the rest queue; a fresh scrape adds load the books do not hold."""
        bs, limit = BLOCK_SIZE, self.max_num_seqs
        # -(-n // bs): blocks_for(n, bs), inlined (a brief per request in flight per rebuild)
        briefs = [RequestBrief(rid, r.priority, -(-(r.num_prompt_tokens + r.num_output_tokens) // bs),
                               r.num_prompt_tokens + r.num_output_tokens, r.dispatched_at, True,
                               num_output_tokens=r.num_output_tokens)
                  for rid, r in self._in_flight.items()]
        total = max(1, self.capacity_tokens // bs)
        used = sum(b.num_blocks for b in briefs[:limit]) if briefs else 0
        load = self.fresh_load(now) if self.load is not None else None
        if load is not None:
            briefs += self._foreign(load, len(briefs), total, used, now)
            if load.kv_usage is not None:
                used = max(used, round(load.kv_usage * total))
        running, waiting = briefs[:limit], briefs[limit:]
        for b in waiting:
            b.num_blocks, b.is_running = 0, False
        return InstanceStatus(self.endpoint_id, now, total, min(used, total), 0, bs, limit,
                              running=tuple(running), waiting=tuple(waiting), is_schedulable=is_schedulable)

    def _foreign(self, load: EngineLoad, ours: int, total: int, used: int, now: float) -> list[RequestBrief]:
        """Requests the engine reports beyond ours (another client's), as anonymous briefs
        sharing the KV the scrape shows beyond our books."""
        theirs = (load.num_running or 0) + (load.num_waiting or 0) - ours
        if theirs <= 0:
            return []
        spare = max(0, round((load.kv_usage or 0.0) * total) - used) // theirs
        return [RequestBrief(f"~{self.endpoint_id}-{i}", 0, spare, spare * BLOCK_SIZE, load.timestamp, True)
                for i in range(theirs)]

    def summary(self, now: float) -> dict[str, object]:
        load = self.load
        return {"num_in_flight": self.num_in_flight, "num_dispatched": self.num_dispatched,
                "num_finished": self.num_finished, "num_failed": self.num_failed,
                "num_output_tokens": self.num_output_tokens, "capacity_tokens": self.capacity_tokens,
                "scrape_age_s": None if load is None else round(now - load.timestamp, 3),
                "scraped": None if load is None else {"num_running": load.num_running,
                                                      "num_waiting": load.num_waiting,
                                                      "kv_usage": load.kv_usage}}
