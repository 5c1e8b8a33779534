"""The paper's tables from `llumnix simulate` records: Figure 11's comparison and goals,
the ordering over seeds, priorities (Figure 13) and auto-scaling (Figures 14-15, the
threshold sweep). Study code, not part of the package.

    python -m benchmarks.sim.paper_tables goals benchmarks/sim/results/figure11/metrics.json
    python -m benchmarks.sim.paper_tables scaling benchmarks/sim/results/figure14/metrics.json

prints the table (markdown) of one ``metrics.json``; the kinds are the keys of ``TABLES``.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from llumnix.sim.report import format_number, mean_over_seeds


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else float("nan"))


def _ordering(rows: dict[tuple[str, float, str], dict[str, Any]], ours: str, base: str, worst: str,
              ) -> list[tuple[str, float, str, str, tuple[float, float, float], float | None]]:
    """Per (trace, rate) where all three systems ran, and per ordered metric (P99 prefill,
    mean preemption loss): (trace, rate, metric, stat, the three values, by how much the
    chain ours <= base <= worst is out of order, or None where it holds)."""
    out = []
    for (t, rate, s), m in sorted(rows.items()):
        b, w = rows.get((t, rate, base)), rows.get((t, rate, worst))
        if s != ours or b is None or w is None:
            continue
        for metric, stat in (("prefill", "p99"), ("preemption_loss", "mean")):
            chain = (m[metric][stat], b[metric][stat], w[metric][stat])
            holds = chain[0] <= chain[1] * 1.0001 + 1e-9 and chain[1] <= chain[2] * 1.0001 + 1e-9
            gap = None if holds else max(_ratio(chain[0], chain[1]), _ratio(chain[1], chain[2])) - 1
            out.append((t, rate, metric, stat, chain, gap))
    return out


def comparison_markdown(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "infaas++",
                        worst: str = "round-robin") -> str:
    """Side by side on each trace's top rate, and the ordering ours <= base <= worst at every rate."""
    rows = mean_over_seeds(records)
    traces = list(dict.fromkeys(r["trace"] for r in records))
    lines = [f"| trace | top rate | P99 prefill {base}/{ours} | mean prefill {base}/{ours} | "
             f"P99 decode {base}/{ours} | P99 e2e {base}/{ours} | preemption loss {ours} vs {base} | "
             f"P99 prefill {worst}/{ours} |", "|" + "---|" * 8]
    for t in traces:
        rates = sorted({k[1] for k in rows if k[0] == t})
        top = rates[-1]
        o, b, w = (rows.get((t, top, s)) for s in (ours, base, worst))
        if o is None or b is None:
            continue
        loss_o, loss_b = o["preemption_loss"]["mean"], b["preemption_loss"]["mean"]
        cut = f"{100 * (1 - loss_o / loss_b):.0f}% lower" if loss_b > 0 else "both 0"
        vs_worst = "-" if w is None else f"{_ratio(w['prefill']['p99'], o['prefill']['p99']):.1f}x"
        lines.append(
            f"| {t} | {top:g} | {_ratio(b['prefill']['p99'], o['prefill']['p99']):.1f}x | "
            f"{_ratio(b['prefill']['mean'], o['prefill']['mean']):.1f}x | "
            f"{_ratio(b['decode']['p99'], o['decode']['p99']):.2f}x | {_ratio(b['e2e']['p99'], o['e2e']['p99']):.2f}x | "
            f"{cut} | {vs_worst} |")
    violations = [f"{t} @ {rate:g}: {metric} {stat} {ours}/{base}/{worst} = "
                  + " / ".join(format_number(x) for x in chain) + f" (out of order by {100 * gap:.1f}%)"
                  for t, rate, metric, stat, chain, gap in _ordering(rows, ours, base, worst) if gap is not None]
    lines.append("")
    if violations:
        lines.append(f"Ordering {ours} <= {base} <= {worst} broken at:")
        lines += [f"* {v}" for v in violations]
    else:
        lines.append(f"Ordering {ours} <= {base} <= {worst} holds at every rate, on P99 prefill and on "
                     "mean preemption loss.")
    return "\n".join(lines) + "\n"


