"""Time to first answer of `llumnix serve` (`make run`'s default: local Ray, 2 x SmolLM2 on
CPU), with its breakdown, over several runs: median and spread.

Each run starts `llumnix serve` as a user would, timestamps every line it prints as the
line arrives, and sends one chat request once "ready" appears. The phases, in seconds
from the process's start:

  config     the "starting" line: imports, flags, the port, the gateway's tokenizer
  ray        Ray up (the line's own figure: ray.init)
  actors     the instance actors created ("instance i of N loading")
  load       each instance's "loaded in X s" (process start, model load, warm-up)
  gateway    "ready": the instances registered and uvicorn serving
  first      the first chat answer (8 tokens, greedy)

Measured 2026-11-26 (session 23) on the 2-core VM with nothing else running (load 2-3),
3 runs each, median [min, max]: with the weight cache warm (`~/.cache/llumnix/weights`,
every start after the first) first answer 10.7 s [10.3, 11.6] (flags and port 0.6, Ray's
init 5.5 [4.8, 6.0], actors created 6.1, each instance's load 3.3 [2.2, 3.6] in parallel,
ready 10.0, first answer 10.7), 3.24 GiB resident; with `LLUMNIX_WEIGHT_CACHE=0` (a first
start) 12.4 s [11.7, 13.2] (Ray 4.9, each load 4.4 [3.8, 5.4]), 3.41 GiB. Earlier the
same day, loaded 17-44 by other agents: 100.6 s [47.3, 116.4].

    .venv/bin/python -m benchmarks.startup [--runs 3] [--out llumnix-results/startup.json] [-- serve args]
    # before and after, alternated run for run, each from a snapshot of its src/:
    git archive HEAD~3 src | tar -x -C /tmp/before && git archive HEAD src | tar -x -C /tmp/after
    .venv/bin/python -m benchmarks.startup --src /tmp/after/src --baseline-src /tmp/before/src
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from llumnix.bench.machine import RESULTS_DIR, machine_info

BIN = Path(sys.executable).parent


def one_run(port: int, serve_args: list[str], timeout_s: float, src: str | None = None) -> dict[str, Any]:
    """One start of `llumnix serve` (with ``src`` first on PYTHONPATH: another checkout's
    code) until its first chat answer, then its process tree's memory, then SIGINT."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    t0 = time.monotonic()
    proc = subprocess.Popen([str(BIN / "llumnix"), "serve", "--port", str(port), *serve_args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    threading.Thread(target=_read_lines, args=(proc, t0, lines), daemon=True).start()
    try:
        answer = _first_answer(proc, port, t0, timeout_s, lines)
        first = time.monotonic() - t0
        rss = _tree_rss_bytes(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    ready = next((t for t, line in lines if "ready in" in line), None)
    return {**phases(lines), "gateway_s": ready, "first_answer_s": first, "rss_gib": round(rss / 2**30, 2),
            "answer": answer}


def _read_lines(proc: subprocess.Popen[str], t0: float, lines: list[tuple[float, str]]) -> None:
    """Each line timestamped as it arrives (a thread blocked in readline: select on the
    pipe would miss lines already in Python's buffer)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - t0, line))


def _first_answer(proc: subprocess.Popen[str], port: int, t0: float, timeout_s: float,
                  lines: list[tuple[float, str]]) -> Any:
    """Ask until answered: refused before the port is taken, held in its backlog after."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0}
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited ({proc.returncode}):\n" + "".join(t for _, t in lines[-20:]))
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=timeout_s)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        r.raise_for_status()
        return r.json()["choices"][0]
    raise TimeoutError(f"no answer within {timeout_s:g} s")


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (Ray's processes and the instances)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def phases(lines: list[tuple[float, str]]) -> dict[str, Any]:
    """The phases of one run from its timestamped lines (see the module's docstring)."""
    out: dict[str, Any] = {"load_s": [], "lines": [[round(t, 3), text.rstrip()] for t, text in lines]}
    for t, line in lines:
        if "starting" in line and "instance(s)" in line:
            out["config_s"] = t
        elif m := re.search(r"Ray (?:started|joined) in (\d+\.\d+) s", line):
            out["ray_init_s"], out["ray_up_s"] = float(m.group(1)), t
        elif re.search(r"instance \d+ of \d+ loading", line):
            out["actors_created_s"] = t
        elif m := re.search(r"instance \d+ of \d+ loaded in (\d+\.\d+) s", line):
            out["load_s"].append(float(m.group(1)))
            out["all_loaded_s"] = t
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("config_s", "ray_init_s", "ray_up_s", "actors_created_s", "all_loaded_s", "gateway_s", "first_answer_s",
            "rss_gib")
    out: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
                        "max": round(max(values), 2)}
    loads = [x for r in runs for x in r["load_s"]]
    if loads:
        out["instance_load_s"] = {"median": round(statistics.median(loads), 2), "min": min(loads), "max": max(loads)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--port", type=int, default=18000)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take to answer")
    p.add_argument("--out", default=f"{RESULTS_DIR}/startup.json", help="JSON record (default: %(default)s, "
                   "in the working directory)")
    p.add_argument("--label", default="", help="what this run measures (a commit, a change)")
    p.add_argument("--src", default=None, metavar="DIR",
                   help="run this src/ instead of the installed package's (a snapshot: `git archive HEAD src`)")
    p.add_argument("--baseline-src", default=None, metavar="DIR",
                   help="also run another checkout's src/ (e.g. a git worktree of the commit before), "
                   "alternated with this one run for run")
    p.add_argument("serve_args", nargs="*", help="after --: more `llumnix serve` flags")
    args = p.parse_args(argv)
    before = machine_info()
    variants = {"current": args.src, **({"baseline": args.baseline_src} if args.baseline_src else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for i in range(args.runs):
        for name, src in variants.items():
            run = one_run(args.port, args.serve_args, args.timeout, src)
            runs[name].append(run)
            print(f"run {i + 1} {name}: config {run.get('config_s', 0):.1f} s, Ray up {run.get('ray_up_s', 0):.1f} s "
                  f"(init {run.get('ray_init_s', 0):.1f}), loaded {run.get('all_loaded_s', 0):.1f} s "
                  f"(instances {', '.join(f'{x:.1f}' for x in run['load_s'])}), ready {run['gateway_s'] or 0:.1f} s, "
                  f"first answer {run['first_answer_s']:.1f} s, {run['rss_gib']} GiB", flush=True)
    summary = {name: summarize(r) for name, r in runs.items()}
    print(json.dumps(summary, indent=1))
    record = {"benchmark": "startup", "label": args.label, "serve_args": args.serve_args, "src": args.src,
              "baseline_src": args.baseline_src, "summary": summary, "runs": runs, "machine_before": before,
              "load_avg_after_1m": round(os.getloadavg()[0], 2)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
