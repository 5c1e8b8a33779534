"""`llumnix bench migration`: downtime of live migration against recompute and a
blocking copy, by sequence length, between two instance processes (Ray actors)
on this machine, with other requests decoding on both sides."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from llumnix.bench.machine import machine_info
from llumnix.core.sampling_params import SamplingParams
from llumnix.gateway.backend import GenerateRequest

LENGTHS = (256, 512, 1024, 2048, 4096)
CO_RUNNING = 4


def _prompt(n: int, salt: int) -> list[int]:
    return [100 + (i * 7919 + salt * 104729) % 40000 for i in range(n)]


def _req(rid: str, n: int, max_tokens: int, salt: int) -> GenerateRequest:
    return GenerateRequest(rid, _prompt(n, salt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                           0, time.monotonic())


def _wait_decoding(ray: Any, actor: Any, rid: str, min_tokens: int = 2, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while ray.get(actor.num_output_tokens.remote(rid)) < min_tokens:
        if time.time() > deadline:
            raise TimeoutError(f"{rid} did not start decoding")
        time.sleep(0.05)


def _mean_step(log: list[tuple[float, float, int]], lo: float, hi: float) -> float | None:
    steps = [e - s for s, e, n in log if s >= lo and e <= hi and n > 0]
    return statistics.mean(steps) if steps else None


def _steps_overlapping(log: list[tuple[float, float, int]], lo: float, hi: float) -> float | None:
    steps = [e - s for s, e, n in log if e >= lo and s <= hi and n > 0]
    return statistics.mean(steps) if steps else None


def run_length(ray: Any, src: Any, dst: Any, length: int, mode: str, salt: int) -> dict[str, Any]:
    bg = [f"bg-{mode}-{length}-{side}-{i}" for side in ("s", "d") for i in range(CO_RUNNING)]
    for i, rid in enumerate(bg):
        actor = src if "-s-" in rid else dst
        ray.get(actor.add_request.remote(_req(rid, 64, 6000, salt * 10 + i)))
    target = f"t-{mode}-{length}"
    ray.get(src.add_request.remote(_req(target, length - 16, 2000, salt)))
    _wait_decoding(ray, src, target)
    for rid in bg:
        _wait_decoding(ray, src if "-s-" in rid else dst, rid)
    time.sleep(1.0)  # a baseline window of ordinary decode steps on both sides
    before = time.monotonic()
    overrides = {"max_stages": 1} if mode == "blocking" else {}
    rep = ray.get(src.migrate_request.remote(target, "dst", dst, overrides))
    after = time.monotonic()
    time.sleep(0.5)
    src_log, dst_log = ray.get(src.step_log.remote()), ray.get(dst.step_log.remote())
    for rid in bg + [target]:
        for actor in (src, dst):
            ray.get(actor.abort.remote(rid))
    base_src = _mean_step(src_log, before - 1.0, before)
    base_dst = _mean_step(dst_log, before - 1.0, before)
    during_src = _steps_overlapping(src_log, rep["start_time"], rep["end_time"])
    during_dst = _steps_overlapping(dst_log, rep["start_time"], rep["end_time"])
    return {"length": length, "mode": mode, "committed": rep["committed"], "abort_reason": rep["abort_reason"],
            "downtime_s": rep["downtime"], "stages": rep["num_stages"], "blocks": rep["num_blocks"],
            "bytes": rep["num_bytes"], "duration_s": rep["duration"], "wall_s": after - before,
            "src_step_s": {"before": base_src, "during": during_src},
            "dst_step_s": {"before": base_dst, "during": during_dst}}


def recompute_time(ray: Any, dst: Any, length: int, salt: int) -> float:
    """Downtime of recompute: re-prefilling the whole sequence on the destination."""
    rid = f"recompute-{length}"
    ray.get(dst.add_request.remote(_req(rid, length, 1, salt)))
    deadline = time.time() + 300
    while ray.get(dst.num_output_tokens.remote(rid)) != -1 and time.time() < deadline:
        time.sleep(0.02)
    log = ray.get(dst.step_log.remote())
    return max(e - s for s, e, _ in log[-3:])


def main_migration_bench(args: argparse.Namespace) -> int:
    import ray

    from llumnix.cluster.actors import LLUMSCHED_NAME, InstanceActor, LlumSchedActor

    lengths = (256, 1024) if args.quick else LENGTHS
    ray.init(num_cpus=2, include_dashboard=False, namespace="llumnix-bench", log_to_driver=False)
    token = b"bench-token"
    sched = LlumSchedActor.options(name=LLUMSCHED_NAME, num_cpus=0).remote(
        {"rescheduling": {"enabled": False}}, None, reschedule_interval_s=3600)
    ray.get(sched.cluster_info.remote())  # instances push status to it; the handle keeps it alive
    engine = {"kv_cache_bytes": 512 * 2**20, "max_num_seqs": 16, "max_num_batched_tokens": 8192,
              "device": args.device, "dtype": args.dtype}
    src = InstanceActor.options(num_cpus=0).remote("src", args.model, engine, None, LLUMSCHED_NAME,
                                                   args.threads or 1, token)
    dst = InstanceActor.options(num_cpus=0).remote("dst", args.model, engine, None, LLUMSCHED_NAME,
                                                   args.threads or 1, token)
    ray.get([src.ready.remote(), dst.ready.remote()])
    rows, recompute = [], {}
    for k, n in enumerate(lengths):
        for mode in ("live", "blocking"):
            rows.append(run_length(ray, src, dst, n, mode, salt=k))
            print(json.dumps(rows[-1]), flush=True)
        recompute[n] = recompute_time(ray, dst, n, salt=k)
    ray.shutdown()
    result = summarize(rows, recompute, lengths)
    result.update({"benchmark": "migration", "model": args.model, "transport": "tcp",
                   "machine": machine_info(), "settings": {
                       "co_running_per_instance": CO_RUNNING, "torch_threads_per_instance": args.threads or 1,
                       "engine": engine, "processes": "two Ray actors (separate processes) on this machine"}})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "migration.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(result, out / "migration.png")
    _print(result)
    return 0


def summarize(rows: list[dict[str, Any]], recompute: dict[int, float], lengths: tuple[int, ...]) -> dict[str, Any]:
    by = {(r["length"], r["mode"]): r for r in rows}
    table = []
    for n in lengths:
        live, blk = by[(n, "live")], by[(n, "blocking")]
        src = live["src_step_s"]
        dst = live["dst_step_s"]
        table.append({
            "length": n, "live_downtime_s": live["downtime_s"], "live_stages": live["stages"],
            "blocking_downtime_s": blk["downtime_s"], "recompute_s": recompute[n],
            "src_decode_step_s": src["before"], "src_step_during_migration_s": src["during"],
            "dst_decode_step_s": dst["before"], "dst_step_during_migration_s": dst["during"],
            "committed": live["committed"] and blk["committed"],
        })
    first, last = table[0], table[-1]

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if not a or not b else a / b

    slow = [ratio(t[k + "_step_during_migration_s"], t[k + "_decode_step_s"])
            for t in table for k in ("src", "dst")]
    slow = [s for s in slow if s is not None]
    return {"table": table, "rows": rows, "floors": {
        "downtime_ratio_longest_over_shortest": ratio(last["live_downtime_s"], first["live_downtime_s"]),
        "downtime_below_one_source_decode_step": all(
            t["live_downtime_s"] is not None and t["src_decode_step_s"] is not None
            and t["live_downtime_s"] < t["src_decode_step_s"] for t in table),
        "recompute_over_live_at_longest": ratio(last["recompute_s"], last["live_downtime_s"]),
        "max_co_running_slowdown": (max(slow) - 1.0) if slow else None,
    }}


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = r["table"]
    xs = [row["length"] for row in t]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("live_downtime_s", "live migration"), ("blocking_downtime_s", "blocking copy"),
                       ("recompute_s", "recompute")):
        ax.plot(xs, [1000 * (row[key] or 0) for row in t], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("downtime (ms)")
    ax.set_title(f"migration downtime, {r['model']}, tcp")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="live migration vs recompute vs blocking copy (ms)")
    for c in ("length", "live", "stages", "blocking", "recompute", "src step", "src step during",
              "dst step", "dst step during"):
        t.add_column(c, justify="right")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1000 * v:.1f}"

    for row in r["table"]:
        t.add_row(str(row["length"]), ms(row["live_downtime_s"]), str(row["live_stages"]),
                  ms(row["blocking_downtime_s"]), ms(row["recompute_s"]), ms(row["src_decode_step_s"]),
                  ms(row["src_step_during_migration_s"]), ms(row["dst_decode_step_s"]),
                  ms(row["dst_step_during_migration_s"]))
    Console().print(t)
    Console().print(r["floors"])