def figure11_goals(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "infaas++",
                   worst: str = "round-robin", tolerance: float = 0.05) -> dict[str, Any]:
    """Issue 3's goals, judged on a Figure 11 run (seeds averaged): at each trace's top rate
    ``base``/``ours`` P99 prefill (goal >= 5x on M-M and L-L) and P99 decode (>= 1.3x on
    at least three traces); preemption loss lower by >= 50% on average over the traces where
    ``base`` has any; the ordering ours <= base <= worst on P99 prefill and mean preemption
    loss at every rate, counted strictly and beyond ``tolerance``."""
    rows = mean_over_seeds(records)
    top = {t: max(k[1] for k in rows if k[0] == t) for t in dict.fromkeys(r["trace"] for r in records)}
    prefill, decode, cuts = {}, {}, {}
    for t, rate in top.items():
        o, b = rows.get((t, rate, ours)), rows.get((t, rate, base))
        if o is None or b is None:
            continue
        prefill[t] = _ratio(b["prefill"]["p99"], o["prefill"]["p99"])
        decode[t] = _ratio(b["decode"]["p99"], o["decode"]["p99"])
        if b["preemption_loss"]["mean"] > 0:
            cuts[t] = 1 - o["preemption_loss"]["mean"] / b["preemption_loss"]["mean"]
    gaps: dict[tuple[str, float], list[float]] = defaultdict(list)
    for t, rate, _, _, _, gap in _ordering(rows, ours, base, worst):
        gaps[(t, rate)].append(0.0 if gap is None else gap)
    strict = sum(any(g > 0 for g in v) for v in gaps.values())
    beyond = sum(any(g > tolerance for g in v) for v in gaps.values())
    mean_cut = float(np.mean(list(cuts.values()))) if cuts else float("nan")
    return {"p99_prefill_ratio": prefill, "p99_decode_ratio": decode, "preemption_loss_cut": cuts,
            "preemption_loss_cut_mean": mean_cut,
            "points": len(gaps), "ordering_broken": strict, "ordering_broken_beyond_tolerance": beyond,
            "met": {"p99_prefill_5x_mm_ll": all(prefill.get(t, 0) >= 5 for t in ("M-M", "L-L")),
                    "p99_decode_1.3x_on_3": sum(v >= 1.3 for v in decode.values()) >= 3,
                    "preemption_loss_half": mean_cut >= 0.5,
                    "ordering_every_rate": strict == 0}}


def goals_markdown(records: list[dict[str, Any]], **kw: Any) -> str:
    g = figure11_goals(records, **kw)
    mark = {True: "**met**", False: "**missed**"}
    p, d, c, cut = g["p99_prefill_ratio"], g["p99_decode_ratio"], g["preemption_loss_cut"], g["preemption_loss_cut_mean"]
    return "\n".join([
        "| goal | result |", "|---|---|",
        f"| P99 prefill >= 5x INFaaS++ at the top rate on M-M and L-L | {mark[g['met']['p99_prefill_5x_mm_ll']]}: "
        f"M-M {p.get('M-M', float('nan')):.1f}x, L-L {p.get('L-L', float('nan')):.1f}x |",
        f"| P99 decode >= 1.3x on at least 3 traces | {mark[g['met']['p99_decode_1.3x_on_3']]}: "
        + ", ".join(f"{t} {v:.2f}x" for t, v in d.items()) + " |",
        f"| preemption loss >= 50% lower on average | {mark[g['met']['preemption_loss_half']]}: {100 * cut:.0f}% "
        "(" + ", ".join(f"{t} {100 * v:.0f}%" for t, v in c.items()) + ") |",
        f"| ordering Llumnix <= INFaaS++ <= round-robin at every rate | {mark[g['met']['ordering_every_rate']]}: "
        f"broken at {g['ordering_broken']} of {g['points']} points, {g['ordering_broken_beyond_tolerance']} "
        "by more than 5% |",
    ]) + "\n"


def _per_seed(runs: dict[int, dict[str, Any]], seeds: list[int], metric: str, stat: str) -> list[float]:
    return [float(runs[k][metric][stat]) for k in seeds]


