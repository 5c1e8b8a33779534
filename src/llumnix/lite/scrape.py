"""What an engine's Prometheus metrics say of its load, per engine kind.

Only the gauges that matter to dispatch: requests running and queued, the KV cache's
used fraction and, where the engine says, its capacity. A metric with several label
sets (one per model, or per instance behind another gateway) is summed, a fraction
averaged. The parse is pure; ``scrape`` does the one GET.
"""
from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from llumnix.lite.lrs import EngineLoad

# kind -> (running, waiting, kv fraction) metric names, first found wins per field
_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (("vllm:num_requests_running",), ("vllm:num_requests_waiting",),
             ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "sglang": (("sglang:num_running_reqs",), ("sglang:num_queue_reqs",), ("sglang:token_usage",)),
    "llamacpp": (("llamacpp:requests_processing",), ("llamacpp:requests_deferred",),
                 ("llamacpp:kv_cache_usage_ratio",)),
    # Our own gateway, as an opaque endpoint: its instances' vLLM-named series (older
    # gateways: the requests in flight and the old KV gauge).
    "llumnix": (("vllm:num_requests_running", "llumnix:gateway_requests_in_flight"), ("vllm:num_requests_waiting",),
                ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
}
_FRACTIONS = {n for names in _NAMES.values() for n in names[2]}


def detect_kind(text: str) -> str:
    """The engine kind a metrics page belongs to ('openai' when none is recognised)."""
    if "llumnix:gateway_requests_in_flight" in text:
        return "llumnix"  # before vllm: our gateway exports vLLM's names too
    for kind in ("vllm", "sglang", "llamacpp"):
        if f"\n{kind}:" in text or text.startswith(f"{kind}:") or f" {kind}:" in text:
            return kind
    return "openai"


def _samples(text: str) -> tuple[dict[str, float], dict[str, list[dict[str, str]]]]:
    """Per metric name: the sum (or, for a fraction, the mean) of its samples, and the
    labels of each sample."""
    values: dict[str, list[float]] = defaultdict(list)
    labels: dict[str, list[dict[str, str]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[s.name].append(float(s.value))
            labels[s.name].append(s.labels)
    out = {n: (sum(v) / len(v) if n in _FRACTIONS else sum(v)) for n, v in values.items() if v}
    return out, labels


def parse_metrics(kind: str, text: str, now: float) -> EngineLoad:
    """The load a metrics page of an engine of ``kind`` shows (all None for 'openai')."""
    if kind not in _NAMES:
        return EngineLoad(now)
    values, labels = _samples(text)
    running_names, waiting_names, kv_names = _NAMES[kind]

    def first(names: tuple[str, ...]) -> float | None:
        return next((values[n] for n in names if n in values), None)

    running, waiting, kv = first(running_names), first(waiting_names), first(kv_names)
    if kv is not None and kv > 1.0:
        kv /= 100.0  # a percentage
    return EngineLoad(now, None if running is None else int(running), None if waiting is None else int(waiting),
                      kv, _capacity(values, labels))


def _capacity(values: dict[str, float], labels: dict[str, list[dict[str, str]]]) -> int | None:
    """KV tokens: vLLM's cache config (summed over engines behind one endpoint), SGLang's total."""
    tokens = [int(i["num_gpu_blocks"]) * int(i["block_size"]) for i in labels.get("vllm:cache_config_info", ())
              if i.get("num_gpu_blocks", "").isdigit() and i.get("block_size", "").isdigit()]
    if tokens:
        return sum(tokens)
    if "sglang:max_total_num_tokens" in values:
        return int(values["sglang:max_total_num_tokens"])
    return None
