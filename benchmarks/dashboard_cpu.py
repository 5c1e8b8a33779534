"""What an open /dashboard costs the gateway, and how the page holds up with 64 instances.

``cluster`` (default): `llumnix serve` (2 instances) is started, then the CPU time of its
process (the gateway) and of its whole process tree (Ray, LlumSched, the instances) is
measured over --seconds windows with no page open and with one page open in headless
Chromium (watching /admin/cluster: answered as the view changes; a page from before
watches polled it every 0.5 s), alternated --rounds times; with
``--clients N``, N clients stream completions through the gateway the whole time (the
issue's "under 32 clients"), and each window counts the tokens they got. Since a window's
noise under load is larger than the page, ``--poll-rate R`` adds a third window per round:
R polls a second of /admin/cluster from this process, no page; the gateway's CPU per poll
from it (over the no-page window), times a polling page's 2 polls a second, is that page's
cost measured with R/2 times the signal (a watching page asks at most 5 times a second,
and only while the view changes).

``sim64``: `llumnix simulate --live` with 64 instances (``--sim-speed``), one page open
through the DevTools protocol (tests/devtools.py), sampled for --seconds: the page's own
time to draw each poll (``renderMs``), how long a script waits for its main thread, how
soon an update published by the server shows on the page, and the CPU of the simulating
process and of the browser.

    python -m benchmarks.dashboard_cpu --model DIR --clients 32 --seconds 30 --rounds 3 --poll-rate 20
    python -m benchmarks.dashboard_cpu sim64 --seconds 60

Writes JSON (machine, settings, load average, each window) to --out (default
./llumnix-results/dashboard_cpu[-sim64].json) and prints a summary. 2026-11-28, a 2-core
machine shared with other work: idle, the page +0.45% of the gateway's core (load 13);
under 32 clients (tiny model, ~2,600 tokens/s, load 8-23) +2.6-2.8% raw and 0.25-0.60%
fitted; with 64 simulated instances (load 12) a poll drawn in 7.2 ms and an update on the
page 0.49 s after the server published it (medians). 2026-11-29, the page watching
/admin/cluster against 14d441c's 0.5 s poll, alternated, 3 runs each at load 14-19: the
update lag 0.62 s against 0.97 s (the median of the runs' medians). The committed results:
benchmarks/results/dashboard_cpu-*.json; docs/serving.md has the figures."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
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


class Streams:
    """``n`` clients streaming completions through the gateway until stopped; ``tokens``
    counts the chunks they received (a window's throughput: the page must not buy its CPU
    share by slowing the clients down)."""

    def __init__(self, url: str, n: int, max_tokens: int = 64) -> None:
        self.url, self.n, self.max_tokens = url, n, max_tokens
        self.tokens = self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _client(self, i: int) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=120) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            body = {"model": model, "prompt": f"client {i} says", "max_tokens": self.max_tokens, "stream": True,
                    "ignore_eos": True, "temperature": 0}
            while not self._stop.is_set():
                try:
                    with client.stream("POST", "/v1/completions", json=body) as r:
                        for line in r.iter_lines():
                            if line.startswith("data: {"):
                                self.tokens += 1
                except httpx.HTTPError:
                    self.errors += 1


def poller(url: str, key: str, rate: float, stop: threading.Event) -> None:
    """``rate`` GETs of /admin/cluster a second, as ``rate / 2`` pages would make."""
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        next_at = time.monotonic()
        while not stop.is_set():
            client.get("/admin/cluster").raise_for_status()
            next_at += 1.0 / rate
            time.sleep(max(0.0, next_at - time.monotonic()))


def window(proc: psutil.Process, seconds: float, streams: Streams | None) -> dict[str, float]:
    """Shares of one core over ``seconds``: the serve process, and its tree; the clients' tokens/s."""
    g0, t0, w0 = cpu_seconds(proc, False), cpu_seconds(proc, True), time.monotonic()
    n0 = streams.tokens if streams else 0
    time.sleep(seconds)
    dt = time.monotonic() - w0
    return {"gateway": (cpu_seconds(proc, False) - g0) / dt, "tree": (cpu_seconds(proc, True) - t0) / dt,
            "tokens_per_s": ((streams.tokens if streams else 0) - n0) / dt, "load1": os.getloadavg()[0]}


def chromium() -> str:
    exe = next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)
    if exe is None:
        sys.exit("no chromium: apt-get install -y chromium")
    return exe


