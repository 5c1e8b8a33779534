"""A server a benchmark starts in its own session dies with the benchmark, however the
benchmark dies (``startup.die_with_parent``): before it, a `bench cluster` killed outright
left its `llumnix serve` processes, and their Ray clusters, running with parent 1."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import subprocess, sys, time
from llumnix.cluster.startup import die_with_parent
kw = dict(start_new_session=True)
if sys.argv[1] == "yes":
    kw["preexec_fn"] = die_with_parent()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **kw)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _child_after_parent_killed(mode: str, wait_s: float) -> tuple[int, bool]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    assert _alive(pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + wait_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid, _alive(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's parent-death signal is Linux's")
def test_a_child_in_its_own_session_dies_with_its_killed_parent() -> None:
    pid, alive = _child_after_parent_killed("yes", 10.0)
    assert not alive, f"child {pid} outlived its parent"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's parent-death signal is Linux's")
def test_without_it_the_child_outlives_its_parent() -> None:
    """The check above can fail: the same child without ``die_with_parent`` survives."""
    pid, alive = _child_after_parent_killed("no", 1.0)
    try:
        assert alive
    finally:
        if alive:
            os.kill(pid, signal.SIGKILL)
