"""`llumnix demo` as a user runs it: a real process that starts its cluster, prints the
dashboard's address and a line per migration, and ends with a summary of committed
migrations and their stall; its bad flags are one line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llumnix.cluster.startup import free_port
from tests.cluster.helpers import SLOW_STEPS_HOOK, STEP_SLEEP_ENV

pytest.importorskip("ray")


def demo(*flags: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llumnix.cli", "demo", *flags], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("flags,message", [
    (("--url", "http://127.0.0.1:1"), "--url needs --key"),
    (("--instances", "1"), "--instances must be at least 2"),
])
def test_bad_flags_are_one_line(flags, message):
    r = demo(*flags)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"llumnix demo: error: {r.stderr.split('error: ', 1)[1].strip()}"]
    assert message in r.stderr


@pytest.mark.slow
def test_the_demo_migrates_and_says_so(tiny_model_dir):
    port = free_port()
    r = demo("--model", str(tiny_model_dir), "--port", str(port), "--duration", "20", "--drain-every", "6",
             "--max-tokens", "400", timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(rf"^dashboard: http://127\.0\.0\.1:{port}/dashboard\?key=\S+$", r.stdout, re.M), r.stdout
    assert re.search(r"^ +[\d.]+s  draining instance-\d: its \d+ running requests migrate live", r.stdout, re.M)
    lines = re.findall(r"^ +[\d.]+s  migration \S+ (instance-\d) -> (instance-\d) committed, stall ([\d.]+) ms$",
                       r.stdout, re.M)
    assert lines and all(src != dst for src, dst, _ in lines), r.stdout
    summary = re.search(r"^summary: (\d+) migrations committed, \d+ aborted .*median ([\d.]+) ms, max ([\d.]+) ms; "
                        r"(\d+) requests completed$", r.stdout, re.M)
    assert summary, r.stdout
    assert int(summary[1]) >= len(lines) >= 1 and int(summary[4]) > 0
    assert float(summary[3]) == max(float(s) for *_, s in lines)  # the summary's max: the printed stalls'


@pytest.mark.parametrize("flags,message", [
    (("--url", "http://127.0.0.1:1"), "--contrast starts its own two clusters: --url does not apply"),
    (("--every", "0"), "--every must be > 0, got 0"),
])
def test_the_contrasts_bad_flags_are_one_line(flags, message):
    r = demo("--contrast", *flags)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"llumnix demo: error: {message}"


@pytest.mark.slow
def test_the_contrast_preempts_under_round_robin(tiny_model_dir):
    """Long and short requests in turn: round-robin sends every long one to the same instance,
    which preempts while the other never does; Llumnix spreads them by freeness and migrates.
    (How many each preempts depends on the machine's speed: on a loaded one both clusters
    are overloaded, so the counts are not compared, only where the preemptions happen.)"""
    # The tiny model makes a token a millisecond: on a quiet machine a 400-token request ends
    # before the next arrives and nothing is ever full. Every engine step sleeps 10 ms first
    # (the clusters' Ray workers, through a runtime-env hook), so a long request holds its
    # KV for >= 4 s on any machine, as a real model's would.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "RAY_RUNTIME_ENV_HOOK": SLOW_STEPS_HOOK, STEP_SLEEP_ENV: "0.01",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    r = demo("--contrast", "--model", str(tiny_model_dir), "--port", "0", "--duration", "20", "--every", "0.4",
             "--max-tokens", "400", timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    for system in ("llumnix", "round-robin"):
        assert re.search(rf"^  {system} +http://127\.0\.0\.1:\d+/dashboard\?key=\S+ +\(llumnix top --url ", r.stdout,
                         re.M), r.stdout
    assert re.search(r"^ +[\d.]+s  round-robin +instance-\d preempted \d+ requests? \(its KV cache is full", r.stdout,
                     re.M), r.stdout
    rows = {m[1]: m for m in re.finditer(r"^summary: (\S+) +(\d+) preemptions(?: \((.*)\))?, (\d+) migrations "
                                         r"committed, \d+ aborted; (\d+) requests completed$", r.stdout, re.M)}
    assert set(rows) == {"llumnix", "round-robin"}, r.stdout
    ll, rr = rows["llumnix"], rows["round-robin"]
    assert int(rr[4]) == 0 and int(ll[4]) >= 1, r.stdout
    # round-robin: every preemption on one instance (the summary names only instances that preempted)
    assert int(rr[2]) >= 5 and re.fullmatch(r"instance-\d \d+", rr[3]), r.stdout
    assert int(ll[5]) > 0 and int(rr[5]) > 0
