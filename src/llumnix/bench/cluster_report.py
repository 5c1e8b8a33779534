"""``bench cluster``'s numbers: one run's record, the aggregate over seeds (median, min,
max), the issue's goals checked on it, and the plot."""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from llumnix.bench.serve_bench import RequestRecord
from llumnix.migration import reasons

REFUSED = reasons.REFUSED


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(-(-len(v) * p // 100)) - 1))]


def dist(values: list[float]) -> dict[str, float | None]:
    return {"mean": statistics.fmean(values) if values else None, "p50": pct(values, 50),
            "p99": pct(values, 99), "max": max(values, default=None)}


def _abort_reasons(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Migrations aborted during the run, by reason: ``/metrics``' counters
    (``llumnix:migration_aborts_total{reason}``) after the run less before it. A counter
    that fell (LlumSched restarted) counts what it holds now."""
    b, a = before.get("aborts_by_reason", {}), after.get("aborts_by_reason", {})
    out = {k: int(v - b.get(k, 0.0) if v >= b.get(k, 0.0) else v) for k, v in a.items()}
    return {k: n for k, n in sorted(out.items()) if n}


def kv_series(samples: list[dict[str, Any]]) -> list[tuple[float, float]]:
    out = []
    for s in samples:
        total = sum(i["num_total_blocks"] or 0 for i in s["instances"])
        if total:
            out.append((round(s["t"], 2), round(sum(i["num_used_blocks"] or 0 for i in s["instances"]) / total, 4)))
    return out


def preemptions_between(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Preemptions during a run, per instance: an instance that replaced a lost one (its
    counter started again, or it is new) counts all of its own."""
    b, a = before.get("preemptions_by_engine"), after.get("preemptions_by_engine")
    if a is None or b is None:
        return int(after["num_preemptions"] - before["num_preemptions"])
    return int(sum(v - b.get(k, 0.0) if v >= b.get(k, 0.0) else v for k, v in a.items()))


def run_record(settings: Any, raw: dict[str, Any], load: float | str, seed: int, rate: float | None) -> dict[str, Any]:
    recs: list[RequestRecord] = raw["records"]
    ok = [r for r in recs if r.error is None and r.e2e_s is not None and r.ttft_s is not None]
    b, a = raw["before"], raw["after"]
    new_down = int(a["committed_running"] - b["committed_running"])
    downtimes = a["downtimes_s"][-new_down:] if new_down > 0 else []
    good = [r for r in ok if (r.ttft_s or 0) <= settings.slo_ttft_s
            and (r.tpot_s is None or r.tpot_s <= settings.slo_tpot_s)]
    kv = kv_series(raw["samples"])
    dur = raw["duration_s"]
    out = {"load": load, "seed": seed, "rate_req_s": rate, "num_requests": len(recs), "num_ok": len(ok),
           "errors": sorted({r.error for r in recs if r.error})[:3], "duration_s": dur,
           "num_preemptions": preemptions_between(b, a),
           "migrations_committed": int(a["migrations_committed"] - b["migrations_committed"]),
           "migrations_aborted": int(a["migrations_aborted"] - b["migrations_aborted"]),
           "abort_reasons": _abort_reasons(b, a), "downtime_s": dist(downtimes),
           "ttft_s": dist([r.ttft_s for r in ok if r.ttft_s is not None]),
           "tpot_s": dist([t for r in ok if (t := r.tpot_s) is not None]),
           "itl_s": dist([g for r in ok for g in r.itl_s]),
           "e2e_s": dist([r.e2e_s for r in ok if r.e2e_s is not None]),
           "goodput_req_s": len(good) / dur if dur > 0 else 0.0, "goodput_fraction": len(good) / max(1, len(recs)),
           "kv_usage": {"mean": statistics.fmean(u for _, u in kv) if kv else None,
                        "max": max((u for _, u in kv), default=None), "series": kv}}
    lags = [r.send_lag_s for r in recs if r.send_lag_s is not None]
    out["send_lag_s"] = dist(lags)
    n_gw = a.get("gateway_ttft_count", 0.0) - b.get("gateway_ttft_count", 0.0)
    out["gateway_ttft_mean_s"] = (a["gateway_ttft_sum_s"] - b["gateway_ttft_sum_s"]) / n_gw if n_gw > 0 else None
    if "trace" in raw:
        out["preemption_trace"] = raw["trace"]
    if getattr(settings, "slo_classes", None):
        from llumnix.bench.cluster_slo import run_classes

        out["by_slo_class"] = run_classes(settings.slo_classes, raw["slo_classes"], recs, dur, b, a)
        if "log_lines" in raw:
            from llumnix.bench.shed_goal import real_run

            out["shed_goal"] = real_run(settings.slo_classes, raw["slo_classes"], recs, raw["log_lines"])
    paced = int(a.get("paced_steps", 0) - b.get("paced_steps", 0))
    if paced:  # the emulation held where few steps overran the model (engine/pace.py)
        out["paced_steps"] = paced
        out["pace_overrun_steps"] = int(a.get("pace_overrun_steps", 0) - b.get("pace_overrun_steps", 0))
    t = out["ttft_s"]
    i = out["itl_s"]
    out["line"] = (f"TTFT mean {_ms(t['mean'])} P99 {_ms(t['p99'])}, ITL P99 {_ms(i['p99'])} max {_ms(i['max'])}, "
                   f"preempt {out['num_preemptions']}, migr {out['migrations_committed']}/"
                   f"{out['migrations_aborted']} aborted, {len(ok)}/{len(recs)} ok")
    if paced:
        out["line"] += f", pace overran {out['pace_overrun_steps']}/{paced} steps"
    if lags:  # the trace held where the client sent on time (a loaded machine's event loop falls behind)
        out["line"] += f", sent late P99 {_ms(out['send_lag_s']['p99'])}"
    if out["gateway_ttft_mean_s"] is not None:
        out["line"] += f", gateway TTFT mean {_ms(out['gateway_ttft_mean_s'])}"
    if "by_slo_class" in out:
        from llumnix.bench.cluster_slo import line

        out["line"] += "; " + line(out["by_slo_class"])
    if "trace" in raw:
        t_ = raw["trace"]["summary"]
        out["line"] += (f"; trace: {t_['num_preemptions']} preempt, victim migrated {t_['victim_migrated']}, "
                        f"<= 5 s after an install {t_['after_recent_install']}, installs {t_['installs']}")
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"


_AGG = {"ttft_mean": ("ttft_s", "mean"), "ttft_p99": ("ttft_s", "p99"), "tpot_mean": ("tpot_s", "mean"),
        "itl_p50": ("itl_s", "p50"), "itl_p99": ("itl_s", "p99"), "itl_max": ("itl_s", "max"),
        "e2e_mean": ("e2e_s", "mean"), "e2e_p99": ("e2e_s", "p99"), "goodput_req_s": ("goodput_req_s", None),
        "kv_usage_mean": ("kv_usage", "mean"), "downtime_p99": ("downtime_s", "p99")}


def _get(run: dict[str, Any], key: str, sub: str | None) -> float | None:
    v = run[key] if sub is None else run[key][sub]
    return None if v is None else float(v)


def aggregate(systems: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per system and load: median, min and max over seeds of each metric; counts summed."""
    out: dict[str, dict[str, Any]] = {}
    for sys_rec in systems:
        by_load: dict[str, list[dict[str, Any]]] = {}
        for run in sys_rec["runs"]:
            by_load.setdefault(str(run["load"]), []).append(run)
        out[sys_rec["system"]] = {}
        for load, runs in by_load.items():
            agg: dict[str, Any] = {"num_seeds": len(runs)}
            for name, (key, sub) in _AGG.items():
                vals = [v for r in runs if (v := _get(r, key, sub)) is not None]
                agg[name] = ({"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
                             if vals else None)
            by_reason: Counter[str] = Counter()
            for r in runs:
                by_reason.update(r["abort_reasons"])
            for k in ("num_preemptions", "migrations_committed", "migrations_aborted", "num_ok", "num_requests"):
                agg[k] = sum(r[k] for r in runs)
            agg["abort_reasons"] = dict(by_reason)
            out[sys_rec["system"]][load] = agg
    return out


def refusals(abort_reasons: dict[str, int]) -> int:
    """Aborts refused at reservation, from a run's reasons: codes, or (runs recorded before
    the codes) the reports' texts."""
    return sum(n for k, n in abort_reasons.items()
               if k == REFUSED or reasons.of_report({"abort_reason": k}) == REFUSED)


def _med(agg: dict[str, Any], system: str, load: str, key: str) -> float | None:
    v = agg.get(system, {}).get(load, {}).get(key)
    return None if v is None else float(v["median"])


def goals(agg: dict[str, dict[str, Any]], loads: tuple[float, ...]) -> dict[str, Any]:
    """The issue's goals for ``llumnix`` (and, where present, ``llumnix-default``) against
    INFaaS++ and round-robin, on the medians over seeds (preemptions: summed)."""
    out: dict[str, Any] = {}
    for sysname in ("llumnix", "llumnix-default"):
        if sysname not in agg or "infaas++" not in agg:
            continue
        g: dict[str, Any] = {}
        for load in loads:
            lk = str(load)
            p_l, p_i = agg[sysname][lk]["num_preemptions"], agg["infaas++"][lk]["num_preemptions"]
            t_l, t_i = _med(agg, sysname, lk, "ttft_p99"), _med(agg, "infaas++", lk, "ttft_p99")
            i_l, i_i = _med(agg, sysname, lk, "itl_p99"), _med(agg, "infaas++", lk, "itl_p99")
            ratio = None if not i_l or not i_i else i_l / i_i
            if load < 1.0:
                met: bool | None = bool(p_l <= p_i and t_l is not None and t_i is not None and t_l <= t_i
                                        and ratio is not None and ratio <= 1.2)
            else:
                met = bool(p_l <= 0.7 * p_i) if p_i else None
            g[lk] = {"preemptions": [p_l, p_i], "ttft_p99_s": [t_l, t_i], "itl_p99_s": [i_l, i_i],
                     "itl_p99_ratio": ratio, "met": met}
        refused = sum(refusals(a["abort_reasons"]) for a in agg[sysname].values())
        num_started = sum(a["migrations_committed"] + a["migrations_aborted"] for a in agg[sysname].values())
        g["reservation_refusals"] = {"refused": refused, "started": num_started,
                                     "met": refused < 0.05 * num_started if num_started else None}
        out[sysname] = g
    burst: dict[str, Any] = {}
    for sysname in ("infaas++", "llumnix", "llumnix-default"):
        if sysname in agg and "round-robin" in agg:
            m = {k: [_med(agg, sysname, "burst", k), _med(agg, "round-robin", "burst", k)]
                 for k in ("ttft_mean", "ttft_p99")}
            burst[sysname] = {**m, "met": all(a is not None and b is not None and a <= b for a, b in m.values())}
    out["burst_vs_round_robin"] = burst
    return out


def print_table(agg: dict[str, dict[str, Any]]) -> None:
    cols = ("ttft_mean", "ttft_p99", "itl_p99", "itl_max", "tpot_mean", "e2e_mean", "goodput_req_s",
            "kv_usage_mean")
    print(f"{'system':>16} {'load':>5} " + " ".join(f"{c:>13}" for c in cols) + "  preempt migr(ok/ab)")
    for system, loads in agg.items():
        for load, a in loads.items():
            vals = " ".join(f"{a[c]['median']:13.3f}" if a[c] else f"{'-':>13}" for c in cols)
            print(f"{system:>16} {load:>5} {vals}  {a['num_preemptions']:7d} "
                  f"{a['migrations_committed']}/{a['migrations_aborted']}")


def plot(data: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = data["aggregate"]
    systems = list(agg)
    loads = [str(x) for x in data["settings"]["loads"]] + ["burst"]
    panels = [("TTFT P99 (s)", "ttft_p99"), ("TTFT mean (s)", "ttft_mean"), ("inter-token P99 (s)", "itl_p99"),
              ("goodput (req/s)", "goodput_req_s")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    width = 0.8 / max(1, len(systems))
    for ax, (title, key) in zip(axes.flat, panels, strict=False):
        for k, sysname in enumerate(systems):
            meds, lo, hi = [], [], []
            for ld in loads:
                a = agg[sysname].get(ld, {}).get(key)
                meds.append(a["median"] if a else 0.0)
                lo.append(a["median"] - a["min"] if a else 0.0)
                hi.append(a["max"] - a["median"] if a else 0.0)
            xs = [i + k * width for i in range(len(loads))]
            ax.bar(xs, meds, width, yerr=[lo, hi], label=sysname, capsize=2)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(loads))], [f"{ld}x" if ld != "burst" else ld
                                                                          for ld in loads])
        ax.set_title(f"{title}, median of seeds (min-max)", fontsize=9)
    ax = axes.flat[4]
    for k, sysname in enumerate(systems):
        vals = [agg[sysname].get(ld, {}).get("num_preemptions", 0) for ld in loads]
        ax.bar([i + k * width for i in range(len(loads))], vals, width, label=sysname)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(loads))], loads)
    ax.set_title("preemptions (sum over seeds)", fontsize=9)
    ax = axes.flat[5]
    top = loads[-2]
    for sys_rec in data["systems"]:
        run = next((r for r in sys_rec["runs"] if str(r["load"]) == top), None)
        if run and run["kv_usage"]["series"]:
            t, u = zip(*run["kv_usage"]["series"], strict=True)
            ax.plot(t, u, label=sys_rec["system"])
    ax.set_title(f"KV in use over time (load {top}x, first seed)", fontsize=9)
    ax.set_xlabel("s")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("llumnix bench cluster", fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
