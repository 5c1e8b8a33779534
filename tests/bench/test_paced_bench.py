"""`bench cluster --pace`: every system's engines paced with one model, and the simulator's
prediction (``--with-sim``) pricing steps with that same model by construction."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from llumnix.bench.cluster_bench import ClusterBenchSettings, settings_from_args
from llumnix.bench.cluster_report import run_record
from llumnix.bench.sim_vs_real import latency_of, simulate
from llumnix.cli import build_parser
from llumnix.core.errors import LlumnixError
from llumnix.engine.pace import PacedLatencyModel


def _args(*extra):
    return build_parser().parse_args(["bench", "cluster", *extra])


def test_the_pace_reaches_every_systems_engine_config():
    s = settings_from_args(_args("--pace", "a10-llama7b-serving:2", "--systems", "infaas++,llumnix",
                                 "--trace-tokenizer", "smollm2", "--with-sim"))
    for name in s.systems:
        assert s.system_doc(name)["engine"]["pace"] == {"model": "a10-llama7b-serving", "scale": 2.0}
    assert s.trace_tokenizer == "smollm2"
    assert "pace" not in settings_from_args(_args()).system_doc("llumnix")["engine"]  # off by default
    # the document is serve's: its own config check takes it
    from llumnix.config import SystemConfig

    assert SystemConfig.from_dict(s.system_doc("llumnix")).engine.pace is not None


@pytest.mark.parametrize("argv,message", [
    (["--pace", "a100"], "bench cluster: --pace a100: unknown latency model 'a100'"),
    (["--pace", "a10-llama7b:-1"], "bench cluster: --pace a10-llama7b:-1: must be > 0, got -1"),
    (["--pace", "a10-llama7b", "--with-sim", "p.json"],
     "bench cluster: --with-sim p.json: with --pace the simulator prices steps with the pace's model"),
    (["--with-sim"], "bench cluster: --with-sim needs a latency PROFILE (or --pace, whose model it takes)"),
])
def test_a_bad_pace_or_a_second_step_model_is_one_line(argv, message):
    with pytest.raises(LlumnixError) as e:
        settings_from_args(_args(*argv))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_simulator_of_a_paced_record_takes_the_paces_model():
    paced = ClusterBenchSettings(pace="a10-llama7b-serving:1.5")
    latency, name = latency_of(paced, None)
    assert isinstance(latency, PacedLatencyModel) and latency.scale == 1.5 and name == "pace a10-llama7b-serving:1.5"
    assert latency.decode_time(4, 400) == pytest.approx(1.5 * latency.base.decode_time(4, 400))
    with pytest.raises(SystemExit, match="was paced"):
        latency_of(paced, "profile.json")
    with pytest.raises(SystemExit, match="--profile is needed"):
        latency_of(ClusterBenchSettings(), None)
    # the paced model runs the simulator as is (its migration costs replaced by a calibration too)
    pairs = (np.full(50, 16), np.full(50, 32))
    out = simulate(ClusterBenchSettings(), "llumnix", pairs, 20, 4.0, 0, latency,
                   calibration={"stage_overhead_s": 0.01})
    assert out["ttft_p99_s"] > 0


def test_a_paced_run_records_its_overruns():
    counters = {"num_preemptions": 0.0, "preemptions_by_engine": {}, "migrations_committed": 0.0,
                "migrations_aborted": 0.0, "aborts_by_reason": {}, "committed_running": 0, "downtimes_s": []}
    raw = {"records": [], "duration_s": 1.0, "samples": [],
           "before": {**counters, "paced_steps": 100.0, "pace_overrun_steps": 1.0},
           "after": {**counters, "paced_steps": 350.0, "pace_overrun_steps": 4.0}}
    rec = run_record(ClusterBenchSettings(), raw, 0.85, 0, 1.0)
    assert (rec["paced_steps"], rec["pace_overrun_steps"]) == (250, 3)
    assert rec["line"].endswith("pace overran 3/250 steps")
    unpaced = run_record(ClusterBenchSettings(), {**raw, "before": counters, "after": counters}, 0.85, 0, 1.0)
    assert "paced_steps" not in unpaced and "pace" not in unpaced["line"]


def test_sim_vs_real_on_a_paced_record_needs_no_profile(tmp_path):
    s = ClusterBenchSettings(seeds=(0,), loads=(0.5,), systems=("infaas++", "llumnix"), pace="a10-llama7b")
    record = {"settings": dataclasses.asdict(s), "capacity": {"capacity_req_s": 1.0}, "systems": []}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(record))
    out = subprocess.run([sys.executable, "-m", "llumnix.bench.sim_vs_real", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "sim_vs_real.json").read_text())["profile"] == "pace a10-llama7b"
    bad = subprocess.run([sys.executable, "-m", "llumnix.bench.sim_vs_real", str(path), "--profile", "x.json"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "sim_vs_real: the record's cluster was paced (a10-llama7b): its model prices the simulator's steps; "
        "give no --profile"]
