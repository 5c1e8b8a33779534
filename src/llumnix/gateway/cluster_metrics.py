"""The cluster's side of ``/metrics``: each instance's state and the cumulative counts of
the instances, LlumSched and this gateway, from the cluster view a scrape reads
(``Backend.cluster_info``, LlumSched's ``/admin/cluster``).

A custom collector rather than gauges set to totals: a count that only grows is exposed as
a Prometheus counter (``rate()`` and ``increase()`` work on it, and a restarted LlumSched or
instance reads as a counter reset), and an instance that leaves takes its series with it."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

_ENGINE = ["model_name", "engine"]
"""vLLM's label set; ``engine`` is the instance id."""

_PER_INSTANCE: tuple[tuple[str, str, str, str], ...] = (
    # name, type, help, the status_summary field it reads
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "num_running"),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "num_waiting"),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.", "num_preemptions"),
    ("vllm:prefix_cache_queries", "counter",
     "Prefix cache queries, in terms of number of queried tokens.", "num_prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "counter",
     "Prefix cache hits, in terms of number of cached tokens.", "num_prefix_cache_hits"),
    # a paced engine's (`--pace`, engine/pace.py): whether the emulated device's step times held
    ("llumnix:paced_steps", "counter", "Engine steps held to the pace's latency model.", "num_paced_steps"),
    ("llumnix:pace_overrun_steps", "counter",
     "Paced steps whose real work took longer than the modeled time.", "num_pace_overrun_steps"),
)
_ONLY_PACED = frozenset({"num_paced_steps", "num_pace_overrun_steps"})
"""Fields only a paced engine reports: no series (nor a family) without one."""


def _family(kind: str, name: str, doc: str, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def instances_of(info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The per-instance entries of a cluster view (none when it has none or is missing)."""
    if not info:
        return []
    return [i for i in info.get("instances", ()) if isinstance(i, dict) and "instance_id" in i]


def kv_usage(inst: dict[str, Any]) -> float:
    return float(inst["num_used_blocks"]) / max(1, int(inst["num_total_blocks"]))


class ClusterCollector(Collector):
    """Serves the last cluster view given to ``update`` (``None``: the view could not be
    read, and no cluster series are served rather than stale ones)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.info: dict[str, Any] | None = None

    def update(self, info: dict[str, Any] | None) -> None:
        self.info = info

    def collect(self) -> Iterator[Metric]:
        info = self.info
        if info is None:
            return
        yield from self._instances(instances_of(info))
        yield from self._llumsched(info)
        yield from _reaction(self.model_name, info.get("rescheduling"))
        yield from self._gateway(info.get("gateway"))
        yield from _pd(self.model_name, info.get("pd"), instances_of(info))
        yield from _slo_predictor(self.model_name, info.get("slo_predictor"))

    def _instances(self, instances: list[dict[str, Any]]) -> Iterator[Metric]:
        name = self.model_name
        for metric, kind, doc, field in _PER_INSTANCE:
            fam = _family(kind, metric, doc, _ENGINE)
            for inst in instances:
                if field in inst:
                    fam.add_metric([name, inst["instance_id"]], float(inst[field]))
            if fam.samples or field not in _ONLY_PACED:
                yield fam
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                                  labels=_ENGINE)
        freeness = GaugeMetricFamily("llumnix:instance_freeness", "Freeness of each instance (Algorithm 1).",
                                     labels=["model_name", "instance_id"])
        for inst in instances:
            usage.add_metric([name, inst["instance_id"]], kv_usage(inst))
            if "freeness" in inst:
                freeness.add_metric([name, inst["instance_id"]], float(inst["freeness"]))
        yield usage
        yield freeness
        # routers read the block size here (vLLM: a gauge set to 1, its labels the config)
        config = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                   labels=[*_ENGINE, "block_size", "num_gpu_blocks"])
        for inst in instances:
            if "block_size" in inst:
                config.add_metric([name, inst["instance_id"], str(inst["block_size"]),
                                   str(inst["num_total_blocks"])], 1.0)
        yield config

    def _llumsched(self, info: dict[str, Any]) -> Iterator[Metric]:
        name = self.model_name
        if "num_dispatched" in info:
            fam = CounterMetricFamily("llumnix:dispatches", "Requests dispatched by LlumSched, by its "
                                      "dispatch policy (since LlumSched started).",
                                      labels=["model_name", "policy"])
            fam.add_metric([name, str(info.get("dispatch_policy", ""))], float(info["num_dispatched"]))
            yield fam
        mig = info.get("migrations")
        if not mig:
            return
        fam = CounterMetricFamily("llumnix:migrations", "Live migrations by outcome (since LlumSched started).",
                                  labels=["model_name", "outcome"])
        fam.add_metric([name, "committed"], float(mig.get("committed", 0)))
        fam.add_metric([name, "aborted"], float(mig.get("aborted", 0)))
        yield fam
        yield from _aborts_by_reason(name, mig)
        for key, doc in (("blocks_sent", "KV blocks sent by live migrations."),
                         ("blocks_adopted", "KV blocks migrations found already cached at their destination.")):
            if key in mig:
                fam = CounterMetricFamily(f"llumnix:migration_{key}", doc, labels=["model_name"])
                fam.add_metric([name], float(mig[key]))
                yield fam
        gauge = GaugeMetricFamily("llumnix:migrations_in_flight", "Live migrations under way.",
                                  labels=["model_name"])
        gauge.add_metric([name], float(len(mig.get("in_flight", ()))))
        yield gauge

    def _gateway(self, gw: dict[str, Any] | None) -> Iterator[Metric]:
        if not gw:
            return
        name = self.model_name
        lost = CounterMetricFamily("llumnix:gateway_instances_lost",
                                   "Instances this gateway stopped polling, by how they ended (failed: "
                                   "its requests were resumed elsewhere; retired: drained and stopped by "
                                   "scale-in).", labels=["model_name", "outcome"])
        lost.add_metric([name, "failed"], float(gw.get("num_failed_instances", 0)))
        lost.add_metric([name, "retired"], float(gw.get("num_retired_instances", 0)))
        yield lost
        for key, metric, doc in (
                ("num_resumed", "llumnix:gateway_requests_resumed",
                 "Requests resumed on another instance after theirs failed."),
                ("num_fallback_dispatches", "llumnix:gateway_fallback_dispatches",
                 "Requests this gateway placed itself while LlumSched did not answer.")):
            if key in gw:
                fam = CounterMetricFamily(metric, doc, labels=["model_name"])
                fam.add_metric([name], float(gw[key]))
                yield fam


