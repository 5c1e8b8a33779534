"""`llumnix profile` on a tiny random Llama: the file it writes loads as a simulator profile."""
from __future__ import annotations

import json

import pytest

from llumnix.bench.profile import QUICK_GRID, build_profile, monotone, monotone_grid
from llumnix.sim.latency import get_latency_model
from llumnix.sim.profile import SCHEMA, load_profile


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the engine, its profile written to a file)."""
    from llumnix.llm import LLM
    from tests.tiny_model import save_tiny_llama

    d = tmp_path_factory.mktemp("tiny-profile-model")
    save_tiny_llama(d)
    llm = LLM(str(d), num_blocks=64, max_model_len=512)
    path = d / "profile.json"
    path.write_text(json.dumps(build_profile(llm, QUICK_GRID, model_name="tiny", device="cpu")))
    return llm, path


def test_profile_loads_as_a_latency_model(tiny):
    llm, path = tiny
    doc = json.loads(path.read_text())
    model = load_profile(path)
    assert doc["schema"] == SCHEMA
    assert doc["kv"]["bytes_per_block"] == llm.executor.bytes_per_block
    assert model.prefill_tokens == tuple(float(n) for n in QUICK_GRID.prefill_tokens)
    assert all(t > 0 for t in model.prefill_s)
    assert all(t > 0 for row in model.decode_s for t in row)
    # Monotone tables: extrapolation past the last knot never goes down.
    assert model.decode_time(64, 10_000) >= model.decode_time(2, 16) > 0
    assert model.prefill_time([4000]) >= model.prefill_time([4, 4]) > 0
    mig = doc["migration"]
    assert mig["bandwidth_bytes_per_s"] > 0 and mig["stage_overhead_s"] >= 0
    assert mig["measured"]["downtime_s"], "a live migration committed"
    assert get_latency_model(str(path)).migration.bytes_per_block == doc["kv"]["bytes_per_block"]


def test_simulator_runs_on_a_measured_profile(tiny):
    from benchmarks.fidelity.simulate import run_sim
    from benchmarks.fidelity.workload import FidelitySetup, Load, make_trace

    _, path = tiny
    setup = FidelitySetup(loads=(Load("t", 5.0, 12),))
    for system in setup.systems:
        out = run_sim(setup, system, make_trace(setup, setup.loads[0]), str(path))
        assert len(out["e2e"]) == 12 and all(t > 0 for t in out["ttft"])


def test_monotone_tables():
    assert monotone([0.3, 0.2, 0.5]) == [0.3, 0.3, 0.5]
    assert monotone_grid([[2.0, 1.0], [1.0, 3.0]]) == [[2.0, 2.0], [2.0, 3.0]]


def test_decode_prompts_differ_in_length_and_sum_to_the_context():
    from llumnix.bench.profile import decode_prompt_lens

    lens = decode_prompt_lens(4, 256, steps=6)
    assert len(set(lens)) == 4  # the masked attention path, as in real batches
    assert abs(sum(lens) + 4 * (6 // 2 + 1) - 256) <= 4
    assert decode_prompt_lens(1, 64, steps=6) == [60]


def test_neighbor_factors_come_from_interleaved_paused_and_running_rounds(monkeypatch):
    """The factors are the medians' ratios beside a running vs a paused neighbor; rounds
    alternate which state goes first; the neighbor is left running."""
    from llumnix.bench import profile

    class FakeNeighbor:
        running, calls = True, []

        def pause(self):
            self.running = False
            self.calls.append("pause")

        def resume(self):
            self.running = True
            self.calls.append("resume")

    nb = FakeNeighbor()
    monkeypatch.setattr(profile.time, "sleep", lambda s: None)
    monkeypatch.setattr(profile, "time_decode",
                        lambda e, b, c, n, v, s: (0.10 if b == 1 else 0.40) * (1.21 if nb.running else 1.0))
    monkeypatch.setattr(profile, "time_prefill", lambda e, n, r, v, s: 0.3 * (1.02 if nb.running else 1.0))
    out = profile.measure_contention(None, 100, nb, rounds=4)
    assert out["neighbor_factor"]["decode"] == pytest.approx(1.21)
    assert out["neighbor_factor"]["prefill"] == pytest.approx(1.02)
    assert out["alone_s"]["decode_4x256"] == pytest.approx(0.40)
    assert nb.calls == ["pause", "resume", "resume", "pause", "pause", "resume", "resume", "pause", "resume"]
    assert nb.running


def test_neighbor_pause_stops_the_process_and_stop_ends_a_paused_one():
    import subprocess
    import time
    from pathlib import Path

    from llumnix.bench.profile import Neighbor

    nb = object.__new__(Neighbor)
    nb.proc = subprocess.Popen(["sleep", "60"])

    def state():
        return Path(f"/proc/{nb.proc.pid}/stat").read_text().split(")")[1].split()[0]

    nb.pause()
    deadline = time.time() + 5
    while state() != "T" and time.time() < deadline:
        time.sleep(0.01)
    assert state() == "T"
    nb.stop()
    assert nb.proc.returncode is not None
