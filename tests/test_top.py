"""`llumnix top`'s view of an `/admin/cluster` answer (a literal snapshot), and its one
line when the gateway is not there. The view of a real cluster: tests/cluster/test_serve_logs.py."""
from __future__ import annotations

import pytest

from llumnix.cli import main
from llumnix.cluster.startup import free_port
from llumnix.top import render

INFO = {"dispatch_policy": "llumnix", "num_dispatched": 42,
        "instances": [
            {"instance_id": "instance-1", "freeness": 3.25, "num_running": 6, "num_waiting": 2, "num_used_blocks": 45,
             "num_total_blocks": 50, "is_terminating": True, "is_schedulable": True, "num_preemptions": 1,
             "role": None},
            {"instance_id": "instance-0", "freeness": float("inf"), "num_running": 0, "num_waiting": 0,
             "num_used_blocks": 0, "num_total_blocks": 50, "is_terminating": False, "is_schedulable": True,
             "num_preemptions": 0, "role": "decode"}],
        "migrations": {"committed": 2, "aborted": 1, "in_flight": ["instance-1"], "recent": [
            {"request_id": "a", "src_instance_id": "instance-1", "dst_instance_id": "instance-0", "committed": True,
             "downtime": 0.0055, "end_time": 95.0},
            {"request_id": "b", "src_instance_id": "instance-1", "dst_instance_id": "instance-0", "committed": False,
             "abort_code": "dst_full", "end_time": 98.0},
            {"request_id": "c", "src_instance_id": "instance-1", "dst_instance_id": "instance-0", "committed": True,
             "was_queued": True, "end_time": 99.5}]}}


def test_the_view_of_a_snapshot():
    lines = render(INFO, "http://gw:8000", 100.0).splitlines()
    assert lines[0].startswith("llumnix top  http://gw:8000  ") and lines[0].endswith(
        "dispatch llumnix  dispatched 42  instances 2")
    assert lines[1] == "migrations: 2 committed, 1 aborted, 1 in flight"
    assert lines[3].split() == ["INSTANCE", "STATE", "ROLE", "KV", "USED", "FREENESS", "RUNNING", "WAITING", "PREEMPT"]
    assert lines[4].split() == ["instance-0", "serving", "decode", "[..........]", "0%", "inf", "0", "0", "0"]
    assert lines[5].split() == ["instance-1", "draining", "-", "[#########.]", "90%", "3.2", "6", "2", "1"]
    assert lines[7:] == ["recent migrations (newest first):",
                         "    0.5s ago  c  instance-1 -> instance-0  committed (queued: no stall)",
                         "    2.0s ago  b  instance-1 -> instance-0  aborted (dst_full)",
                         "    5.0s ago  a  instance-1 -> instance-0  committed, stall 5.5 ms"]


def test_an_empty_cluster():
    text = render({"instances": [], "migrations": {}}, "u", 0.0)
    assert "(no instance reports yet)" in text and text.endswith("recent migrations: none yet")


def test_no_gateway_is_one_line(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["top", "--url", url, "--once"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"llumnix top: error: cannot reach {url}: ConnectError"]


@pytest.mark.parametrize("interval", ["0.2", "0.001"])  # 0.001: every fetch is later than the next redraw's time
def test_the_live_view_redraws_until_ctrl_c(interval):
    import signal
    import subprocess
    import sys
    import time

    from llumnix.gateway.inprocess import InProcessGateway
    from tests.gateway.test_metrics import StatusBackend

    with InProcessGateway(StatusBackend()) as url:
        # As a terminal's foreground job gets it: a job a script started in the background
        # (CI's `make test`) inherits SIGINT ignored, and Python then leaves it ignored.
        proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "top", "--url", url, "--interval", interval],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(3.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    screens = out.split("\x1b[H\x1b[2J")[1:]
    assert len(screens) >= 3, out
    assert all(screen.startswith(f"llumnix top  {url}  ") and "\ni0 " in screen for screen in screens[:-1]), screens[0]


def test_a_simulations_view_is_on_its_clock():
    """``llumnix simulate --live``'s document: times are the simulation's (``requests.time``),
    a migration is dated by ``reported_at`` (a real report's ``end_time`` is on its source's
    monotonic clock), and a line says where the run stands."""
    info = {**INFO, "requests": {"time": 1000.0},
            "sim": {"name": "llumnix", "label": "M-M at 1.3 req/s, 390 requests, 4 instances", "time_s": 123.45,
                    "speed": 10, "behind_s": 2.5, "done": False, "num_requests": 390, "num_finished": 120},
            "migrations": {"committed": 1, "recent": [
                {"request_id": "a", "src_instance_id": "instance-1", "dst_instance_id": "instance-0", "committed": True,
                 "downtime": 0.0055, "end_time": 5.0, "reported_at": 997.0}]}}
    lines = render(info, "http://sim:8000/llumnix", 5.0e9).splitlines()  # the wall clock is not the view's
    assert lines[2] == ("simulated: llumnix, M-M at 1.3 req/s, 390 requests, 4 instances; t = 123.5 s at 10x, "
                        "120/390 requests done; 2.5 s behind")
    assert lines[-1] == "    3.0s ago  a  instance-1 -> instance-0  committed, stall 5.5 ms"
