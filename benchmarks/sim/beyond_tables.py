"""Tables and bar plots for benchmarks/sim/beyond.md from the peers and improvement results.

    .venv/bin/python benchmarks/sim/beyond_tables.py > /tmp/tables.md

prints the markdown tables and rewrites results/peers/peers_bars.png and
results/improvement/improvement_bars.png. Points are (trace, rate): the lowest and the top
load-matched rate of each trace; every variant in the improvement run is compared with
the paper's Llumnix over the seeds both ran.
"""
import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from paper_tables import by_point_system_seed  # beside this script

R = Path(__file__).resolve().parent / "results"
TRACES = ["ShareGPT", "BurstGPT", "S-S", "M-M", "L-L", "S-L", "L-S"]
METRICS = [("prefill", "p99", "P99 prefill (s)"), ("decode", "p99", "P99 decode (s/token)"),
           ("prefill", "mean", "mean prefill (s)"), ("preemption_loss", "mean", "preemption loss (mean s)")]


def load(name):
    p = R / name / "metrics.json"
    return json.loads(p.read_text())["records"] if p.exists() else []


def val(r, m, s):
    return r[m][s]


def fmt(x):
    return f"{x:.3g}" if abs(x) >= 0.001 or x == 0 else f"{x:.2e}"


imp = load("improvement")
peers = load("peers")
# llumnix seed 0 from the improvement run joins the peers table (same config and seed)
peer_recs = peers + [r for r in imp if r["system"] == "llumnix" and r["seed"] == 0]
PEER_SYS = ["llumnix", "power-of-two", "least-requests", "llm-d"]
VARIANTS = [v for v in ("llumnix-shield", "llumnix-qfit", "llumnix-plus", "llumnix-stable", "llumnix-hyst") if any(r["system"] == v for r in imp)]


def points(recs):
    """(trace, rate) in trace order, then rate."""
    return sorted({(r["trace"], r["rate"]) for r in recs}, key=lambda p: (TRACES.index(p[0]), p[1]))


out = []
out.append("### Peers at the lowest and top load-matched rate of each trace (seed 0)\n")
for m, s, label in METRICS:
    out.append(f"\n{label}\n\n| trace | rate | " + " | ".join(PEER_SYS) + " |")
    out.append("|---|---|" + "---|" * len(PEER_SYS))
    for t, rate in points(peer_recs):
        rs = {r["system"]: r for r in peer_recs if (r["trace"], r["rate"]) == (t, rate)}
        cells = []
        base = rs.get("llumnix")
        for sname in PEER_SYS:
            r = rs.get(sname)
            if r is None:
                cells.append("-")
                continue
            v = val(r, m, s)
            ratio = ""
            if base is not None and sname != "llumnix" and val(base, m, s) > 0:
                ratio = f" ({v / val(base, m, s):.2f}x)"
            cells.append(fmt(v) + ratio)
        out.append(f"| {t} | {rate:g} | " + " | ".join(cells) + " |")


IMP_BY_POINT = by_point_system_seed(imp)


def by_seed(t, rate):
    """system -> seed -> record of the improvement run at (trace, rate)."""
    return IMP_BY_POINT.get((t, rate), {})


def compare(by, variant, m, s):
    """``variant`` against llumnix over their common seeds: the variant's values, the
    per-seed ratios variant / llumnix, and the seeds it wins (lower) and ties."""
    seeds = sorted(set(by["llumnix"]) & set(by[variant]))
    a = [val(by["llumnix"][k], m, s) for k in seeds]
    b = [val(by[variant][k], m, s) for k in seeds]
    ratios = [y / x for x, y in zip(a, b, strict=True) if x > 0]
    won = sum(y < x for x, y in zip(a, b, strict=True))
    tie = sum(y == x for x, y in zip(a, b, strict=True))
    return a, b, ratios, won, tie, len(seeds)