def _reaction(name: str, resched: Any) -> Iterator[Metric]:
    """LlumSched's reaction histogram, as it keeps it (cumulative since it started)."""
    hist = resched.get("reaction") if isinstance(resched, dict) else None
    if not isinstance(hist, dict) or "buckets" not in hist:
        return
    fam = HistogramMetricFamily("llumnix:reschedule_reaction_seconds",
                                "From the engine step whose status made an instance a migration source "
                                "(or its destination one, if later) to LlumSched ordering the first "
                                "migration out of it.", labels=["model_name"])
    buckets = [(f"{float(le):g}", float(n)) for le, n in hist["buckets"]]
    fam.add_metric([name], [*buckets, ("+Inf", float(hist["count"]))], sum_value=float(hist["sum"]))
    yield fam


def _aborts_by_reason(name: str, mig: dict[str, Any]) -> Iterator[Metric]:
    """Every aborted migration by why (``llumnix.migration.reasons``; each code present from
    the start, at 0, so ``rate()`` sees its first abort); the reasons sum to
    ``llumnix:migrations_total{outcome="aborted"}``."""
    by_reason = mig.get("aborted_by_reason")
    if not isinstance(by_reason, dict):
        return
    fam = CounterMetricFamily("llumnix:migration_aborts", "Aborted live migrations by reason (since "
                              "LlumSched started).", labels=["model_name", "reason"])
    for reason, n in sorted(by_reason.items()):
        fam.add_metric([name, str(reason)], float(n))
    yield fam


def _pd(name: str, pd: dict[str, Any] | None, instances: list[dict[str, Any]]) -> Iterator[Metric]:
    """Prefill-decode disaggregation (``cluster/pd.py``): hand-offs by outcome (ended_first: the
    request finished before its hand-off; waiting: the decode pool had no room when one was
    offered), role changes by reason, each instance's role."""
    if not isinstance(pd, dict) or pd.get("mode", "off") == "off":
        return
    fam = CounterMetricFamily("llumnix:pd_handoffs", "PD hand-offs from prefill to decode instances by "
                              "outcome (since LlumSched started).", labels=["model_name", "outcome"])
    for outcome in ("done", "failed", "ended_first", "waiting"):
        fam.add_metric([name, outcome], float(pd.get(f"handoffs_{outcome}", 0)))
    yield fam
    fam = CounterMetricFamily("llumnix:pd_role_changes", "Adaptive PD's role changes by reason.",
                              labels=["model_name", "reason"])
    for reason, key in (("lend", "lends"), ("reclaim", "reclaims"), ("flip", "flips")):
        fam.add_metric([name, reason], float(pd.get(key, 0)))
    yield fam
    role = GaugeMetricFamily("llumnix:instance_pd_role", "1 for each instance's PD role.",
                             labels=["model_name", "instance_id", "role"])
    for inst in instances:
        if "role" in inst:
            role.add_metric([name, inst["instance_id"], str(inst["role"])], 1.0)
    yield role


def _slo_predictor(name: str, pred: dict[str, Any] | None) -> Iterator[Metric]:
    """The ``slo`` policy's step-time model against the steps the engines report
    (``SLOPredictor.step_error``): each step predicted before it was fitted."""
    if not isinstance(pred, dict):
        return
    fam = CounterMetricFamily("llumnix:slo_predictor_steps", "Engine steps the slo policy's step-time model "
                              "was fitted on (since this gateway started).", labels=["model_name"])
    fam.add_metric([name], float(pred.get("num_steps_fitted", 0)))
    yield fam
    err = GaugeMetricFamily("llumnix:slo_predictor_step_error", "Relative error |predicted / measured - 1| of "
                            "the predicted step time over the last 1000 steps, at a quantile.",
                            labels=["model_name", "quantile"])
    for q, key in (("0.5", "p50"), ("0.9", "p90")):
        if key in pred:
            err.add_metric([name, q], float(pred[key]))
    yield err
