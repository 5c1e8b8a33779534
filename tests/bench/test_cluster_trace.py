"""``bench cluster --trace``: the engine trace reaches a fresh interpreter through its
``sitecustomize`` and records real engine events, and each preemption is attributed from
literal events and samples (the instance's latest migration in, the other instances)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from llumnix.bench import cluster_trace, engine_trace
from llumnix.bench.cluster_bench import ClusterBenchSettings, settings_from_args
from llumnix.cli import build_parser


def _ev(ev, t, iid, rid, **kw):
    base = {"ev": ev, "t": t, "iid": iid, "rid": rid, "tokens": 20, "outputs": 10, "migrations": 0,
            "free": 0, "used": 10, "total": 10, "reserved": 0, "running": 4, "waiting": 1, "queued": False,
            "victim_blocks": 2}
    return {**base, **kw}


def _sample(t, used_a, used_b):
    return {"t": t, "instances": [
        {"instance_id": "a", "num_used_blocks": used_a, "num_total_blocks": 10, "num_waiting": 0, "freeness": 1.0},
        {"instance_id": "b", "num_used_blocks": used_b, "num_total_blocks": 10, "num_waiting": 2, "freeness": 0.5}]}


def test_each_preemption_is_attributed_to_its_instance_and_latest_migration_in():
    events = [_ev("add", 0.0, "a", "r1"),
              _ev("install", 1.0, "a", "m1", migrations=1),
              _ev("preempt", 2.0, "a", "m1", migrations=1),      # the moved request itself, 1 s after
              _ev("preempt", 9.0, "a", "r1"),                     # 8 s after: not recent
              _ev("preempt", 9.5, "b", "r2", victim_blocks=3),    # b never received one
              _ev("preempt", 12.0, "b", "r2", victim_blocks=3)]   # the same victim again
    samples = [_sample(0.5, 4, 10), _sample(9.2, 10, 10), _sample(11.0, 8, 10)]
    out = cluster_trace.attribute(events, samples)
    p = out["preemptions"]
    assert [x["iid"] for x in p] == ["a", "a", "b", "b"]
    assert [x["victim_migrated"] for x in p] == [True, False, False, False]
    assert p[0]["after_install_s"] == 1.0 and p[0]["recent_install"] and p[0]["recent_victim"]
    assert p[1]["after_install_s"] == 8.0 and not p[1]["recent_install"]
    assert p[2]["after_install_s"] is None and not p[2]["recent_install"]
    # the other instance at each moment, from the latest sample before it
    assert [x["other_free"] for x in p] == [0, 0, 0, 2]
    assert [x["other_could_take"] for x in p] == [False, False, False, False]
    assert p[0]["other_waiting"] == 2 and p[2]["other_waiting"] == 0
    s = out["summary"]
    assert s["num_preemptions"] == 4 and s["by_instance"] == {"a": 2, "b": 2}
    assert s["after_recent_install"] == 1 and s["victim_is_recent_install"] == 1
    assert s["distinct_victims"] == 3 and s["repeat_preemptions"] == 1
    assert s["installs"] == 1 and s["installs_running"] == 1


def test_a_victim_that_never_moved_is_not_counted_as_migrated():
    events = [_ev("install", 1.0, "a", "m1", migrations=1), _ev("preempt", 2.0, "a", "r9")]
    p = cluster_trace.attribute(events, [_sample(1.5, 10, 3)])["preemptions"][0]
    assert not p["victim_migrated"] and p["recent_install"] and not p["recent_victim"]
    assert p["other_free"] == 7 and p["other_could_take"]


def test_the_site_hook_traces_a_real_engine_in_a_fresh_interpreter(tmp_path):
    path = tmp_path / "trace.jsonl"
    code = ("from llumnix.engine.engine_core import EngineCore\n"
            "from llumnix.engine.scheduler import LocalScheduler\n"
            "import llumnix.bench.engine_trace as t\n"
            "assert EngineCore._trace_installed\n"
            "assert LocalScheduler.preempt.__name__ == 'preempt_'\n")
    env = {**os.environ, engine_trace.ENV: str(path),
           "PYTHONPATH": os.pathsep.join([engine_trace.site_dir(), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    # without the variable nothing is installed
    env.pop(engine_trace.ENV)
    r = subprocess.run([sys.executable, "-c", "from llumnix.engine.engine_core import EngineCore\n"
                        "assert not getattr(EngineCore, '_trace_installed', False)"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_read_keeps_the_window_in_time_order(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(_ev("add", t, "a", f"r{t}")) + "\n" for t in (3.0, 1.0, 2.0, 9.0)))
    assert [e["t"] for e in engine_trace.read(str(path), 1.0, 3.0)] == [1.0, 2.0, 3.0]
    assert engine_trace.read(str(tmp_path / "missing"), 0, 1) == []


def test_trace_and_rescheduling_flags_reach_the_settings_and_only_llumnix():
    s = settings_from_args(build_parser().parse_args(
        ["bench", "cluster", "--trace", "--pairing", "fit", "--in-threshold", "4"]))
    assert s.trace and s.rescheduling == {"pairing": "fit", "in_threshold": 4.0}
    assert s.system_doc("llumnix")["scheduling"]["rescheduling"] == {"enabled": True, "pairing": "fit",
                                                                     "in_threshold": 4.0}
    assert s.system_doc("infaas++")["scheduling"]["rescheduling"] == {"enabled": False}
    assert ClusterBenchSettings().system_doc("llumnix")["scheduling"]["rescheduling"] == {"enabled": True}
