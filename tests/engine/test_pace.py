"""Step pacing (engine/pace.py): a paced engine's steps last at least what the simulator's
latency model prices them at; an unpaced engine is unchanged."""
from __future__ import annotations

import time

import numpy as np
import pytest

from llumnix.core.clock import WallClock
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.core.sampling_params import SamplingParams
from llumnix.engine import EngineCore
from llumnix.engine.pace import StepPacer, pace_model
from llumnix.sim.executor import SimExecutor
from llumnix.sim.latency import get_latency_model
from tests.fakes import TokenCacheExecutor


class _Recorder:
    """A StepPacer that also keeps each step's modeled time."""

    def __init__(self, pacer: StepPacer) -> None:
        self.pacer = pacer
        self.modeled: list[float] = []
        inner = pacer.modeled_s

        def modeled_s(batch):
            t = inner(batch)
            self.modeled.append(t)
            return t

        pacer.modeled_s = modeled_s  # type: ignore[method-assign]


def _engine(pacer: StepPacer | None, chunked: bool = False) -> EngineCore:
    config = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=64, watermark=0.0),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, chunked_prefill=chunked),
                          max_model_len=256)
    return EngineCore(config, TokenCacheExecutor(64, 4), 64, clock=WallClock(), pacer=pacer)


def _add(engine: EngineCore, n: int = 3) -> None:
    for i in range(n):
        engine.add_request(f"r{i}", list(range(1, 10 + 5 * i)), SamplingParams(max_tokens=6 + i, ignore_eos=True))


def _run(engine: EngineCore) -> tuple[dict[str, list[int]], list[float]]:
    """Every step's cycle: from the previous step's return (the first: its call) to its return."""
    tokens: dict[str, list[int]] = {}
    walls = []
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outs = engine.step()
        t1 = time.perf_counter()
        walls.append(t1 - t0)
        t0 = t1
        for o in outs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        engine.check_invariants()
    return tokens, walls


