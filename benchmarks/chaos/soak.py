"""Chaos soak: `llumnix serve` (2 instances, Redis meta store) under steady greedy load
while instances, LlumSched, the gateway's upstream connections, client streams and Redis
are broken at seeded random times; every completed answer is compared token for token
with a fault-free reference.

    python -m benchmarks.chaos.soak                 # 30 minutes of faults
    python -m benchmarks.chaos.soak --minutes 3     # a trial

Writes benchmarks/chaos/results/soak-<date>.json and prints a summary; serve's and
Redis's logs go to --log-dir. See benchmarks/chaos/README.md for what is measured.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import secrets
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.chaos.faults import KINDS, Injector, schedule  # noqa: E402
from benchmarks.chaos.load import CAPACITY_RULE, Driver  # noqa: E402
from benchmarks.chaos.monitor import Monitor, log_summary, process_rss  # noqa: E402
from benchmarks.chaos.procs import ROOT, RayView, Redis, Serve  # noqa: E402
from benchmarks.chaos.workload import Outcome, compare  # noqa: E402

from llumnix.cluster.startup import free_port  # noqa: E402

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the faulted soak (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--serve-args", default="--kv-cache-mib 32 --migrate-out-threshold 10",
                   help="more `llumnix serve` flags (default '--kv-cache-mib 32 --migrate-out-threshold 10': "
                        "45 blocks an instance and a higher threshold, so that this CPU's modest load keeps "
                        "migrations under way)")
    p.add_argument("--load-fraction", type=float, default=0.8, help="soak rate as a fraction of capacity")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--ramp-levels", default="1,2,4,8,16,32,64")
    p.add_argument("--ramp-window", type=float, default=30.0, metavar="S")
    p.add_argument("--fault-interval", type=float, default=30.0, metavar="S", help="mean seconds between faults")
    p.add_argument("--faults", default=",".join(KINDS), help=f"kinds to inject (default all: {','.join(KINDS)})")
    p.add_argument("--max-in-flight", type=int, default=64)
    p.add_argument("--request-timeout", type=float, default=240.0, metavar="S")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--log-dir", type=Path, default=None, help="serve's and Redis's logs (default /tmp/...)")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def wait_health(monitor: Monitor, serve: Serve, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not serve.is_running():
            raise RuntimeError(f"serve exited ({serve.proc.returncode if serve.proc else None}); see {serve.log_path}")
        h = await monitor.health()
        if h.get("status") == "ok":
            return h
        await asyncio.sleep(2.0)
    raise RuntimeError(f"/health not ok after {timeout_s:.0f} s")


async def wait_idle(monitor: Monitor, timeout_s: float) -> dict[str, Any]:
    """Until every instance reports no running or waiting request and /health is ok."""
    t0 = time.monotonic()
    last: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout_s:
        info = await monitor.cluster()
        h = await monitor.health()
        insts = info.get("instances") or []
        busy = [i["instance_id"] for i in insts if i["num_running"] or i["num_waiting"]]
        last = {"busy": busy, "health": h.get("status"), "waited_s": round(time.monotonic() - t0, 1)}
        if insts and not busy and h.get("status") == "ok":
            return {**last, "idle": True}
        await asyncio.sleep(2.0)
    return {**last, "idle": False}


def judge(outs: list[Outcome], refs: dict[str, Outcome], max_tokens: int, t0: float,
          faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by status and verdict; every error with its reason; every mismatch in detail."""
    verdicts: Counter[str] = Counter()
    mismatches, errors = [], []
    for o in outs:
        if o.status == "ok":
            v = compare(o, refs[o.shape.key], max_tokens)
            verdicts[v.kind] += 1
            if v.kind != "match":
                before = [f for f in faults if f["time"] <= o.end_s]
                mismatches.append({"t": round(o.sent_s - t0, 1), "shape": o.shape.key, "stream": o.shape.stream,
                                   "verdict": v.kind, "index": v.index, "detail": v.detail,
                                   "response_id": o.response_id, "num_tokens": len(o.tokens),
                                   "last_fault_before_end": ({"kind": before[-1]["kind"],
                                                              "t": round(before[-1]["time"] - t0, 1)}
                                                             if before else None)})
        elif o.status == "error":
            last = o.token_times[-1] if o.token_times else None
            # a stream's tokens stop at the fault that stopped it; others: any fault while it was open
            until = last + 1.0 if last is not None and o.shape.stream else o.end_s
            near = [{"kind": f["kind"], "t": round(f["time"] - t0, 1)} for f in faults
                    if o.sent_s - 1.0 <= f["time"] <= until]
            errors.append({"t": round(o.sent_s - t0, 1), "end_t": round(o.end_s - t0, 1), "shape": o.shape.key,
                           "stream": o.shape.stream, "num_tokens_before": len(o.tokens),
                           "last_token_t": None if last is None else round(last - t0, 2),
                           "faults_while_open": near[-3:],
                           "response_id": o.response_id, "reason": o.error})
    statuses = Counter(o.status for o in outs)
    ok = [o.end_s - o.sent_s for o in outs if o.status == "ok"]
    ok.sort()
    return {"num_sent": len(outs), "num_ok": statuses["ok"], "num_error": statuses["error"],
            "num_cut_by_client": statuses["cut"], "verdicts": dict(verdicts),
            "num_lost_or_duplicated": sum(verdicts[k] for k in ("short", "long", "gap", "repeat")),
            "num_differing_from_reference": sum(n for k, n in verdicts.items() if k != "match"),
            "latency_s": {"p50": round(ok[len(ok) // 2], 2), "p99": round(ok[int(len(ok) * 0.99)], 2),
                          "max": round(ok[-1], 2)} if ok else None,
            "error_reasons": dict(Counter(_reason(e["reason"]) for e in errors)),
            "errors": errors, "mismatches": mismatches}


def _reason(text: str | None) -> str:
    """An error's reason with request-specific ids and numbers taken out, for counting."""
    import re

    return re.sub(r"(cmpl|chatcmpl|instance)-[0-9a-f]+|\b\d+(\.\d+)?\b", "N", text or "")[:160]


def git_state() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": run("git", "rev-parse", "HEAD"), "src_dirty": bool(run("git", "status", "--porcelain", "src"))}


async def soak(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Fills ``report`` as it goes, so a run that fails part-way still says how far it got."""
    import httpx

    stamp = report["started"]
    log_dir = args.log_dir or Path(f"/tmp/llumnix-soak-{stamp}")
    log_dir.mkdir(parents=True, exist_ok=True)
    redis = Redis(free_port(), log_dir / "redis.log")
    serve_args = ["--instances", str(args.instances), "--model", args.model, "--cms", f"redis://127.0.0.1:{redis.port}",
                  *shlex.split(args.serve_args)]
    admin_key = secrets.token_hex(16)  # by environment: kept out of ps and of the report
    serve = Serve(free_port(), serve_args, log_dir / "serve.log", env={"LLUMNIX_ADMIN_KEY": admin_key})
    report.update({"git": git_state(), "args": {k: str(v) for k, v in vars(args).items()},
                   "serve_command": ["llumnix", "serve", "--port", str(serve.port), *serve_args],
                   "log_dir": str(log_dir)})
    ray_view: RayView | None = None
    redis.start()
    serve.start()
    log(f"redis on {redis.port} ({redis.binary}); serve on {serve.port}, pid {serve.pid}; logs in {log_dir}")
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_timeout, connect=10), limits=limits) as client:
            monitor = Monitor(serve.url, client, admin_key)
            await wait_health(monitor, serve, 600)
            ray_view = await asyncio.to_thread(RayView, serve.pid)
            log("cluster up; Ray driver attached")
            rng = random.Random(args.seed)
            from benchmarks.chaos.workload import build_prompts

            driver = Driver(serve.url, args.model, build_prompts(args.seed, args.num_prompts), args.max_tokens,
                            args.request_timeout, rng, client)
            t_ref = time.time()
            refs = await driver.references()
            bad = [k for k, o in refs.items() if o.status != "ok" or len(o.tokens) != args.max_tokens]
            report["reference"] = {"num": len(refs), "seconds": round(time.time() - t_ref, 1), "failed": bad}
            if bad:
                raise RuntimeError(f"no reference for {bad}: {[refs[k].error for k in bad]}")
            log(f"{len(refs)} references in {report['reference']['seconds']} s")

            levels = [int(x) for x in args.ramp_levels.split(",")]
            capacity, rows, ramp_outs = await driver.ramp(levels, args.ramp_window, log)
            rate = args.load_fraction * capacity
            report["capacity"] = {"rule": CAPACITY_RULE, "levels": rows, "capacity_rps": round(capacity, 4),
                                  "saturated": bool(rows and rows[-1]["saturated"]),
                                  "load_fraction": args.load_fraction, "load_rps": round(rate, 4)}
            report["control_no_faults"] = judge(ramp_outs, refs, args.max_tokens, t_ref, [])
            log(f"capacity {capacity:.3f} req/s -> soak at {rate:.3f} req/s; control: "
                f"{report['control_no_faults']['verdicts']}")
            if rate <= 0:
                raise RuntimeError("capacity measured 0: nothing completed in the ramp")

            await wait_idle(monitor, 120)
            before = await snapshot(monitor, serve, ray_view)
            duration = args.minutes * 60
            kinds = tuple(k for k in args.faults.split(",") if k)
            plan = schedule(random.Random(args.seed + 1), duration, args.fault_interval, kinds)
            injector = Injector(serve.pid, redis, ray_view, random.Random(args.seed + 2), monitor, driver.cuttable)
            t0 = time.time()
            monitor.start(t0)
            faults: list[dict[str, Any]] = []

            async def run_faults() -> None:
                for at, kind in plan:
                    await asyncio.sleep(max(0.0, t0 + at - time.time()))
                    rec = await injector.inject(kind)
                    rec["t"] = round(rec["time"] - t0, 1)
                    faults.append(rec)
                    log(f"fault {kind}: {json.dumps({k: v for k, v in rec.items() if k not in ('time', 'kind')})}")

            log(f"soak: {args.minutes:g} min at {rate:.3f} req/s, {len(plan)} faults planned")
            fault_task = asyncio.create_task(run_faults())
            outs, skipped = await driver.open_loop(rate, duration, args.max_in_flight, monitor.is_idle)
            fault_task.cancel()
            await asyncio.gather(fault_task, return_exceptions=True)
            t_load_end = time.time()
            log(f"load done: {len(outs)} requests; settling")
            settle = await wait_idle(monitor, 180)
            await asyncio.sleep(2.0)
            invariants = await asyncio.to_thread(ray_view.check_invariants)
            after = await snapshot(monitor, serve, ray_view)
            await monitor.stop()
            report["soak"] = {"seconds": round(t_load_end - t0, 1), "requests": judge(outs, refs, args.max_tokens, t0,
                                                                                    faults),
                              "num_not_sent_at_in_flight_cap": skipped,
                              "faults_planned": len(plan), "faults": [{k: v for k, v in f.items() if k != "time"}
                                                                      for f in faults],
                              "faults_by_kind": dict(Counter(f["kind"] for f in faults if f.get("ok"))),
                              "settle": settle}
            report["end_checks"] = end_checks(invariants, before, after, args.instances)
            series = [before["migrations"], *monitor.cluster_series, after["migrations"]]
            report["end_checks"]["migrations_during_soak"] = {
                k: growth([m.get(k) for m in series]) for k in ("committed", "aborted")}
            report["health"] = monitor.health_summary()
            report["cluster_series"] = monitor.cluster_series
            report["before"], report["after"] = before, after
    finally:
        if ray_view is not None:
            ray_view.close()
        report["serve_stop"] = await asyncio.to_thread(serve.stop)
        redis.kill()
        report["serve_log"] = log_summary(serve.log_path)


async def snapshot(monitor: Monitor, serve: Serve, ray_view: RayView) -> dict[str, Any]:
    info = await monitor.cluster()
    pids = await asyncio.to_thread(ray_view.instance_pids)
    return {"time": time.time(), "health": await monitor.health(), "rss_mib": process_rss(serve.pid, pids),
            "migrations": {k: (info.get("migrations") or {}).get(k) for k in ("committed", "aborted", "blocks_sent")},
            "gateway": info.get("gateway"), "capacity": info.get("capacity"),
            "instances": sorted(i["instance_id"] for i in info.get("instances") or [])}


def end_checks(invariants: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
               configured: int) -> dict[str, Any]:
    blocks_ok = bool(invariants) and all("error" not in c and c["num_used_blocks"] == 0 and c["num_requests"] == 0
                                         for c in invariants.values())
    rss = []
    for key, a in after["rss_mib"].items():
        b = before["rss_mib"].get(key)
        if b and a and b["pid"] == a["pid"] and b["mib"] and a["mib"]:
            rss.append({"process": key, "pid": a["pid"], "start_mib": b["mib"], "end_mib": a["mib"],
                        "growth": round(a["mib"] / b["mib"] - 1, 4)})
    return {"block_accounting": invariants, "block_accounting_ok": blocks_ok,
            "rss_same_process": rss, "rss_flat_within_5pct": all(abs(r["growth"]) <= 0.05 for r in rss),
            "instances_configured": configured, "instances_at_end": len(after["instances"]),
            "health_at_end": after["health"].get("status")}


def growth(values: list[int | None]) -> int:
    """How much a counter grew over samples, across resets (LlumSched's counters start
    from 0 when Ray restarts it): a drop means it restarted from 0."""
    total, prev = 0, None
    for v in values:
        if v is None:
            continue
        total += v if prev is None or v < prev else v - prev
        prev = v
    return total - (next((v for v in values if v is not None), 0) or 0)


def print_summary(r: dict[str, Any], path: Path) -> None:
    s, e = r.get("soak", {}), r.get("end_checks", {})
    q = s.get("requests", {})
    lines = [f"soak report: {path}",
             f"  capacity {r.get('capacity', {}).get('capacity_rps')} req/s, load {r.get('capacity', {}).get('load_rps')} req/s",
             f"  control (no faults): {r.get('control_no_faults', {}).get('verdicts')}",
             f"  requests: sent {q.get('num_sent')}, ok {q.get('num_ok')}, errors {q.get('num_error')}, "
             f"cut by client {q.get('num_cut_by_client')}",
             f"  verdicts: {q.get('verdicts')}; lost/duplicated {q.get('num_lost_or_duplicated')}",
             f"  error reasons: {q.get('error_reasons')}",
             f"  faults: {s.get('faults_by_kind')} (planned {s.get('faults_planned')})",
             f"  migrations during soak: {e.get('migrations_during_soak')}",
             f"  blocks ok at end: {e.get('block_accounting_ok')} {e.get('block_accounting')}",
             f"  instances {e.get('instances_at_end')}/{e.get('instances_configured')}, health {e.get('health_at_end')}",
             f"  rss flat within 5%: {e.get('rss_flat_within_5pct')} {[(x['process'], x['growth']) for x in e.get('rss_same_process', [])]}",
             f"  health over time (s): {r.get('health', {}).get('seconds_by_status')}"]
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"started": dt.datetime.now().strftime("%Y%m%d-%H%M%S")}
    try:
        asyncio.run(soak(args, report))
    except KeyboardInterrupt:
        report["failure"] = "interrupted"
    except Exception as e:  # noqa: BLE001 - reported in the JSON, and the run fails
        report["failure"] = f"{type(e).__name__}: {e}"
    finally:
        path = args.out / f"soak-{report['started']}.json"
        path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print_summary(report, path)
    if "failure" in report:
        log(f"run failed: {report['failure']}")
        return 2
    q = report.get("soak", {}).get("requests", {})
    return 0 if report.get("end_checks", {}).get("block_accounting_ok") and not q.get("num_lost_or_duplicated") else 1


if __name__ == "__main__":
    sys.exit(main())
