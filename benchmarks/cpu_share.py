"""Where the CPU goes while a cluster serves: CPU seconds per process (and per thread in
the instance actors, LlumSched and the gateway) over one `llumnix bench serve` load.

    .venv/bin/llumnix serve &                      # the default cluster, port 8000
    .venv/bin/python benchmarks/cpu_share.py       # -> benchmarks/results/cpu_share.json

The simulator's profile (`llumnix profile`) times an engine beside one busy neighbor
engine; everything else here (LlumSched, the gateway, Ray's daemons, the load client)
also runs on the same cores in a real cluster. This measures how much.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from llumnix.bench.machine import machine_info, write_result

_PER_THREAD = ("InstanceActor", "LlumSched", "llumnix serve")


def _snapshot() -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            t = p.cpu_times()
            threads = {}
            if any(k in cmd for k in _PER_THREAD):
                for th in p.threads():
                    threads[th.id] = th.user_time + th.system_time
            out[p.pid] = {"name": p.info["name"], "cmd": cmd[:100], "cpu": t.user + t.system, "nice": p.nice(),
                          "threads": threads}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def _thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def _role(cmd: str) -> str:
    for key, role in (("InstanceActor", "instance"), ("LlumSched", "llumsched"), ("llumnix serve", "gateway"),
                      ("bench serve", "load client"), ("raylet", "ray daemons"), ("gcs_server", "ray daemons"),
                      ("ray/", "ray daemons")):
        if key in cmd:
            return role
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--num-requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=0.5)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/cpu_share.json")
    args = ap.parse_args()
    load = [sys.executable, "-m", "llumnix.cli", "bench", "serve", "--url", args.url, "--num-requests",
            str(args.num_requests), "--rate", str(args.rate), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--out", "/tmp/llumnix-cpu-share"]
    before = _snapshot()
    t0 = time.time()
    client = psutil.Popen(load, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client_cpu = 0.0
    while client.poll() is None:  # the client's own CPU, read before it exits
        try:
            t = client.cpu_times()
            client_cpu = t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    after = _snapshot()
    wall = time.time() - t0
    procs = []
    for pid, a in after.items():
        cpu = a["cpu"] - before.get(pid, {"cpu": 0.0})["cpu"]
        if cpu < 0.2:
            continue
        old = before.get(pid, {"threads": {}})["threads"]
        threads = sorted(((_thread_name(pid, tid), v - old.get(tid, 0.0)) for tid, v in a["threads"].items()),
                         key=lambda x: -x[1])
        procs.append({"role": _role(a["cmd"]), "cmd": a["cmd"], "nice": a["nice"], "cpu_s": round(cpu, 2),
                      "share_of_one_core": round(cpu / wall, 4),
                      "threads": [{"name": n, "cpu_s": round(v, 2)} for n, v in threads if v >= 0.1]})
    procs.append({"role": "load client", "cmd": " ".join(load[2:5]), "nice": 0, "cpu_s": round(client_cpu, 2),
                  "share_of_one_core": round(client_cpu / wall, 4), "threads": []})
    procs.sort(key=lambda p: -p["cpu_s"])
    by_role: dict[str, float] = {}
    for p in procs:
        by_role[p["role"]] = round(by_role.get(p["role"], 0.0) + p["share_of_one_core"], 4)
    result = {"benchmark": "cpu_share", "wall_s": round(wall, 1), "share_of_one_core_by_role": by_role,
              "processes": procs, "machine": machine_info(), "settings": vars(args)}
    write_result(args.out, result, quiet=True)
    print(f"{wall:.0f} s of load; share of one core by role:")
    for role, share in sorted(by_role.items(), key=lambda kv: -kv[1]):
        print(f"  {role:>12}: {share:6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
