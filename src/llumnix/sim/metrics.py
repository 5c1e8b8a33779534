"""What a run measures: per-request latencies, migrations, instances over time.

Prefill latency is TTFT from the gateway arrival (queueing included); decode latency
is the mean time per output token after the first; preemption loss is the time from
each preemption until the recompute finished, summed per request. Requests are also
summarized per priority class (``by_priority``): the class the trace gave them, even
when the system under test ignores priorities.

The serving metrics of every run: ``ttft`` (= prefill), ``tpot`` (= decode: time per
output token after the first, per request), ``itl`` (every gap between two tokens of a
request, a hand-off's stall included) and ``e2e``; ``slo``: the share of requests that
meet both a TTFT and a TPOT objective (``SLOS``, per latency model). Goodput (DistServe's:
the highest rate at which at least 90% do) is read across the rates of a sweep
(``goodput``).
"""
from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llumnix.core.batch import RequestMetrics, RequestOutput
from llumnix.core.request import Priority
from llumnix.migration.protocol import MigrationReport
from llumnix.policy.slo import SLOConfig

PRIORITY_NAMES = {int(p): p.name.lower() for p in Priority}
"""Class label in ``by_priority``: high, normal (other levels by number)."""


@dataclass(frozen=True)
class SLO:
    """A latency objective per request: both must hold for it to count toward goodput."""

    ttft_s: float
    """Time to first token (from arrival, queueing included)."""
    tpot_s: float
    """Mean time per output token after the first."""
    attainment: float = 0.9
    """Share of requests that must meet both, for a rate to count (DistServe's 90%)."""


SLOS: dict[str, SLO] = {
    # A10 + LLaMA-7B with the serving overhead: a 4k-token prompt alone prefills in
    # 0.93 s; a 32-request decode step takes ~0.09 s. TTFT within 2.5x the longest
    # prompt's bare prefill; TPOT within ~2.5x a lightly loaded decode step (0.04 s).
    "a10-llama7b-serving": SLO(ttft_s=2.5, tpot_s=0.1),
    "a10-llama7b": SLO(ttft_s=2.5, tpot_s=0.1),
}
"""The objectives goodput is measured against, per latency model preset."""


def slo_attainment(requests: Sequence[RequestMetrics], slo: SLO) -> float:
    """Share of requests meeting both objectives (a one-token request has no TPOT: only TTFT)."""
    if not requests:
        return float("nan")
    ok = 0
    for r in requests:
        ttft, tpot = r.ttft, r.decode_per_token
        if ttft is not None and ttft <= slo.ttft_s and (tpot is None or tpot <= slo.tpot_s):
            ok += 1
    return ok / len(requests)


def goodput(points: Iterable[tuple[float, float]], attainment: float = 0.9) -> dict[str, float]:
    """From (rate, SLO attainment) points of one system on one trace and seed: ``highest``,
    the highest rate such that it and every lower rate attain ``attainment`` (0 if the
    lowest fails), and ``interpolated``, the crossing between it and the next rate up
    (linear in attainment; ``highest`` when it passes at the top rate)."""
    pts = sorted(points)
    best, nxt = 0.0, None
    for i, (rate, att) in enumerate(pts):
        if att >= attainment:
            best = rate
            continue
        nxt = (rate, att, pts[i - 1] if i else (0.0, 1.0))
        break
    interp = best
    if nxt is not None:
        (r1, a1, (r0, a0)) = nxt
        interp = r0 + (r1 - r0) * (a0 - attainment) / (a0 - a1) if a0 > a1 else r0
    return {"highest": best, "interpolated": interp}


def summarize(values: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"mean": float("nan"), "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    p50, p99 = np.percentile(a, [50, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p99": float(p99), "max": float(a.max())}


