"""Why the ``slo`` policy's TTFT predictions miss in goal.yaml's simulator runs: per request,
the prediction made at dispatch split into its parts (half a decode step, the wait for
memory or a batch place, the prefills of the queue ahead, its own prefill) against what its
instance did between the dispatch and its first admission (the decode steps there are the
memory wait, the prefill steps the queue ahead's prefills), and who was admitted before it
(the requests predicted ahead; those queued but predicted behind; those running at dispatch,
back after a preemption; and those that arrived later and jumped ahead).

    cd WORKTREE && PYTHONPATH=src nice -n 19 .venv/bin/python benchmarks/slo/ttft_causes.py \\
        --seed 0 --rate 36 [--out causes.json]

Instrumentation only: it wraps the predictor's and the engine scheduler's methods in this
process (nothing in ``src`` changes); the run is the same as ``sim_ttft``'s.
"""
from __future__ import annotations

import argparse
import bisect
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from llumnix.engine.scheduler import LocalScheduler
from llumnix.policy.freeness import blocks_for
from llumnix.policy.slo_predict import SLOPredictor
from llumnix.sim.config import load_config
from llumnix.sim.metrics import MetricsCollector
from llumnix.sim.runner import make_simulator, plan

HERE = Path(__file__).resolve().parent


class Tap:
    """What the wrapped methods saw."""

    def __init__(self) -> None:
        self.status_of: dict[int, Any] = {}
        self.last: dict[str, Any] = {}
        self.pred: dict[str, dict[str, Any]] = {}
        self.steps: dict[int, list[tuple[float, bool]]] = defaultdict(list)
        self.preempted: dict[int, list[tuple[float, int]]] = defaultdict(list)
        """Per scheduler: (time, requests the step preempted) of each step that preempted."""
        self.admits: dict[int, list[tuple[float, str]]] = defaultdict(list)
        self.first_admit: dict[str, tuple[int, float]] = {}
        self.finished: dict[str, Any] = {}
        """Per request id, its metrics (matched by id: a tenth of goal.yaml's Gamma CV 4
        arrivals share their arrival time with another request)."""


def install(tap: Tap) -> None:
    load0, ttft0, record0 = SLOPredictor.load, SLOPredictor.ttft, SLOPredictor.record_ttft
    schedule0 = LocalScheduler.schedule
    outputs0 = MetricsCollector.on_outputs

    def on_outputs(self: MetricsCollector, outputs: Any, now: float) -> Any:
        done = outputs0(self, outputs, now)
        for out in done:
            tap.finished[out.request_id] = out.metrics
        return done

    def load(self: SLOPredictor, s: Any) -> Any:
        out = load0(self, s)
        tap.status_of[id(out)] = s
        return out

    def ttft(self: SLOPredictor, load: Any, n: int, priority: int, due: float | None = None, *,
             objective_s: float | None = None) -> float:
        t = ttft0(self, load, n, priority, due, objective_s=objective_s)
        if objective_s is not None:
            tap.last = parts(self, load, tap.status_of.get(id(load)), n, priority, due, objective_s, t)
        return t

    def record(self: SLOPredictor, request_id: str, arrival: float, predicted: float) -> None:
        record0(self, request_id, arrival, predicted)
        tap.pred[request_id] = {**tap.last, "arrival": arrival, "pred": predicted,
                                "t0": arrival + predicted - tap.last["ttft"]}

    def schedule(self: LocalScheduler) -> Any:
        out = schedule0(self)
        now = self._now()
        tap.steps[id(self)].append((now, bool(out.is_prefill)))
        if out.preempted_request_ids:
            tap.preempted[id(self)].append((now, len(out.preempted_request_ids)))
        if out.is_prefill:  # without chunked prefill (goal.yaml) a prefill step's entries are its admissions
            for e in out.scheduled:
                tap.admits[id(self)].append((now, e.request_id))
                tap.first_admit.setdefault(e.request_id, (id(self), now))
        return out

    SLOPredictor.load, SLOPredictor.ttft, SLOPredictor.record_ttft = load, ttft, record  # type: ignore[method-assign]
    LocalScheduler.schedule = schedule  # type: ignore[method-assign]
    MetricsCollector.on_outputs = on_outputs  # type: ignore[method-assign]


