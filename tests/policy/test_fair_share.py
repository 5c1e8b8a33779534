"""The virtual token counter over clients: literal scenarios, and a property run over
random arrivals and finishes with the invariants checked after every event."""
from __future__ import annotations

import random

import pytest

from llumnix.policy.fair_share import FairConfig, FairShare


def share(n: int = 2) -> FairShare:
    return FairShare(FairConfig(max_in_flight=n))


def test_a_lone_client_gets_every_place_and_then_waits():
    s = share(2)
    assert s.arrive("a", 1) and s.arrive("a", 2)
    assert not s.arrive("a", 3)
    assert s.finish("a") == [("a", 3)]
    s.check_invariants()


def test_another_client_goes_ahead_of_a_backlog_it_did_not_build():
    """FCFS would serve a's 14 queued choices before b's; the counter puts b next."""
    s = share(2)
    for t in range(16):
        if s.arrive("a", t):
            s.charge("a", prompt_tokens=10)
    assert s.num_waiting == 14
    assert not s.arrive("b", 100)
    s.charge("a", output_tokens=50)  # a is being served all along
    assert s.finish("a") == [("b", 100)]
    s.check_invariants()


def test_the_client_served_least_goes_first():
    s = share(1)
    assert s.arrive("x", 0)
    assert not s.arrive("a", 1) and not s.arrive("b", 2)
    s.charge("a", output_tokens=5)  # a already had more than b
    assert s.finish("x") == [("b", 2)]


def test_a_client_back_from_idle_cannot_bank_credit():
    """b was away while a ran up its counter: on return b starts level with a, not at 0."""
    s = share(1)
    assert s.arrive("a", 0)
    s.charge("a", output_tokens=1000)
    assert not s.arrive("a", 1)
    assert not s.arrive("b", 2)
    assert s.counters["b"] == s.counters["a"] == 2000
    # ties go to the longest backlogged: a first, then b, then alternately by counters
    assert s.finish("a") == [("a", 1)]


def test_a_waiting_choice_can_leave():
    s = share(1)
    assert s.arrive("a", 0)
    assert not s.arrive("b", 1)
    assert s.cancel("b", 1) and not s.cancel("b", 1)
    assert s.finish("a") == []
    s.check_invariants()
    assert s.num_in_flight == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_in_flight"):
        FairConfig(max_in_flight=0)


@pytest.mark.parametrize("seed", range(5))
def test_random_traffic_keeps_the_books(seed):
    rng = random.Random(seed)
    s = share(rng.randint(1, 5))
    serving: list[str] = []
    waiting: dict[int, str] = {}
    for t in range(2000):
        r = rng.random()
        if r < 0.45:
            c = rng.choice("abcd")
            if s.arrive(c, t):
                serving.append(c)
            else:
                waiting[t] = c
        elif r < 0.55 and waiting:
            t0 = rng.choice(list(waiting))
            assert s.cancel(waiting.pop(t0), t0)
        elif serving:
            c = serving.pop(rng.randrange(len(serving)))
            s.charge(c, output_tokens=rng.randint(1, 50))
            for c2, t2 in s.finish(c):
                assert waiting.pop(t2) == c2
                serving.append(c2)
        s.check_invariants()
        assert s.num_in_flight == len(serving) and s.num_waiting == len(waiting)


def test_a_stream_of_new_client_names_leaves_no_counters_behind():
    """Each name served once and gone: its counter is forgotten (it would be lifted to the
    active clients' level on return anyway), so names cost no memory."""
    s = share(2)
    assert s.arrive("steady", -1)
    s.charge("steady", output_tokens=10_000)
    for t in range(10_000):
        assert s.arrive(f"user-{t}", t)
        s.charge(f"user-{t}", prompt_tokens=5, output_tokens=5)
        s.charge("steady", output_tokens=50)  # served meanwhile, as a client holding a place is
        assert s.finish(f"user-{t}") == []
    assert set(s.counters) == {"steady"}
    s.check_invariants()


def test_idle_counters_are_bounded_even_when_they_stay_ahead():
    from llumnix.policy.fair_share import MAX_IDLE_CLIENTS

    s = share(1)
    for t in range(MAX_IDLE_CLIENTS + 10):
        assert s.arrive(f"user-{t}", t)
        s.charge(f"user-{t}", output_tokens=t + 1)  # each ends ahead of the last: kept while it can
        s.finish(f"user-{t}")
    assert len(s.counters) <= MAX_IDLE_CLIENTS + 1
