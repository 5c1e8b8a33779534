"""Lite's dispatch rebuilds only the statuses of endpoints whose books or health changed
(``lite/pool.py``). It must decide exactly as a dispatch over statuses rebuilt for every
endpoint each time: the reference below, fed the same seeded events (dispatches with
shared prefixes and exclusions, streamed tokens, completions, failures, ejections and
re-admissions, drains, scrapes that age out, quiet spells longer than any staleness)."""
from __future__ import annotations

import random

import pytest

from llumnix.lite.config import LiteConfig, from_urls
from llumnix.lite.endpoint import Endpoint
from llumnix.lite.lrs import EngineLoad
from llumnix.lite.pool import Pool, scheduling_config
from llumnix.policy import DispatchRequest, GlobalScheduler

URLS = [f"http://e{i}:8000" for i in range(4)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Reference:
    """Every endpoint's status rebuilt from its books before each dispatch."""

    def __init__(self, lite: LiteConfig, seed: int) -> None:
        cfg = lite.pools[0]
        self.endpoints = {e.name: Endpoint(e, cfg.name, lite) for e in cfg.endpoints}
        self.scheduler = GlobalScheduler(scheduling_config(lite), seed=seed)

    def dispatch(self, request_id: str, prompt: list[int], exclude: set[str], now: float) -> str | None:
        for iid, ep in self.endpoints.items():
            self.scheduler.update_status(ep.lrs.status(now, ep.can_serve() and iid not in exclude))
        picked = self.scheduler.dispatch(DispatchRequest(request_id, len(prompt), 0, now, prompt), now)
        if picked is not None:
            self.endpoints[picked].lrs.on_dispatch(request_id, len(prompt), 0, now)
        return picked


def _prompt(rng: random.Random) -> list[int]:
    prefix = [[7] * 40, [8] * 72, [9] * 20][rng.randrange(3)] if rng.random() < 0.7 else []
    return prefix + [rng.randrange(1000) for _ in range(rng.randrange(1, 60))]


def _event(rng: random.Random, clock: Clock, sides: list[dict[str, Endpoint]], in_flight: list[tuple[str, str]],
           step: int) -> None:
    """One event other than a dispatch, applied alike to both sides."""
    x = rng.random()
    if x < 0.3 and in_flight:
        rid, iid = in_flight[rng.randrange(len(in_flight))]
        n = rng.randrange(1, 40)
        for eps in sides:
            eps[iid].lrs.on_tokens(rid, n)
    elif x < 0.6 and in_flight:
        rid, iid = in_flight.pop(rng.randrange(len(in_flight)))
        failed = rng.random() < 0.1
        for eps in sides:
            eps[iid].lrs.on_finish(rid, failed=failed)
    elif x < 0.7:
        iid = rng.choice(sorted(sides[0]))
        for eps in sides:
            if eps[iid].health.can_serve():
                eps[iid].on_request_failed("refused", refused=True)
            else:  # re-admitted by a probe once its backoff is over
                eps[iid].on_probe(True, eps[iid].health.ejected_until or clock.now)
    elif x < 0.75:
        iid, drained = rng.choice(sorted(sides[0])), rng.random() < 0.5
        for eps in sides:
            eps[iid].set_drained(drained)
    elif x < 0.85:
        iid = rng.choice(sorted(sides[0]))
        load = EngineLoad(clock.now, num_running=rng.randrange(6), num_waiting=rng.randrange(3),
                          kv_usage=rng.random())
        for eps in sides:
            eps[iid].lrs.on_scrape(load)
    clock.now += rng.choice([0.001, 0.05, 0.3, 1.0, 2.5, 6.0])


@pytest.mark.parametrize("policy", ["llumnix", "least-requests", "round-robin", "power-of-two", "infaas++"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dispatch_over_changed_endpoints_decides_as_one_over_all(policy, seed):
    lite = from_urls(URLS, "m", dispatch=policy)
    clock = Clock()
    pool, ref = Pool(lite.pools[0], lite, seed=seed, clock=clock), Reference(lite, seed)
    rng = random.Random(seed)
    in_flight: list[tuple[str, str]] = []
    picks = []
    for step in range(600):
        if rng.random() < 0.4:
            rid, prompt = f"r{step}", _prompt(rng)
            exclude = {rng.choice(sorted(pool.endpoints))} if rng.random() < 0.1 else set()
            got = pool.dispatch(rid, prompt, 0, exclude)
            want = ref.dispatch(rid, prompt, exclude, clock.now)
            assert (got.endpoint_id if got else None) == want, f"step {step}"
            if want is not None:
                in_flight.append((rid, want))
            picks.append(want)
        else:
            _event(rng, clock, [pool.endpoints, ref.endpoints], in_flight, step)
    # The sequence exercised real choices: several endpoints picked, and some dispatches refused.
    assert len({p for p in picks if p is not None}) >= 3
    assert len(picks) > 150


def test_an_endpoint_quiet_for_longer_than_any_staleness_is_still_chosen():
    """The books are real-time: an endpoint whose status was built long ago is as current
    as one rebuilt just now (a status filter by age sent every request to the endpoint
    touched last)."""
    lite = from_urls(URLS[:3], "m")
    clock = Clock()
    pool = Pool(lite.pools[0], lite, clock=clock)
    first = [pool.dispatch(f"r{i}", [i] * 30, 0, set()) for i in range(3)]
    assert len({e.endpoint_id for e in first if e}) == 3
    for i, ep in enumerate(first[1:], start=1):
        assert ep is not None
        ep.lrs.on_finish(f"r{i}")
    clock.now += 10.0
    got = [pool.dispatch(f"q{i}", [100 + i] * 30, 0, set()) for i in range(2)]
    busy = first[0]
    assert busy is not None
    assert sorted(e.endpoint_id for e in got if e) == sorted(i for i in pool.endpoints if i != busy.endpoint_id)


def test_a_scrape_counts_while_fresh_and_its_endpoint_is_rebuilt_once_it_ages():
    lite = from_urls(URLS[:2], "m", dispatch="least-requests")
    clock = Clock()
    pool = Pool(lite.pools[0], lite, clock=clock)
    a, b = sorted(pool.endpoints)
    pool.endpoints[a].lrs.on_scrape(EngineLoad(clock.now, num_running=5, num_waiting=0))
    ep = pool.dispatch("r0", [1] * 20, 0, set())
    assert ep is not None and ep.endpoint_id == b  # a runs five requests of someone else's
    pool.endpoints[b].lrs.on_finish("r0")
    clock.now += 60.0  # the scrape is stale now and nothing else happened on a
    ep = pool.dispatch("r1", [2] * 20, 0, set())
    assert ep is not None and ep.endpoint_id == a  # both empty by the books: the lowest id
