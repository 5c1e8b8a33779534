"""Why ``slo`` still misses interactive requests at issue 47's fair point (helper slo6): the
simulator's runs of ``paced_classes_predict.py``'s point (``classes_same_priority.yaml``,
capacity 5.12 req/s, 4 paced instances, 128 requests), instrumented per request. For each
missed request of a class: TTFT or TPOT; its wait split into queue and the rest; what was
admitted ahead of it on its instance while it waited (by class); its preemptions by rule
(``_preempt_for``: a queued request's deadline; ``_grow_with_preemption``: a decode's growth)
and by whom; the instance it was dispatched to, the predicted TTFT/TPOT there and the best
predicted elsewhere; and a cause (the first that applies, in the order of ``CAUSES``).

    PYTHONPATH=src .venv/bin/python benchmarks/slo/fair_misses.py --seeds 20-39 [--load 0.85] \\
        [--system slo] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

from llumnix.bench.cluster_bench import pace_latency, trace_pairs
from llumnix.bench.cluster_slo import read_classes
from llumnix.bench.sim_vs_real import simulate
from llumnix.engine.scheduler import LocalScheduler
from llumnix.policy.global_scheduler import GlobalScheduler
from llumnix.sim.metrics import MetricsCollector

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from paced_classes_predict import settings  # noqa: E402

CAUSES = ("tpot_predicted_miss", "tpot_unpredicted", "preempted_by_growth", "preempted_for_deadline",
          "queued_behind_interactive", "queued_behind_batch", "head_blocked_no_deadline_preemption",
          "head_blocked_on_memory", "ttft_other")
"""``preempted_*``: preempted before its TTFT was due; ``queued_behind_*``: when its TTFT fell due
it still waited behind queued requests of that class; ``head_blocked_*``: it was the head of its
instance's queue and memory stopped it, with batch requests running and no deadline preemption
on its instance while it waited (``_no_deadline_preemption``) or otherwise (``_on_memory``);
``ttft_other``: the rest (its prefill itself, a late first token with memory free)."""


class Trace:
    """What the hooks saw in one run."""

    def __init__(self) -> None:
        self.preempts: dict[str, list[tuple[float, str, str | None]]] = collections.defaultdict(list)
        self.admits: list[tuple[float, int, str, str]] = []  # (time, scheduler id, request id, class)
        self.dispatch: dict[str, dict[str, Any]] = {}
        self.finished: list[str] = []
        self.preempt_log: list[tuple[float, int, str]] = []  # (time, scheduler id, rule)
        self.at_due: dict[str, dict[str, Any]] = {}


T = Trace()


def _hook() -> None:
    """Wrap public entry points only (the repository's rule for study code): a preemption's
    rule is read off its caller's frame, an admission off the queue before and after a step."""
    pre = LocalScheduler.preempt
    rules = {"_preempt_for": "deadline", "_grow_with_preemption": "growth"}

    def preempt(self: LocalScheduler, req: Any) -> None:
        caller = sys._getframe(1)
        rule = rules.get(caller.f_code.co_name, "other")
        head = caller.f_locals.get("req") if rule == "deadline" else None
        T.preempts[req.request_id].append((self._now(), rule, None if head is None else head.slo_class))
        T.preempt_log.append((self._now(), id(self), rule))
        pre(self, req)

    sc = LocalScheduler.schedule

    def schedule(self: LocalScheduler) -> Any:
        now = self._now()
        obj = self.objectives
        if obj is not None:
            for i, r in enumerate(self.waiting):
                lim = obj.limits.get(r.slo_class)
                if (lim is not None and not r.output_token_ids and r.request_id not in T.at_due
                        and now >= r.arrival_time + lim[0]):
                    T.at_due[r.request_id] = {
                        "queued_ahead": dict(collections.Counter(w.slo_class for w in self.waiting[:i])),
                        "running": dict(collections.Counter(w.slo_class for w in self.running)),
                        "free_blocks": self.kv.num_free_blocks,
                        "needs_blocks": self.kv.blocks_needed(r.num_tokens, None)}
        queued = {r.request_id for r in self.waiting}
        out = sc(self)
        for r in self.running:
            if r.request_id in queued:
                T.admits.append((now, id(self), r.request_id, r.slo_class or ""))
        return out

    gd = GlobalScheduler.dispatch

    def dispatch(self: GlobalScheduler, req: Any, now: float) -> str | None:
        rows = {}
        if self.slo is not None:
            if self._stale_views or self._stale_keys:
                self._refresh_stale()
            cls = self.config.slo.resolve(req.slo_class, req.priority)
            for iid, v in self._views.items():
                load = self.slo.load(v)
                rows[iid] = (self.slo.ttft(load, req.num_prompt_tokens, req.priority, req.arrival_time + cls.ttft_s),
                             self.slo.tpot(load, req.num_prompt_tokens, now), len(load.queued), load.num_free_blocks)
        iid = gd(self, req, now)
        T.dispatch[req.request_id] = {"to": iid, "pred": rows}
        return iid

    on = MetricsCollector.on_outputs

    def on_outputs(self: MetricsCollector, outputs: Any, now: float) -> Any:
        done = on(self, outputs, now)
        T.finished += [o.request_id for o in done]
        return done

    LocalScheduler.preempt = preempt  # type: ignore[method-assign]
    LocalScheduler.schedule = schedule  # type: ignore[method-assign]
    GlobalScheduler.dispatch = dispatch  # type: ignore[method-assign]
    MetricsCollector.on_outputs = on_outputs  # type: ignore[method-assign]


def run_one(s: Any, system: str, pairs: Any, latency: Any, rate: float, seed: int,
            sims: list[Any]) -> list[dict[str, Any]]:
    """One run's missed requests, each with its evidence and cause."""
    global T
    T = Trace()
    import llumnix.sim.simulator as simmod
    real_run = simmod.Simulator.run

    def run(self: Any) -> Any:
        sims.append(self)
        return real_run(self)

    simmod.Simulator.run = run  # type: ignore[method-assign]
    try:
        simulate(s, system, pairs, s.num_requests, rate, seed, latency)
    finally:
        simmod.Simulator.run = real_run  # type: ignore[method-assign]
    sim = sims[-1]
    limits = {c: (v["ttft_s"], v["tpot_s"]) for c, v in s.slo_classes.items()}
    sched_of = {id(i.engine.scheduler): iid for iid, i in sim.cluster.instances.items()}
    out = []
    for rid, m, name in zip(T.finished, sim.metrics.requests, sim.metrics.slo_names, strict=True):
        ttft_lim, tpot_lim = limits[name]
        ttft_miss = m.ttft is None or m.ttft > ttft_lim
        tpot_miss = m.decode_per_token is not None and m.decode_per_token > tpot_lim
        if not ttft_miss and not tpot_miss:
            continue
        d = T.dispatch.get(rid, {"to": None, "pred": {}})
        to, pred = d["to"], d["pred"]
        first = m.first_scheduled_time or m.finish_time
        ahead = collections.Counter(c for t, sid, r, c in T.admits
                                    if sched_of.get(sid) == to and m.arrival_time <= t < min(first, m.arrival_time + ttft_lim)
                                    and r != rid)
        tries = [w for w, sid, rule in T.preempt_log
                 if rule == "deadline" and sched_of.get(sid) == to and m.arrival_time <= w <= m.arrival_time + ttft_lim]
        mine = pred.get(to, (None, None, None, None))
        others_meet = [i for i, p in pred.items() if i != to and p[0] <= ttft_lim and p[1] <= tpot_lim]
        pre = T.preempts.get(rid, [])
        rules = collections.Counter(f"{r}:{c}" if c else r for _, r, c in pre)
        early = [r for when, r, _ in pre if when <= m.arrival_time + ttft_lim]
        due = T.at_due.get(rid)
        if tpot_miss and not ttft_miss:
            cause = "tpot_predicted_miss" if mine[1] is not None and mine[1] > tpot_lim else "tpot_unpredicted"
        elif early:
            cause = "preempted_by_growth" if "growth" in early else "preempted_for_deadline"
        elif due is None:
            cause = "ttft_other"
        elif due["queued_ahead"].get("interactive"):
            cause = "queued_behind_interactive"
        elif due["queued_ahead"]:
            cause = "queued_behind_batch"
        elif due["free_blocks"] - due["needs_blocks"] < 2:
            cause = ("head_blocked_no_deadline_preemption" if not tries and due["running"].get("batch")
                     else "head_blocked_on_memory")
        else:
            cause = "ttft_other"
        out.append({"seed": seed, "request": rid, "class": name, "cause": cause,
                    "miss": "both" if ttft_miss and tpot_miss else "ttft" if ttft_miss else "tpot",
                    "ttft_s": None if m.ttft is None else round(m.ttft, 3),
                    "queue_s": None if m.queue_time is None else round(m.queue_time, 3),
                    "tpot_s": None if m.decode_per_token is None else round(m.decode_per_token, 4),
                    "prompt": m.num_prompt_tokens, "output": m.num_output_tokens,
                    "preemptions": dict(rules), "preempted_before_due": len(early), "migrations": m.num_migrations,
                    "admitted_ahead": dict(ahead), "dispatched_to": to, "at_due": T.at_due.get(rid),
                    "deadline_preemptions_there_while_due": len(tries),
                    "predicted_here": [None if x is None else round(x, 3) for x in mine],
                    "others_predicted_to_meet": len(others_meet)})
    return out


def parse_seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="20-39")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--capacity", type=float, default=5.12)
    ap.add_argument("--system", default="slo")
    ap.add_argument("--classes", default=str(HERE / "classes_same_priority.yaml"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    _hook()
    s = settings(read_classes(a.classes), "a10-llama7b-serving")
    pairs, latency = trace_pairs(s), pace_latency(s.pace or "")
    misses: list[dict[str, Any]] = []
    sims: list[Any] = []
    for seed in parse_seeds(a.seeds):
        misses += run_one(s, a.system, pairs, latency, a.load * a.capacity, seed, sims)
        sims.clear()
    table: dict[str, dict[str, int]] = {}
    for m in misses:
        row = table.setdefault(m["class"], dict.fromkeys(CAUSES, 0))
        row[m["cause"]] += 1
    summary = {"system": a.system, "seeds": a.seeds, "load": a.load, "capacity_req_s": a.capacity,
               "loadavg": os.getloadavg(), "causes": table,
               "misses": [m for m in misses if m["class"] == "interactive"]}
    print(json.dumps(table, indent=1))
    for m in summary["misses"]:
        print(m)
    if a.out:
        a.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