@dataclass
class MetricsCollector:
    requests: list[RequestMetrics] = field(default_factory=list)
    classes: list[int] = field(default_factory=list)
    """Per finished request, its priority class in the trace (parallel to ``requests``)."""
    migrations: list[MigrationReport] = field(default_factory=list)
    num_rejected: int = 0
    instance_timeline: list[tuple[float, int]] = field(default_factory=list)
    """(time, number of instances up or starting) at every change."""
    slo: SLO | None = None
    """The objectives of ``summary``'s ``slo`` section (None: none reported)."""
    slo_classes: SLOConfig | None = None
    """The SLO classes of ``summary``'s ``by_slo_class``: each request in the class the trace
    named (``slo_names``), or where it names none, its priority's (``SLOConfig.for_priority``;
    None: not reported)."""
    num_shed: dict[int, int] = field(default_factory=dict)
    """Requests the policy shed (refused early), by the priority class the trace gave them."""
    slo_names: list[str] = field(default_factory=list)
    """Per finished request, the SLO class the trace named (parallel to ``requests``, when
    the trace names classes: ``by_slo_class`` then reads them, not the priorities)."""
    num_shed_by_name: dict[str, int] = field(default_factory=dict)
    """Shed requests by the SLO class the trace named (when it names them)."""
    request_ids: list[str] = field(default_factory=list)
    """Per finished request, its id (parallel to ``requests``; "" where not given)."""
    token_gaps: array = field(default_factory=lambda: array("d"))  # type: ignore[type-arg]
    """Every inter-token gap of every request (seconds)."""
    _last_token: dict[str, float] = field(default_factory=dict)

    def on_outputs(self, outputs: list[RequestOutput], now: float) -> list[RequestOutput]:
        """One step's outputs: the gap since each request's previous token. Returns the
        outputs that finished a request with its metrics (an engine sets ``metrics`` only
        on a finishing output, ``finish_reason`` set), so the caller needs no second pass."""
        last, gaps = self._last_token, self.token_gaps
        done: list[RequestOutput] = []
        for out in outputs:
            if out.new_token_ids:
                rid = out.request_id
                prev = last.get(rid)
                if prev is not None:
                    gaps.append(now - prev)
                if out.finish_reason is None:
                    last[rid] = now
                    continue
                if prev is not None:
                    del last[rid]
            if out.metrics is not None:
                done.append(out)
        return done

    def on_finished(self, m: RequestMetrics, priority_class: int | None = None, slo_class: str | None = None,
                    request_id: str = "") -> None:
        self.requests.append(m)
        self.request_ids.append(request_id)
        self.classes.append(m.priority if priority_class is None else priority_class)
        if slo_class is not None:
            self.slo_names.append(slo_class)

    def on_shed(self, priority_class: int, slo_class: str | None = None) -> None:
        self.num_shed[priority_class] = self.num_shed.get(priority_class, 0) + 1
        if slo_class is not None:
            self.num_shed_by_name[slo_class] = self.num_shed_by_name.get(slo_class, 0) + 1

    def on_migration(self, report: MigrationReport) -> None:
        self.migrations.append(report)

    def on_instances(self, now: float, num_instances: int) -> None:
        if self.instance_timeline and self.instance_timeline[-1][0] == now:
            self.instance_timeline[-1] = (now, num_instances)
        else:
            self.instance_timeline.append((now, num_instances))

    # -- reductions ------------------------------------------------------------
    def average_instances(self, end: float) -> float:
        """Time-weighted mean of the number of instances from the first change to ``end``."""
        tl = self.instance_timeline
        if not tl:
            return 0.0
        start = tl[0][0]
        if end <= start:
            return float(tl[-1][1])
        total = 0.0
        for (t0, n), (t1, _) in zip(tl, [*tl[1:], (end, 0)], strict=False):
            total += n * (min(t1, end) - t0)
        return total / (end - start)

    def request_arrays(self, priority_class: int | None = None) -> dict[str, np.ndarray]:
        """Per-request metric arrays, of every request or of one priority class."""
        rs = self.requests
        if priority_class is not None:
            rs = [r for r, c in zip(rs, self.classes, strict=True) if c == priority_class]
        return {
            "prefill": np.array([r.ttft for r in rs if r.ttft is not None]),
            "decode": np.array([d for r in rs if (d := r.decode_per_token) is not None]),
            "e2e": np.array([r.e2e for r in rs]),
            "preemption_loss": np.array([r.preemption_loss for r in rs]),
            "num_preemptions": np.array([r.num_preemptions for r in rs]),
        }

    def migration_summary(self) -> dict[str, Any]:
        done = [m for m in self.migrations if m.committed]
        reasons: dict[str, int] = {}
        for m in self.migrations:
            if not m.committed:
                key = m.abort_reason or "unknown"
                reasons[key] = reasons.get(key, 0) + 1
        downtimes = [m.downtime for m in done if m.downtime is not None and m.num_stages > 0]
        return {
            "num_committed": len(done), "num_aborted": len(self.migrations) - len(done),
            "abort_reasons": reasons,
            "num_blocks": int(sum(m.num_blocks for m in done)),
            "num_blocks_cached": int(sum(m.num_blocks_cached for m in done)),
            "downtime": summarize(downtimes),
        }

    def class_attainment(self, classes: SLOConfig, attainment: float = 0.9) -> dict[str, Any]:
        """Per SLO class (those with requests): its objectives, finished and shed requests,
        the share meeting both (a shed request meets neither), and whether that share
        reaches ``attainment`` (a rate counts toward goodput when every class's does)."""
        named = bool(self.slo_names or self.num_shed_by_name)  # the trace names each request's class
        shed: dict[str, int] = dict(self.num_shed_by_name) if named else {}
        for c, n in () if named else self.num_shed.items():
            name = classes.for_priority(c).name
            shed[name] = shed.get(name, 0) + n
        met: dict[str, list[int]] = {name: [0, 0] for name in shed}
        of = ([classes.get(n) for n in self.slo_names] if named
              else [classes.for_priority(c) for c in self.classes])
        for r, cls in zip(self.requests, of, strict=True):
            counts = met.setdefault(cls.name, [0, 0])
            counts[0] += 1
            counts[1] += cls.is_met(r.ttft, r.decode_per_token)
        out: dict[str, Any] = {}
        for name, (n, ok) in met.items():
            cls = classes.get(name)
            share = ok / (n + shed.get(name, 0))
            out[name] = {"ttft_s": cls.ttft_s, "tpot_s": cls.tpot_s, "num_finished": n,
                         "num_shed": shed.get(name, 0), "attainment": share, "meets": share >= attainment}
        return out

    def _class_summary(self, priority_class: int) -> dict[str, Any]:
        arr = self.request_arrays(priority_class)
        out: dict[str, Any] = {"num_finished": int(arr["e2e"].size)}
        for key in ("prefill", "decode", "e2e"):
            out[key] = summarize(arr[key])
        return out

    def summary(self, end: float) -> dict[str, Any]:
        arr = self.request_arrays()
        out: dict[str, Any] = {"num_finished": len(self.requests), "num_rejected": self.num_rejected}
        for key in ("prefill", "decode", "e2e", "preemption_loss"):
            out[key] = summarize(arr[key])
        out["ttft"], out["tpot"] = out["prefill"], out["decode"]
        out["itl"] = summarize(np.frombuffer(self.token_gaps, dtype=float) if len(self.token_gaps) else [])
        if self.slo is not None:
            out["slo"] = {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s, "target": self.slo.attainment,
                          "attainment": slo_attainment(self.requests, self.slo)}
        if self.slo_classes is not None:
            out["by_slo_class"] = self.class_attainment(self.slo_classes)
        out["num_preemptions"] = int(arr["num_preemptions"].sum())
        out["num_preempted_requests"] = int((arr["num_preemptions"] > 0).sum())
        out["by_priority"] = {PRIORITY_NAMES.get(c, str(c)): self._class_summary(c)
                              for c in sorted(set(self.classes), reverse=True)}
        out["migrations"] = self.migration_summary()
        prompt = sum(r.num_prompt_tokens for r in self.requests)
        cached = sum(r.num_cached_tokens for r in self.requests)
        out["prefix_cache"] = {"cached_tokens": cached, "prompt_tokens": prompt,
                               "hit_rate": cached / prompt if prompt else 0.0}
        out["instances"] = {"average": self.average_instances(end),
                            "max": max((n for _, n in self.instance_timeline), default=0)}
        return out
