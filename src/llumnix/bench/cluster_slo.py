"""``bench cluster --slo-classes FILE``: SLO classes in the trace, and attainment per class.

The file names each class with its share of the trace and its objectives (YAML)::

    interactive: {share: 0.3, ttft_s: 1.0, tpot_s: 0.1, priority: high}
    batch:       {share: 0.7, ttft_s: 10.0, tpot_s: 0.3, priority: normal}

Every system's config gets the classes as ``scheduling.slo`` (the largest share the
default class); each request of the trace is tagged with a class (the stated shares
exactly, shuffled by the seed, the same at every load) and the client names it in the
body's ``slo_class``, as a user would; the simulator (``--with-sim``) names it the same way
(two classes may share a priority). Per run and class:
attainment (the share of the class's requests that finished meeting both objectives; an
error meets neither), goodput (those per second) and the gateway's own count
(``llumnix:slo_*``). Over seeds: per system and load the median (min, max), and against
the base system the paired difference with a 95% bootstrap interval.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from llumnix.core.errors import InvalidRequestError, LlumnixError
from llumnix.policy.slo import SLOClass, make_class

GOAL_LOAD = "0.85"
GOAL_POINTS = 0.15
"""Issue 47's cluster goal: at 0.85 of capacity the tight class's attainment at least 15
points above the base system's, the loose class's no lower (paired means over seeds)."""


def read_classes(path: str | Path) -> dict[str, dict[str, Any]]:
    """The file's classes, checked: {name: {share, ttft_s, tpot_s, shed_share, priority}},
    priority as an integer; a bad file is one ``LlumnixError`` line."""
    import yaml

    where = f"bench cluster: --slo-classes {path}"
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise LlumnixError(f"{where}: cannot read it ({type(e).__name__})") from None
    if not isinstance(doc, dict) or not doc:
        raise LlumnixError(f"{where}: must map each class name to {{share, ttft_s, tpot_s[, priority]}}")
    return check_classes(doc, where)


def check_classes(doc: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in doc.items():
        if not isinstance(value, dict):
            raise LlumnixError(f"{where}: {name}: must be a mapping {{share, ttft_s, tpot_s[, priority]}}")
        share = value.get("share")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise LlumnixError(f"{where}: {name}.share: must be a number in (0, 1], got {share!r}")
        try:
            cls = make_class(str(name), {k: v for k, v in value.items() if k != "share"})
        except InvalidRequestError as e:
            raise LlumnixError(f"{where}: {e}") from None
        out[str(name)] = {"share": float(share), "ttft_s": cls.ttft_s, "tpot_s": cls.tpot_s,
                          "shed_share": cls.shed_share, "priority": cls.priority}
    total = sum(c["share"] for c in out.values())
    if abs(total - 1.0) > 1e-6:
        raise LlumnixError(f"{where}: the shares must add up to 1, got {total:g}")
    return out


def slo_doc(classes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``scheduling.slo`` of every system's config: the classes; the largest share the default."""
    return {"classes": {n: {k: c[k] for k in ("ttft_s", "tpot_s", "shed_share", "priority")}
                        for n, c in classes.items()},
            "default_class": max(classes, key=lambda n: classes[n]["share"])}


def slo_class(name: str, c: dict[str, Any]) -> SLOClass:
    return SLOClass(name, c["ttft_s"], c["tpot_s"], c["shed_share"], c["priority"])


def draw_classes(classes: dict[str, dict[str, Any]], n: int, seed: int) -> list[str]:
    """``n`` requests' classes: each class's share of ``n`` (largest remainders round), in an
    order shuffled by its own stream of ``seed`` (so the trace keeps them across rates)."""
    names = list(classes)
    exact = [classes[x]["share"] * n for x in names]
    counts = [math.floor(e) for e in exact]
    for i in sorted(range(len(names)), key=lambda i: counts[i] - exact[i])[:n - sum(counts)]:
        counts[i] += 1
    tags = [x for x, k in zip(names, counts, strict=True) for _ in range(k)]
    order = np.random.default_rng([seed, 3]).permutation(n)
    return [tags[i] for i in order]


