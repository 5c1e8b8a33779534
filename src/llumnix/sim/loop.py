"""A heap-based discrete-event loop over a virtual clock."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from llumnix.core.clock import VirtualClock
from llumnix.sim.events import Event, EventKind

Handler = Callable[[Event], Iterable[Event] | None]


class EventLoop:
    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        self.handlers: dict[EventKind, Handler] = {}
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()

    def on(self, kind: EventKind, handler: Handler) -> None:
        self.handlers[kind] = handler

    def push(self, event: Event) -> None:
        if event.time < self.clock.now():
            raise ValueError(f"event {event.kind.name} at {event.time} is in the past ({self.clock.now()})")
        heapq.heappush(self._heap, (event.time, event.kind, next(self._seq), event))

    def push_all(self, events: Iterable[Event] | None) -> None:
        if events:
            for e in events:
                self.push(e)

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time(self, kind: EventKind | None = None) -> float | None:
        """Time of the next event (of ``kind``, if given; a linear scan)."""
        if kind is None:
            return self._heap[0][0] if self._heap else None
        times = [t for t, k, _, _ in self._heap if k == kind]
        return min(times) if times else None

    def run(self, until: float | None = None, max_events: int | None = None,
            stop: Callable[[], bool] | None = None) -> None:
        """Process events in time order until the heap is empty, ``until`` is passed,
        ``max_events`` have run, or ``stop()`` says so (checked after each event)."""
        heap, handlers, clock = self._heap, self.handlers, self.clock
        pop, push, seq = heapq.heappop, heapq.heappush, self._seq
        budget = max_events if max_events is not None else -1
        num_events = self.num_events  # counted locally (once per event), stored on the way out
        try:
            while heap and budget != 0:
                if until is not None and heap[0][0] > until:
                    break
                t, _, _, event = pop(heap)
                clock.advance_to(t)
                num_events += 1
                budget -= 1
                caused = handlers[event.kind](event)
                if caused:
                    for e in caused:
                        if e.time < t:
                            raise ValueError(f"{e.kind.name} at {e.time} scheduled in the past ({t})")
                        push(heap, (e.time, e.kind, next(seq), e))
                if stop is not None and stop():
                    break
        finally:
            self.num_events = num_events