def by_point_system_seed(records: list[dict[str, Any]]) -> dict[tuple[str, float], dict[str, dict[int, dict[str, Any]]]]:
    """Records indexed (trace, rate) -> system -> seed, in the order they first appear."""
    by: dict[tuple[str, float], dict[str, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by[(r["trace"], r["rate"])][r["system"]][r["seed"]] = r
    return by


def seed_ordering_markdown(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "infaas++") -> str:
    """Per (trace, rate): P99 prefill of ``ours`` and ``base`` on every seed both ran, the
    ratio of their means, on how many seeds ``ours`` is no worse, and the mean P99 decode
    ratio and mean preemption loss: the ordering judged over seeds, not on one."""
    by = by_point_system_seed(records)
    lines = [f"| trace | rate | P99 prefill {ours} (seeds) | P99 prefill {base} (seeds) | {base}/{ours} (means) "
             f"| seeds {ours} <= {base} | P99 decode {base}/{ours} | preemption loss {ours} / {base} (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for (t, rate), systems in by.items():
        seeds = sorted(set(systems.get(ours, {})) & set(systems.get(base, {})))
        if not seeds:
            continue
        a, b = systems[ours], systems[base]
        pa, pb = _per_seed(a, seeds, "prefill", "p99"), _per_seed(b, seeds, "prefill", "p99")
        won = sum(x <= y for x, y in zip(pa, pb, strict=True))
        dec = _ratio(float(np.mean(_per_seed(b, seeds, "decode", "p99"))),
                     float(np.mean(_per_seed(a, seeds, "decode", "p99"))))
        la = np.mean(_per_seed(a, seeds, "preemption_loss", "mean"))
        lb = np.mean(_per_seed(b, seeds, "preemption_loss", "mean"))
        lines.append(f"| {t} | {rate:g} | {format_number(float(np.mean(pa)))} ({', '.join(format_number(x) for x in pa)}) "
                     f"| {format_number(float(np.mean(pb)))} ({', '.join(format_number(x) for x in pb)}) "
                     f"| {_ratio(float(np.mean(pb)), float(np.mean(pa))):.2f}x | {won}/{len(seeds)} "
                     f"| {dec:.2f}x | {format_number(float(la))} / {format_number(float(lb))} |")
    return "\n".join(lines) + "\n"


# -- priorities and auto-scaling (Figures 13-15) --------------------------------------------
def _seed_mean(records: list[dict[str, Any]], get: Any) -> float:
    """Mean over seeds of ``get(record)`` (nan where a record lacks the value)."""
    vals = []
    for r in records:
        try:
            vals.append(float(get(r)))
        except (KeyError, TypeError):
            vals.append(float("nan"))
    return float(np.mean(vals)) if vals else float("nan")


def _groups(records: list[dict[str, Any]]) -> dict[tuple[str, float, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["trace"], r["rate"], r["system"])].append(r)
    return groups


def priority_markdown(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "llumnix-no-prio") -> str:
    """Per trace: high- and normal-priority latencies of ``ours`` and ``base`` (seeds
    averaged), and the speedups base/ours (> 1: ours is faster)."""
    g = _groups(records)
    lines = ["| trace | rate | class | system | prefill mean | prefill P99 | decode mean | e2e mean | e2e P99 |",
             "|" + "---|" * 9]
    ratios = ["| trace | high prefill mean | high prefill P99 | high decode mean | high e2e mean "
              "| normal prefill mean | normal decode mean | normal e2e mean |", "|" + "---|" * 8]
    for trace, rate in dict.fromkeys((k[0], k[1]) for k in g):
        if (trace, rate, ours) not in g or (trace, rate, base) not in g:
            continue
        val: dict[tuple[str, str, str, str], float] = {}
        for cls in ("high", "normal"):
            for system in (ours, base):
                rs = g[(trace, rate, system)]
                for metric in ("prefill", "decode", "e2e"):
                    for stat in ("mean", "p99"):
                        val[(cls, system, metric, stat)] = _seed_mean(
                            rs, lambda r, c=cls, m=metric, s=stat: r["by_priority"][c][m][s])
                lines.append(f"| {trace} | {rate:g} | {cls} | {system} | {format_number(val[(cls, system, 'prefill', 'mean')])} "
                             f"| {format_number(val[(cls, system, 'prefill', 'p99')])} "
                             f"| {format_number(val[(cls, system, 'decode', 'mean')])} "
                             f"| {format_number(val[(cls, system, 'e2e', 'mean')])} | {format_number(val[(cls, system, 'e2e', 'p99')])} |")

        def speedup(cls: str, metric: str, stat: str = "mean",
                    val: dict[tuple[str, str, str, str], float] = val) -> str:
            return f"{_ratio(val[(cls, base, metric, stat)], val[(cls, ours, metric, stat)]):.2f}x"

        ratios.append(f"| {trace} | {speedup('high', 'prefill')} | {speedup('high', 'prefill', 'p99')} "
                      f"| {speedup('high', 'decode')} | {speedup('high', 'e2e')} | {speedup('normal', 'prefill')} "
                      f"| {speedup('normal', 'decode')} | {speedup('normal', 'e2e')} |")
    return "\n".join(lines) + "\n\nSpeedup " + f"{base}/{ours} (> 1: {ours} faster):\n\n" + "\n".join(ratios) + "\n"


def scaling_rows(records: list[dict[str, Any]]) -> dict[tuple[str, float, str], dict[str, float]]:
    """(trace, rate, system) -> seeds-averaged average instances and prefill."""
    out = {}
    for key, rs in _groups(records).items():
        out[key] = {"instances": _seed_mean(rs, lambda r: r["instances"]["average"]),
                    "max_instances": _seed_mean(rs, lambda r: r["instances"]["max"]),
                    "prefill_mean": _seed_mean(rs, lambda r: r["prefill"]["mean"]),
                    "prefill_p99": _seed_mean(rs, lambda r: r["prefill"]["p99"]),
                    "decode_mean": _seed_mean(rs, lambda r: r["decode"]["mean"]),
                    "e2e_mean": _seed_mean(rs, lambda r: r["e2e"]["mean"]),
                    "migrations": _seed_mean(rs, lambda r: r["migrations"]["num_committed"])}
    return out


def scaling_markdown(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "infaas++") -> str:
    """Same scaling rule, both systems: average instances (time-weighted), the cost
    ``instances(base) / instances(ours) - 1``, and prefill latency."""
    rows = scaling_rows(records)
    lines = [f"| trace | rate | avg instances {base} | avg instances {ours} | cost {base}/{ours} - 1 "
             f"| P99 prefill {base} | P99 prefill {ours} | mean prefill {base} | mean prefill {ours} "
             f"| migrations {ours} |", "|" + "---|" * 10]
    for trace, rate in dict.fromkeys((k[0], k[1]) for k in rows):
        b, o = rows.get((trace, rate, base)), rows.get((trace, rate, ours))
        if b is None or o is None:
            continue
        cost = _ratio(b["instances"], o["instances"]) - 1
        lines.append(f"| {trace} | {rate:g} | {b['instances']:.2f} | {o['instances']:.2f} | {100 * cost:+.1f}% "
                     f"| {format_number(b['prefill_p99'])} | {format_number(o['prefill_p99'])} | {format_number(b['prefill_mean'])} "
                     f"| {format_number(o['prefill_mean'])} | {o['migrations']:.0f} |")
    return "\n".join(lines) + "\n"


def sweep_cost_markdown(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "infaas++") -> str:
    """Threshold sweep: systems named ``<system>[x,y]``. Every point, then each ``base``
    point against the cheapest ``ours`` point whose P99 prefill is no worse."""
    rows = scaling_rows(records)
    pts: dict[str, list[tuple[str, dict[str, float]]]] = {ours: [], base: []}
    for (_, _, system), m in rows.items():
        family, _, rule = system.partition("[")
        if family in pts:
            pts[family].append((f"[{rule}", m))
    lines = ["| system | rule [x, y] | avg instances | max instances | P99 prefill | mean prefill | migrations |",
             "|" + "---|" * 7]
    for family in (base, ours):
        for rule, m in pts[family]:
            lines.append(f"| {family} | {rule} | {m['instances']:.2f} | {m['max_instances']:.0f} "
                         f"| {format_number(m['prefill_p99'])} | {format_number(m['prefill_mean'])} | {m['migrations']:.0f} |")
    lines += ["", f"| {base} rule | its instances | its P99 prefill | cheapest {ours} rule with P99 prefill <= it "
              f"| {ours} instances | {ours} P99 prefill | cost {base}/{ours} - 1 |", "|" + "---|" * 7]
    for rule, b in pts[base]:
        ok = [(r, m) for r, m in pts[ours] if m["prefill_p99"] <= b["prefill_p99"]]
        if not ok:
            lines.append(f"| {rule} | {b['instances']:.2f} | {format_number(b['prefill_p99'])} | none | - | - | - |")
            continue
        r, m = min(ok, key=lambda rm: rm[1]["instances"])
        cost = _ratio(b["instances"], m["instances"]) - 1
        lines.append(f"| {rule} | {b['instances']:.2f} | {format_number(b['prefill_p99'])} | {r} | {m['instances']:.2f} "
                     f"| {format_number(m['prefill_p99'])} | {100 * cost:+.1f}% |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "comparison": comparison_markdown, "goals": goals_markdown, "seed-ordering": seed_ordering_markdown,
    "priority": priority_markdown, "scaling": scaling_markdown, "sweep-cost": sweep_cost_markdown}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim.paper_tables", description=__doc__.split("\n")[0])
    p.add_argument("table", choices=list(TABLES))
    p.add_argument("metrics", help="a metrics.json that `llumnix simulate` wrote")
    args = p.parse_args(argv)
    with open(args.metrics) as f:
        records = json.load(f)["records"]
    print(TABLES[args.table](records), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