def parts(pred: SLOPredictor, load: Any, status: Any, n: int, priority: int, due: float | None,
          objective_s: float, ttft: float) -> dict[str, Any]:
    """The prediction's parts, by the rule ``SLOPredictor.ttft`` applies."""
    steps = load.steps
    step = steps.decode_s(load.num_running, load.num_context_tokens) if load.num_running else 0.0
    queued_ids = [w.request_id for w in status.waiting] if status is not None else []
    # instance_load drops the overdue from ``queued``: line the ids up the same way
    ids = [w.request_id for w in status.waiting if not _overdue(pred, status, w)] if status is not None else []
    ahead_ids = []
    ahead = []
    for k, (p, tokens) in enumerate(load.queued):
        d = load.queued_due[k] if due is not None and load.queued_due else None
        if p > priority or (p == priority and (d is None or d <= due)):
            ahead.append(tokens)
            if k < len(ids):
                ahead_ids.append(ids[k])
    if steps.mixes and load.num_running:
        prefill_ahead = steps.mixed_s((*ahead, n), load.num_running, load.num_context_tokens) - steps.prefill_s((n,))
    else:
        prefill_ahead = sum(steps.prefill_s((k,)) for k in ahead)
    need = sum(blocks_for(k + 1, load.block_size) for k in (*ahead, n))
    deficit = need - load.num_free_blocks
    slots = load.num_running + len(ahead) + 1 - load.max_num_seqs if load.max_num_seqs else 0
    raw = pred.memory_wait(load, deficit, step, slots)
    freed = sum(b for _, b in load.release)
    fallback = (deficit > 0 or slots > 0) and (freed < deficit or len(load.release) < slots)
    first_release = load.release[0][0] if load.release else None
    return {"ttft": ttft, "step_half": step / 2, "wait_raw": raw, "fallback": fallback,
            "wait": ttft - step / 2 - prefill_ahead - steps.prefill_s((n,)), "prefill_ahead": prefill_ahead,
            "prefill_own": steps.prefill_s((n,)), "num_ahead": len(ahead), "num_queued": len(queued_ids),
            "ahead_ids": ahead_ids, "queued_ids": queued_ids, "deficit": deficit, "slots": slots,
            "num_running": load.num_running, "running_ids": [r.request_id for r in status.running] if status else [],
            "step_s": step, "first_release_tokens": first_release, "priority": priority, "n": n,
            "release": list(load.release),
            "wait_order_stats": order_stats_wait(pred, status, deficit, slots, step) if status else None}


GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)


def order_stats_wait(pred: SLOPredictor, status: Any, deficit: int, slots: int, step: float) -> float:
    """Estimator A: the first grid time (tokens) by which the running requests' expected
    freed blocks (each weighted by its chance to have ended: the empirical output lengths
    beyond what it made) reach ``deficit`` and their expected ends ``slots``."""
    if deficit <= 0 and slots <= 0:
        return 0.0
    seen = sorted(pred.lengths._seen)
    for t in GRID:
        freed = ends = 0.0
        for r in status.running:
            m = r.num_output_tokens
            i = bisect.bisect_right(seen, m)
            n = len(seen) - i
            if n >= 50:
                q = (bisect.bisect_right(seen, m + t) - i) / n
            else:
                q = 1 - 2.718281828 ** (-t / pred.lengths.remaining(m))
            freed += q * r.num_blocks
            ends += q
        if freed >= deficit and ends >= slots:
            return t * step
    return 2 * GRID[-1] * step


def _overdue(pred: SLOPredictor, status: Any, w: Any) -> bool:
    from llumnix.policy.slo_predict import is_overdue
    return is_overdue(w, status.timestamp, pred.overdue_limits, pred.slo)