def open_page(url: str, profile: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
                             f"--user-data-dir={profile}", url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cluster_rounds(args: argparse.Namespace, url: str, key: str, proc: psutil.Process,
                   streams: Streams | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        kinds = ["none", "page"] if r % 2 == 0 else ["page", "none"]  # alternate: drift falls on both
        if args.poll_rate:
            kinds.append("polls")
        for kind in kinds:
            if kind == "none":
                rows.append({"round": r, "page": False, "kind": kind, **window(proc, args.seconds, streams)})
            elif kind == "polls":
                stop = threading.Event()
                t = threading.Thread(target=poller, args=(url, key, args.poll_rate, stop), daemon=True)
                t.start()
                time.sleep(1)
                rows.append({"round": r, "page": None, "kind": kind, **window(proc, args.seconds, streams)})
                stop.set()
                t.join(timeout=30)
            else:
                with tempfile.TemporaryDirectory() as profile:
                    page = open_page(f"{url}/dashboard?key={key}", Path(profile))
                    try:
                        time.sleep(5)  # the browser's own start, and the first polls
                        rows.append({"round": r, "page": True, "kind": kind, **window(proc, args.seconds, streams)})
                    finally:
                        page.terminate()
                        page.wait(timeout=30)
    return rows


def run_cluster(args: argparse.Namespace) -> dict[str, Any]:
    port, key = free_port(), "bench"
    url = f"http://127.0.0.1:{port}"
    log = open(tempfile.mktemp(prefix="dashboard-cpu-", suffix=".log"), "w")  # noqa: SIM115 - the server outlives no block here
    serve = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "serve", "--model", args.model, "--port", str(port),
                              "--instances", "2", "--admin-key", key], stdout=log, stderr=subprocess.STDOUT)
    streams = Streams(url, args.clients) if args.clients else None
    try:
        wait_until_healthy(url, serve, 600.0, "llumnix serve")
        proc = psutil.Process(serve.pid)
        if streams:
            streams.start()
        time.sleep(10)  # start-up's tail (compilation, first statuses) out of the first window
        rows = cluster_rounds(args, url, key, proc, streams)
    finally:
        if streams:
            streams.stop()
        serve.terminate()
        serve.wait(timeout=120)

    def mean(kind: str, what: str) -> float:
        return statistics.fmean(row[what] for row in rows if row["kind"] == kind)

    summary: dict[str, Any] = {what: {"closed": mean("none", what), "open": mean("page", what),
                                      "page": mean("page", what) - mean("none", what)} for what in ("gateway", "tree")}
    summary["tokens_per_s"] = {"closed": mean("none", "tokens_per_s"), "open": mean("page", "tokens_per_s")}
    if args.poll_rate:
        per_poll = (mean("polls", "gateway") - mean("none", "gateway")) / args.poll_rate
        summary["polls"] = {"gateway": mean("polls", "gateway"), "cpu_s_per_poll": per_poll,
                            "page_estimate": 2 * per_poll}
    if streams and args.poll_rate:
        summary["fit"] = fit(rows, args.poll_rate)
    if streams:
        summary["client_errors"] = streams.errors
    return {"windows": rows, "summary": summary}


def fit(rows: list[dict[str, Any]], poll_rate: float) -> dict[str, Any]:
    """Under load a window's CPU follows its clients' throughput, which other work on the
    machine moves by 2-3x between windows: least squares of each window's share of a core
    on (1, tokens/s, polls/s: 0, 2 for a page, ``poll_rate``), and the page's 2 polls/s of it."""
    import numpy as np

    polls = {"none": 0.0, "page": 2.0, "polls": poll_rate}
    x = np.array([[1.0, row["tokens_per_s"], polls[row["kind"]]] for row in rows])
    out: dict[str, Any] = {}
    for what in ("gateway", "tree"):
        coef = np.linalg.lstsq(x, np.array([row[what] for row in rows]), rcond=None)[0]
        out[what] = {"base": float(coef[0]), "per_1000_tokens_per_s": 1000 * float(coef[1]),
                     "per_poll_per_s": float(coef[2]), "page": 2 * float(coef[2])}
    return out


def print_cluster(summary: dict[str, Any]) -> None:
    for what in ("gateway", "tree"):
        s = summary[what]
        print(f"{what}: {100 * s['closed']:.2f}% of a core with no page, {100 * s['open']:.2f}% with one open "
              f"(the page: {100 * s['page']:+.2f}%)")
    tps = summary["tokens_per_s"]
    print(f"clients' tokens/s: {tps['closed']:.0f} with no page, {tps['open']:.0f} with one")
    if "polls" in summary:
        p = summary["polls"]
        print(f"gateway CPU per /admin/cluster poll: {1000 * p['cpu_s_per_poll']:.2f} ms; a page's 2 polls/s: "
              f"{100 * p['page_estimate']:.2f}% of a core")
    for what, f in summary.get("fit", {}).items():
        print(f"{what}, fitted on the windows' tokens/s and polls/s: the page {100 * f['page']:.2f}% of a core "
              f"(1,000 tokens/s: {100 * f['per_1000_tokens_per_s']:.1f}%)")


