"""What an open /dashboard costs an idle cluster: `llumnix serve` (2 instances) is started,
then the CPU time of its process (the gateway) and of its whole process tree (Ray, LlumSched,
the instances) is measured over --seconds with no page open, with one page open in headless
Chromium (polling /admin/cluster every 0.5 s), and with none again, alternated --rounds times.

    python -m benchmarks.dashboard_cpu --model smollm2 --seconds 30 --rounds 2

Writes JSON (machine, settings, each window's share of a core) to --out (default
./llumnix-results/dashboard_cpu.json) and prints a summary. 2026-11-28, the tiny test model,
2 x 30 s each way on a 2-core machine shared with other work (load average 13): the gateway
0.43% of a core with no page, 0.88% with one open (+0.45%); the serve tree +0.63%."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from llumnix.bench.machine import RESULTS_DIR, machine_info
from llumnix.cluster.startup import free_port, wait_until_healthy


def cpu_seconds(proc: psutil.Process, tree: bool) -> float:
    procs = [proc, *proc.children(recursive=True)] if tree else [proc]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def window(proc: psutil.Process, seconds: float) -> dict[str, float]:
    """Shares of one core over ``seconds``: the serve process, and its tree."""
    g0, t0, w0 = cpu_seconds(proc, False), cpu_seconds(proc, True), time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - w0
    return {"gateway": (cpu_seconds(proc, False) - g0) / dt, "tree": (cpu_seconds(proc, True) - t0) / dt}


def open_page(url: str, profile: Path) -> subprocess.Popen[bytes]:
    exe = next(p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n)))
    return subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
                             f"--user-data-dir={profile}", url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=f"{RESULTS_DIR}/dashboard_cpu.json")
    args = ap.parse_args()
    port, key = free_port(), "bench"
    url = f"http://127.0.0.1:{port}"
    log = open(tempfile.mktemp(prefix="dashboard-cpu-", suffix=".log"), "w")  # noqa: SIM115 - the server outlives no block here
    serve = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "serve", "--model", args.model, "--port", str(port),
                              "--instances", "2", "--admin-key", key], stdout=log, stderr=subprocess.STDOUT)
    rows: list[dict[str, Any]] = []
    try:
        wait_until_healthy(url, serve, 600.0, "llumnix serve")
        proc = psutil.Process(serve.pid)
        time.sleep(10)  # start-up's tail (compilation, first statuses) out of the first window
        for r in range(args.rounds):
            rows.append({"round": r, "page": False, **window(proc, args.seconds)})
            with tempfile.TemporaryDirectory() as profile:
                page = open_page(f"{url}/dashboard?key={key}", Path(profile))
                try:
                    time.sleep(5)  # the browser's own start, and the first polls
                    rows.append({"round": r, "page": True, **window(proc, args.seconds)})
                finally:
                    page.terminate()
                    page.wait(timeout=30)
    finally:
        serve.terminate()
        serve.wait(timeout=120)

    def mean(page: bool, what: str) -> float:
        xs = [row[what] for row in rows if row["page"] is page]
        return sum(xs) / len(xs)

    summary = {what: {"closed": mean(False, what), "open": mean(True, what),
                      "page": mean(True, what) - mean(False, what)} for what in ("gateway", "tree")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "settings": vars(args), "windows": rows,
                               "summary": summary}, indent=2))
    for what, s in summary.items():
        print(f"{what}: {100 * s['closed']:.2f}% of a core with no page, {100 * s['open']:.2f}% with one open "
              f"(the page: {100 * s['page']:+.2f}%)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