def variant_row(by, variant, m, s):
    """Cells comparing ``variant`` with llumnix over their common seeds."""
    a, b, ratios, won, tie, n = compare(by, variant, m, s)
    if m == "preemption_loss":  # near-zero baselines make per-seed ratios meaningless
        ratios = [np.mean(b) / np.mean(a)] if np.mean(a) > 0 else []
    rtxt = f"{np.mean(ratios):.3f}" if ratios else "-"
    return (f"{fmt(np.mean(b))} ({', '.join(fmt(x) for x in b)}) | {rtxt} | {won}/{n}"
            + (f" ({tie} tied)" if tie else ""))


def ratio_won(by, variant, m, s):
    """Mean of per-seed ratios variant / llumnix and seeds won, as 'r (w/n)'."""
    _, _, ratios, won, _, n = compare(by, variant, m, s)
    return f"{np.mean(ratios):.2f} ({won}/{n})" if ratios else "-"


out.append("\n### Summary: each variant / llumnix, mean of per-seed ratios (seeds won)\n")
out.append("| trace | rate | " + " | ".join(f"{v} P99 prefill | {v} P99 decode" for v in VARIANTS) + " |")
out.append("|---|---|" + "---|---|" * len(VARIANTS))
for t, rate in points(imp):
    by = by_seed(t, rate)
    cells = [ratio_won(by, v, m, "p99") if v in by else "-" for v in VARIANTS for m in ("prefill", "decode")]
    out.append(f"| {t} | {rate:g} | " + " | ".join(cells) + " |")

for variant in VARIANTS:
    out.append(f"\n### Improvement: llumnix vs {variant}, lowest and top load-matched rate, seeds 0-2 (M-M: 0-5)\n")
    for m, s, label in METRICS:
        rlabel = "ratio of the means" if m == "preemption_loss" else "mean of per-seed ratios"
        out.append(f"\n{label}: mean over seeds (per seed)\n\n| trace | rate | llumnix | {variant} | "
                   f"{variant} / llumnix ({rlabel}) | seeds won |")
        out.append("|---|---|---|---|---|---|")
        for t, rate in points(imp):
            by = by_seed(t, rate)
            if "llumnix" not in by or variant not in by:
                continue
            a = [val(by["llumnix"][k], m, s) for k in sorted(by["llumnix"])]
            out.append(f"| {t} | {rate:g} | {fmt(np.mean(a))} ({', '.join(fmt(x) for x in a)}) | "
                       + variant_row(by, variant, m, s) + " |")
print("\n".join(out))


def bars(recs, systems, path, title):
    """One bar per (trace, rate) and system: the mean over seeds, the error bar half the range."""
    pts = points(recs)
    fig, axes = plt.subplots(1, 4, figsize=(24, 4.6))
    for ax, (m, s, label) in zip(axes, METRICS, strict=True):
        x = np.arange(len(pts))
        w = 0.8 / len(systems)
        for i, sname in enumerate(systems):
            means, errs = [], []
            for pt in pts:
                vs = [val(r, m, s) for r in recs if (r["trace"], r["rate"]) == pt and r["system"] == sname]
                means.append(np.mean(vs) if vs else np.nan)
                errs.append((np.max(vs) - np.min(vs)) / 2 if len(vs) > 1 else 0)
            ax.bar(x + i * w - 0.4 + w / 2, means, w, yerr=errs, label=sname, capsize=2)
        ax.set_xticks(x, [f"{t} {rate:g}" for t, rate in pts], rotation=60, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if peer_recs:
    bars(peer_recs, PEER_SYS, R / "peers" / "peers_bars.png",
         "Peers vs Llumnix, lowest and top load-matched rate of each trace, seed 0 (log scale)")
if imp:
    bars(imp, ["llumnix", *VARIANTS], R / "improvement" / "improvement_bars.png",
         "Llumnix vs our variants, lowest and top load-matched rate, mean of seeds 0-2 (bars: half range) (log scale)")
