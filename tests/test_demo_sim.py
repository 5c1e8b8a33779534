"""``llumnix demo --sim`` as a user runs it: a real process that runs the same requests on
two simulated clusters side by side, prints both dashboards, a line per migration
(Llumnix) and per preemption (round-robin), and a summary where round-robin preempts and
Llumnix migrates instead (a seeded simulation: the same numbers every run)."""
from __future__ import annotations

import re
import subprocess
import sys


def demo(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llumnix.cli", "demo", "--sim", "--port", "0", *flags],
                          capture_output=True, text=True, timeout=300)


def test_round_robin_preempts_where_llumnix_migrates():
    r = demo("--speed", "200")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.startswith("simulated: the same 390 requests (M-M, 1.3 req/s) to two clusters of 4 instances"), out
    for system in ("llumnix", "round-robin"):
        assert re.search(rf"^  {system} +http://127\.0\.0\.1:\d+/{system}/dashboard +\(llumnix top --url ", out, re.M)
    assert re.search(r"^ +[\d.]+s  llumnix +migration req-\d+ (instance-\d) -> (?!\1)instance-\d committed, "
                     r"stall [\d.]+ ms$", out, re.M), out
    assert re.search(r"^ +[\d.]+s  round-robin +instance-\d preempted \d+ requests? \(its KV cache is full", out,
                     re.M), out
    assert "round-robin  migration" not in out
    rows = {m[1]: m for m in re.finditer(
        r"^  (\S+) +(\d+) preemptions, (\d+) migrations committed.*; prefill \(TTFT\) mean ([\d.]+) s, P99 ([\d.]+) s$",
        out, re.M)}
    assert set(rows) == {"llumnix", "round-robin"}, out
    ll, rr = rows["llumnix"], rows["round-robin"]
    assert int(ll[3]) > 50 and int(rr[3]) == 0
    assert int(rr[2]) > 5 * int(ll[2])  # 37 against 4 (seed 0)
    assert float(rr[5]) > 10 * float(ll[5])  # P99 prefill: 199 s against 1.1 s


def test_a_running_gateway_does_not_apply():
    r = demo("--url", "http://127.0.0.1:1")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "llumnix demo: error: --sim starts its own simulated clusters: --url does not apply"
