"""The hostile-ports benchmark end to end at a small scale: real attacker processes, real
instances, a record that says what happened."""
from __future__ import annotations

import argparse

from benchmarks.hostile_ports import run


def test_a_small_flood_is_measured_and_the_checks_complete():
    args = argparse.Namespace(num=60, trickle_s=0.2, sources=2, hold_s=6.0, settle_s=0.5, rounds=1,
                              step_s=0.002, drain_requests=2, out=None)
    res = run(args)
    assert [a["opened"] for a in res["attackers"]] == [60, 60]
    assert res["all_completed"] and res["baseline"][0]["migration"]["committed"]
    for drain in res["drain"].values():  # every request left by a committed live migration
        assert drain["drained"] and drain["num_committed"] == 2 and drain["all_moved_by_migration"], drain
    assert res["drain"]["under_attack"]["flood_held_throughout"]
    # 30 a source address is under the cap per address: every stranger waited at the gate
    assert all(g["pending"] + g["expired"] + g["evicted"] + g["refused"] >= 60 for g in res["gates"].values())
    assert res["threads"]["peak"] - res["threads"]["before"] <= 6  # the checks' own threads, no stranger's
