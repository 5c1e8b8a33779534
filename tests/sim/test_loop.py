from __future__ import annotations

import pytest

from llumnix.sim.events import Event, EventKind
from llumnix.sim.loop import EventLoop


def test_events_run_in_time_then_kind_then_insertion_order():
    loop = EventLoop()
    seen = []

    def record(ev):
        seen.append((loop.clock.now(), ev.kind.name, ev.target))

    for kind in EventKind:
        loop.on(kind, record)
    loop.push(Event(2.0, EventKind.ARRIVAL, "late"))
    loop.push(Event(1.0, EventKind.STATUS_REPORT, "a"))
    loop.push(Event(1.0, EventKind.ARRIVAL, "b"))
    loop.push(Event(1.0, EventKind.STEP_END, "c"))
    loop.push(Event(1.0, EventKind.ARRIVAL, "d"))
    loop.run()
    assert seen == [(1.0, "STEP_END", "c"), (1.0, "ARRIVAL", "b"), (1.0, "ARRIVAL", "d"),
                    (1.0, "STATUS_REPORT", "a"), (2.0, "ARRIVAL", "late")]
    assert loop.num_events == 5


def test_handlers_return_the_events_they_cause_and_time_never_goes_back():
    loop = EventLoop()
    ticks = []

    def tick(ev):
        ticks.append(loop.clock.now())
        if ev.target < 3:
            return [Event(loop.clock.now() + 0.5, EventKind.STATUS_REPORT, ev.target + 1)]
        return None

    loop.on(EventKind.STATUS_REPORT, tick)
    loop.push(Event(0.0, EventKind.STATUS_REPORT, 0))
    loop.run()
    assert ticks == [0.0, 0.5, 1.0, 1.5]

    loop.on(EventKind.ARRIVAL, lambda ev: [Event(0.0, EventKind.ARRIVAL)])
    loop.push(Event(2.0, EventKind.ARRIVAL))
    with pytest.raises(ValueError):
        loop.run()


def test_run_stops_at_until_max_events_and_stop():
    loop = EventLoop()
    loop.on(EventKind.ARRIVAL, lambda ev: [Event(loop.clock.now() + 1.0, EventKind.ARRIVAL)])
    loop.push(Event(0.0, EventKind.ARRIVAL))
    loop.run(until=3.5)
    assert loop.clock.now() == 3.0
    loop.run(max_events=2)
    assert loop.clock.now() == 5.0
    loop.run(stop=lambda: loop.clock.now() >= 7.0)
    assert loop.clock.now() == 7.0