def analyse(tap: Tap, sim: Any) -> list[dict[str, Any]]:
    """One row per dispatched request that got its first token: prediction parts and what happened."""
    rows = []
    for rid, p in tap.pred.items():
        m = tap.finished.get(rid)
        fa = tap.first_admit.get(rid)
        if m is None or not m.ttft or fa is None:
            continue
        sched, t1 = fa
        t0 = p["t0"]
        steps = tap.steps[sched]
        times = [t for t, _ in steps]
        i = bisect.bisect_left(times, t0)
        j = bisect.bisect_left(times, t1)
        decode_s = prefill_s = 0.0
        residual = (times[i] - t0) if i < len(times) else 0.0
        for k in range(i, j):
            dt = times[k + 1] - times[k] if k + 1 < len(times) else 0.0
            if steps[k][1]:
                prefill_s += dt
            else:
                decode_s += dt
        adm = tap.admits[sched]
        before = [a for t, a in adm[bisect.bisect_left(adm, (t0, "")):bisect.bisect_left(adm, (t1, ""))] if a != rid]
        ahead, queued, running = set(p["ahead_ids"]), set(p["queued_ids"]), set(p["running_ids"])
        same = [a for t, a in adm[bisect.bisect_left(adm, (t1, "")):bisect.bisect_right(adm, (t1, "~"))] if a != rid]
        pre = tap.preempted[sched]
        n_pre = sum(k for t, k in pre[bisect.bisect_left(pre, (t0, 0)):bisect.bisect_right(pre, (t1, 1 << 30))])
        rows.append({
            "id": rid, "priority": p["priority"], "pred": p["pred"], "actual": m.ttft, "queue": t1 - t0,
            "rest": m.ttft - (t1 - p["arrival"]), "residual": residual, "decode_wait": decode_s,
            "prefill_wait": prefill_s, **{k: p[k] for k in ("step_half", "wait", "wait_raw", "fallback",
                                                            "prefill_ahead", "prefill_own", "num_ahead",
                                                            "num_queued", "deficit", "slots", "num_running",
                                                            "step_s", "first_release_tokens",
                                                            "wait_order_stats")},
            "adm_ahead": sum(a in ahead for a in before), "adm_queued_behind": sum(a in queued - ahead for a in before),
            "adm_rerun": sum(a in running for a in before),
            "adm_later": sum(a not in queued and a not in running for a in before),
            "ahead_after": len(ahead - set(before)),
            # admitted in r's own prefill step: queued at dispatch (ahead or behind), or arrived later
            "same_ahead": sum(a in ahead for a in same), "same_queued_behind": sum(a in queued - ahead for a in same),
            "same_later": sum(a not in queued and a not in running for a in same),
            "same_rerun": sum(a in running for a in same),
            "preemptions_while_queued": n_pre, "tpot": m.decode_per_token, "preempted": m.num_preemptions > 0, "migrated": m.num_migrations > 0})
    return rows


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def errors(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """(predicted, actual) pairs: relative error |e| P50 and P90, signed median, as ``ttft_errors``."""
    e = sorted((p / a - 1) for p, a in pairs)
    if not e:
        return {"n": 0}
    a = sorted(abs(x) for x in e)
    return {"n": len(e), "p50": round(a[len(a) // 2], 3), "p90": round(a[int(0.9 * (len(a) - 1))], 3),
            "signed_p50": round(e[len(e) // 2], 3)}


def overall(tap: Tap, sim: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The TTFT error matched by request id, per class, and as ``sim/runner.py`` matched it before
    (by arrival time: requests sharing one are compared with another's TTFT)."""
    by_arrival = {r.arrival_time: r.ttft for r in sim.metrics.requests if r.ttft}
    old = [(p["pred"], by_arrival[p["arrival"]]) for p in tap.pred.values() if p["arrival"] in by_arrival]
    return {"by_id": errors([(r["pred"], r["actual"]) for r in rows]),
            "by_id_interactive": errors([(r["pred"], r["actual"]) for r in rows if r["priority"] > 0]),
            "by_id_batch": errors([(r["pred"], r["actual"]) for r in rows if r["priority"] == 0]),
            "by_arrival": errors(old)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bins = ((0, .1), (.1, .3), (.3, 1), (1, 10), (10, 1e9))
    for cls, sel in (("interactive", lambda r: r["priority"] > 0), ("batch", lambda r: r["priority"] == 0)):
        rs = [r for r in rows if sel(r)]
        for lo, hi in bins:
            b = [r for r in rs if lo <= r["actual"] < hi]
            if not b:
                continue
            waited = [r for r in b if r["deficit"] > 0 or r["slots"] > 0]
            out[f"{cls} actual [{lo:g},{hi:g})"] = {
                "n": len(b), "signed_p50": med([r["pred"] / r["actual"] - 1 for r in b]),
                "pred_p50": med([r["pred"] for r in b]), "actual_p50": med([r["actual"] for r in b]),
                # predicted parts against the measured ones (medians, seconds)
                "pred_wait": med([r["wait"] for r in b]), "act_decode_wait": med([r["decode_wait"] for r in b]),
                "pred_prefill_ahead": med([r["prefill_ahead"] for r in b]),
                "act_prefill_wait": med([r["prefill_wait"] for r in b]),
                "pred_own": med([r["prefill_own"] for r in b]), "act_rest": med([r["rest"] for r in b]),
                "n_memory_bound": len(waited), "n_fallback": sum(r["fallback"] for r in b),
                "pred_wait_memory_bound": med([r["wait"] for r in waited]),
                "wait_raw_memory_bound": med([r["wait_raw"] for r in waited]),
                "order_stats_memory_bound": med([r["wait_order_stats"] for r in waited]),
                "act_decode_wait_memory_bound": med([r["decode_wait"] for r in waited]),
                "num_ahead": med([r["num_ahead"] for r in b]), "adm_ahead": med([r["adm_ahead"] for r in b]),
                "adm_later_mean": round(sum(r["adm_later"] for r in b) / len(b), 2),
                "adm_queued_behind_mean": round(sum(r["adm_queued_behind"] for r in b) / len(b), 2),
                "adm_rerun_mean": round(sum(r["adm_rerun"] for r in b) / len(b), 2),
                "ahead_after_mean": round(sum(r["ahead_after"] for r in b) / len(b), 2),
                **{f"{k}_mean": round(sum(r[k] for r in b) / len(b), 2)
                   for k in ("same_ahead", "same_queued_behind", "same_later", "same_rerun")},
                "preemptions_while_queued_mean": round(sum(r["preemptions_while_queued"] for r in b) / len(b), 2),
                "preemptions_while_queued_memory_bound": med([r["preemptions_while_queued"] for r in waited]),
                "preempted": sum(r["preempted"] for r in b), "migrated": sum(r["migrated"] for r in b)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=36.0)
    ap.add_argument("--system", default="slo")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--rows", help="write every row (JSON lines) here")
    ap.add_argument("--out", help="write the summary JSON here too")
    args = ap.parse_args()
    cfg = load_config(HERE / "goal.yaml", args.overrides)
    runs = {(r.system.name, r.rate, r.seed): r for r in plan(cfg, args.seed + 1)}
    spec = runs.get((args.system, args.rate, args.seed))
    if spec is None:
        ap.error(f"goal.yaml has no run {args.system} at {args.rate:g} req/s")
    tap = Tap()
    install(tap)
    sim = make_simulator(spec)
    sim.run()
    rows = analyse(tap, sim)
    if args.rows:
        Path(args.rows).write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = json.dumps({"seed": args.seed, "rate": args.rate, "system": args.system, "overrides": args.overrides,
                       "num": len(rows), "errors": overall(tap, sim, rows),
                       "bins": summarize(rows)}, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