@pytest.mark.parametrize("chunked", [False, True])
def test_a_paced_engines_steps_last_at_least_the_modeled_time(chunked):
    pacer = StepPacer(pace_model("a10-llama7b-serving", 0.25))
    rec = _Recorder(pacer)
    engine = _engine(pacer, chunked)
    _add(engine)
    tokens, walls = _run(engine)
    assert len(rec.modeled) == len(walls) == pacer.num_paced_steps > 5
    assert all(0.002 < m < 0.1 for m in rec.modeled)  # a quarter of an A10's LLaMA-7B step, plus its overhead
    # Back to back, each step's window starts where the previous one's ended: the k-th step
    # ends no sooner than the first one's start plus the modeled times of steps 1..k (a late
    # wake-up shortens the next cycle, never the timeline)...
    ends, budget = np.cumsum(walls), np.cumsum(rec.modeled)
    assert (ends >= budget).all()
    # ...and its cycles not much longer: the fake executor's work is microseconds (a loose bound
    # for a loaded machine; a cycle the machine held past its window restarts the timeline later)
    assert sorted(w - m for w, m in zip(walls, rec.modeled, strict=True))[len(walls) // 2] < 0.02
    assert pacer.num_overrun_steps == 0 and pacer.slept_s > 0.5 * sum(rec.modeled)
    status = engine.get_status()
    assert status.extra["num_paced_steps"] == len(walls) and status.extra["num_pace_overrun_steps"] == 0
    # pacing changes when outputs come, never what they are
    plain = _engine(None, chunked)
    _add(plain)
    assert _run(plain)[0] == tokens


def test_an_unpaced_engine_neither_sleeps_nor_reports_pace_counts():
    engine = _engine(None)
    _add(engine)
    _tokens, walls = _run(engine)
    model = pace_model("a10-llama7b-serving", 0.25)
    assert sum(walls) < model.step_overhead_s * len(walls)  # far under even the modeled overhead alone
    assert engine.pacer is None and engine.get_status().extra == {}


def test_the_modeled_time_is_the_simulators_price_times_the_scale():
    base = get_latency_model("a10-llama7b-serving")
    paced = pace_model("a10-llama7b-serving", 3.0)
    assert paced.decode_time(8, 4000) == pytest.approx(3 * base.decode_time(8, 4000))
    assert paced.prefill_time([100, 30]) == pytest.approx(3 * base.prefill_time([100, 30]))
    assert paced.step_overhead_s == pytest.approx(3 * base.step_overhead_s)
    assert paced.migration == base.migration and paced.contention.is_neutral
    engine = _engine(None)
    _add(engine)
    batch = engine.schedule()
    pacer = StepPacer(paced)
    assert pacer.modeled_s(batch) == pytest.approx(3 * SimExecutor(base).execute(batch).elapsed)


def test_a_step_longer_than_modeled_is_counted_not_stretched():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = StepPacer(pace_model("a10-llama7b", 1.0), clock=lambda: now[0], sleep=sleep)
    engine = _engine(None)
    _add(engine, 1)
    batch = engine.schedule()
    modeled = pacer.modeled_s(batch)
    now[0] = 10.0 + modeled / 4  # the real work took a quarter of the modeled time
    pacer.pace(batch, 10.0)
    assert slept == [pytest.approx(modeled * 3 / 4)] and pacer.num_overrun_steps == 0
    now[0] = 20.0 + modeled + 0.5  # half a second over
    pacer.pace(batch, 20.0)
    assert len(slept) == 1 and pacer.num_overrun_steps == 1 and pacer.overrun_s == pytest.approx(0.5)
    assert pacer.counts() == {"num_paced_steps": 2.0, "num_pace_overrun_steps": 1.0,
                              "pace_overrun_s": pytest.approx(0.5)}


class _FakeTime:
    """The pacer's clock and sleep, moved only by the pacer's sleeps and by ``work``."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def work(self, s: float) -> None:
        self.now += s


def test_the_loops_work_between_two_steps_is_inside_the_modeled_time_not_added_to_it():
    """The simulator's step is the whole cycle (its step_overhead_s is the serving loop's
    work): back to back, a paced engine's steps take the modeled time in all, whatever the
    loop does between them (up to it). Stepping unpaced between steps used to add it."""
    fake = _FakeTime()
    pacer = StepPacer(pace_model("a10-llama7b-serving", 0.25), clock=fake.clock, sleep=fake.sleep)
    rec = _Recorder(pacer)
    engine = _engine(pacer)
    _add(engine)
    loop_s = 0.002  # outputs, status, commands: under every step's modeled time here
    while engine.has_unfinished_requests():
        engine.step()
        fake.work(loop_s)
    assert len(rec.modeled) > 5 and min(rec.modeled) > loop_s
    assert fake.now == pytest.approx(sum(rec.modeled) + loop_s)  # only the last loop is outside a step
    assert pacer.num_overrun_steps == 0


def test_after_an_idle_spell_the_window_starts_with_the_step_and_an_overrun_restarts_it():
    fake = _FakeTime()
    pacer = StepPacer(pace_model("a10-llama7b-serving", 0.25), clock=fake.clock, sleep=fake.sleep)
    rec = _Recorder(pacer)
    engine = _engine(pacer)
    engine.add_request("a", list(range(1, 9)), SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert fake.now == pytest.approx(sum(rec.modeled))
    fake.work(5.0)  # idle: nothing to step
    engine.add_request("b", list(range(1, 9)), SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    assert fake.now == pytest.approx(5.0 + sum(rec.modeled))  # not the idle spell's credit
    fake.work(1.0)  # the loop held the engine past the next window: one overrun
    engine.step()
    assert pacer.num_overrun_steps == 1 and pacer.overrun_s == pytest.approx(1.0 - rec.modeled[-1])
    engine.step()  # the next window starts from where the late step really ended
    assert fake.now == pytest.approx(6.0 + sum(rec.modeled) - rec.modeled[-2])
    assert not engine.has_unfinished_requests()


def test_an_unknown_model_or_a_bad_scale_is_a_value_error():
    with pytest.raises(ValueError, match="unknown latency model 'a100'"):
        pace_model("a100")
    with pytest.raises(ValueError, match="scale must be > 0"):
        pace_model("a10-llama7b", 0.0)