SIM64 = """\
name: dashboard-64
latency_model: a10-llama7b
cluster: {num_instances: 64, num_blocks: 300, max_model_len: 4000}
systems:
  llumnix: {dispatch: llumnix, migration: true, migrate_out_threshold: 3}
traces:
  - {name: L-L, kind: L-L, num_requests: 20000, rates: [22]}
"""
"""64 instances, ~260 requests running after a simulated minute, migrations from ~20 s."""


def run_sim64(args: argparse.Namespace) -> dict[str, Any]:
    from tests.devtools import headless_page

    work = Path(tempfile.mkdtemp(prefix="dashboard-sim64-"))
    (work / "live.yaml").write_text(SIM64)
    port = free_port()
    url = f"http://127.0.0.1:{port}/llumnix"
    sim = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "simulate", str(work / "live.yaml"), "--live",
                            "--port", str(port), "--speed", str(args.sim_speed)], stdout=subprocess.DEVNULL)
    try:
        wait_until_healthy(url, sim, 120.0, "llumnix simulate --live")
        with headless_page(chromium(), work / "profile") as page:
            page.call("Page.navigate", url=f"{url}/dashboard")
            return sample_page(page, url, psutil.Process(sim.pid), args.seconds)
    finally:
        sim.kill()
        sim.wait()


def sample_page(page: Any, url: str, sim: psutil.Process, seconds: float) -> dict[str, Any]:
    import httpx

    browser = next(p for p in psutil.Process().children(recursive=True) if "chrom" in p.name())
    time.sleep(10)  # the first polls, and a simulated minute's load at 4x (well, 40 s)
    renders, probes, lags = [], [], []
    c0, b0, w0 = cpu_seconds(sim, False), cpu_seconds(browser, True), time.monotonic()
    while time.monotonic() - w0 < seconds:
        doc = httpx.get(f"{url}/admin/cluster").json()["sim"]
        while float(page.evaluate("document.body.dataset.simTime || -1")) < doc["time_s"]:
            time.sleep(0.01)
        lags.append(time.time() - doc["published_at"])  # from the server publishing it to the page showing it
        t1 = time.monotonic()
        renders.append(float(page.evaluate("document.body.dataset.renderMs")))
        probes.append(time.monotonic() - t1)
        time.sleep(0.37)
    dt = time.monotonic() - w0
    rows = page.evaluate("document.querySelectorAll('#instances tbody tr').length")
    series = page.evaluate("[...series.values()].reduce((a, p) => a + p.length, 0)")

    def dist(xs: list[float]) -> dict[str, float]:
        s = sorted(xs)
        return {"n": len(s), "median": statistics.median(s), "p90": s[int(0.9 * (len(s) - 1))], "max": s[-1]}

    return {"instances_on_page": rows, "chart_points": series,
            "render_ms": dist(renders), "main_thread_probe_s": dist(probes),
            "update_lag_s": {**dist(lags), "share_over_1_s": sum(x > 1.0 for x in lags) / len(lags)},
            "render_max_ms_since_open": float(page.evaluate("document.body.dataset.renderMaxMs")),
            "sim_process_core_share": (cpu_seconds(sim, False) - c0) / dt,
            "browser_core_share": (cpu_seconds(browser, True) - b0) / dt, "load1": os.getloadavg()[0],
            "errors": page.console_errors()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", default="cluster", choices=["cluster", "sim64"])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=0, help="clients streaming the whole time (cluster)")
    ap.add_argument("--poll-rate", type=float, default=0.0, help="a third window of R polls/s, no page (cluster)")
    ap.add_argument("--sim-speed", type=float, default=4.0, help="simulated seconds per second (sim64)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or f"{RESULTS_DIR}/dashboard_cpu{'-sim64' if args.mode == 'sim64' else ''}.json")
    load0 = os.getloadavg()
    result = run_sim64(args) if args.mode == "sim64" else run_cluster(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "settings": vars(args),
                               "loadavg": {"start": load0, "end": os.getloadavg()}, **result}, indent=2))
    if args.mode == "sim64":
        print(json.dumps({k: v for k, v in result.items() if k != "errors"}, indent=1))
    else:
        print_cluster(result["summary"])
    print(f"wrote {out} (load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