# -- one run -------------------------------------------------------------------------------
def run_classes(classes: dict[str, dict[str, Any]], names: list[str | None], records: list[Any],
                duration_s: float, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per class: requests, those meeting both objectives at the client (``RequestRecord``s,
    parallel to ``names``), attainment, those shed (429s), goodput; and what the gateway
    counted meanwhile."""
    out: dict[str, Any] = {}
    for name, c in classes.items():
        cls = slo_class(name, c)
        mine = [r for r, x in zip(records, names, strict=True) if x == name]
        met = sum(r.error is None and r.e2e_s is not None and cls.is_met(r.ttft_s, r.tpot_s) for r in mine)
        gw = {k: _delta(before, after, k, name) for k in ("slo_requests", "slo_met")}
        out[name] = {"num_requests": len(mine), "num_met": met, "attainment": met / len(mine) if mine else None,
                     "num_shed": sum((r.error or "").startswith("HTTP 429") for r in mine),
                     "goodput_req_s": met / duration_s if duration_s > 0 else 0.0,
                     "gateway_requests": gw["slo_requests"], "gateway_met": gw["slo_met"]}
    return out


def _delta(before: dict[str, Any], after: dict[str, Any], key: str, name: str) -> int:
    return int(after.get(key, {}).get(name, 0.0) - before.get(key, {}).get(name, 0.0))


def line(by_class: dict[str, Any]) -> str:
    return ", ".join(f"{n} {c['num_met']}/{c['num_requests']} met" for n, c in by_class.items())


# -- over seeds ----------------------------------------------------------------------------
def paired_difference(a: list[float], b: list[float], draws: int = 4000,
                      seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired seeds, and its 95% bootstrap interval (seeds resampled)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    means = d[np.random.default_rng(seed).integers(0, len(d), (draws, len(d)))].mean(1)
    return float(d.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _spread(vals: list[float]) -> dict[str, float] | None:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None


def _by_seed(sys_rec: dict[str, Any], load: str, cls: str, key: str) -> dict[int, float]:
    return {r["seed"]: float(r["by_slo_class"][cls][key]) for r in sys_rec["runs"]
            if str(r["load"]) == load and "by_slo_class" in r and r["by_slo_class"][cls][key] is not None}


def summarize(systems: list[dict[str, Any]], classes: dict[str, dict[str, Any]],
              base: str = "infaas++") -> dict[str, Any]:
    """Per load, system and class: attainment and goodput over seeds (median, min, max)
    and, for every system but ``base``, the paired difference from ``base`` with its interval."""
    by_name = {x["system"]: x for x in systems}
    loads = list(dict.fromkeys(str(r["load"]) for x in systems for r in x["runs"]))
    out: dict[str, Any] = {}
    for load in loads:
        per_sys: dict[str, Any] = {}
        for name, rec in by_name.items():
            per_class: dict[str, Any] = {}
            for cls in classes:
                row: dict[str, Any] = {}
                for key in ("attainment", "goodput_req_s"):
                    mine = _by_seed(rec, load, cls, key)
                    row[key] = _spread(list(mine.values()))
                    theirs = _by_seed(by_name[base], load, cls, key) if base in by_name else {}
                    seeds = sorted(set(mine) & set(theirs))
                    if name != base and seeds:
                        d, lo, hi = paired_difference([mine[k] for k in seeds], [theirs[k] for k in seeds])
                        row[f"{key}_vs_{base}"] = {"difference": d, "low": lo, "high": hi, "seeds": seeds}
                per_class[cls] = row
            per_sys[name] = per_class
        out[load] = per_sys
    return out


def goal(summary: dict[str, Any], base: str = "infaas++", tight: str = "interactive",
         loose: str = "batch") -> dict[str, Any]:
    """Issue 47's cluster goal for each system against ``base`` at ``GOAL_LOAD`` (paired
    means): ``tight`` at least ``GOAL_POINTS`` above, ``loose`` no lower."""
    out: dict[str, Any] = {}
    for name, per_class in summary.get(GOAL_LOAD, {}).items():
        key = f"attainment_vs_{base}"
        t, lo = per_class.get(tight, {}).get(key), per_class.get(loose, {}).get(key)
        if t is None or lo is None:
            continue
        out[name] = {f"{tight}_points": t["difference"], f"{tight}_interval": [t["low"], t["high"]],
                     f"{loose}_points": lo["difference"], f"{loose}_interval": [lo["low"], lo["high"]],
                     "met": bool(t["difference"] >= GOAL_POINTS and lo["difference"] >= 0)}
    return out


def print_summary(summary: dict[str, Any], base: str = "infaas++") -> None:
    print(f"{'system':>16} {'load':>5} {'class':>12} {'attainment':>22} {'goodput':>8}  vs {base} (95% interval)")
    for load, per_sys in summary.items():
        for name, per_class in per_sys.items():
            for cls, row in per_class.items():
                a, g = row["attainment"], row["goodput_req_s"]
                att = "-" if a is None else f"{a['median']:.3f} ({a['min']:.2f}-{a['max']:.2f})"
                gp = "-" if g is None else f"{g['median']:.3f}"
                d = row.get(f"attainment_vs_{base}")
                vs = "" if d is None else f"{d['difference']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                print(f"{name:>16} {load:>5} {cls:>12} {att:>22} {gp:>8}  {vs}")


def print_goal(g: dict[str, Any], base: str = "infaas++", tight: str = "interactive", loose: str = "batch") -> None:
    """``goal``'s verdicts, a line a system."""
    for name, row in g.items():
        t, lo = row[f"{tight}_interval"], row[f"{loose}_interval"]
        print(f"goal at {GOAL_LOAD} of capacity, {name} against {base} (paired means over seeds): {tight} "
              f"{100 * row[f'{tight}_points']:+.1f} points [{100 * t[0]:+.1f}, {100 * t[1]:+.1f}] (>= "
              f"+{100 * GOAL_POINTS:.0f}), {loose} {100 * row[f'{loose}_points']:+.1f} [{100 * lo[0]:+.1f}, "
              f"{100 * lo[1]:+.1f}] (>= 0): " + ("met" if row["met"] else "not met"))
