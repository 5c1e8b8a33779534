"""``/metrics`` counts every aborted migration by reason, from the cluster view's
``migrations.aborted_by_reason`` (LlumSched's full counts, not its recent history)."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llumnix.cluster.history import MigrationHistory
from llumnix.gateway.metrics import GatewayMetrics
from llumnix.migration import reasons


def _aborts(m: GatewayMetrics) -> dict[str, float]:
    text = generate_latest(m.registry).decode()
    assert "# TYPE llumnix:migration_aborts_total counter" in text
    return {s.labels["reason"]: s.value for fam in text_string_to_metric_families(text)
            if fam.name == "llumnix:migration_aborts" for s in fam.samples}


def test_aborts_are_counters_by_reason_and_sum_to_the_aborted_outcome():
    h = MigrationHistory(maxlen=5)
    h.add([{"committed": False, "abort_code": "refused"}] * 7
          + [{"committed": False, "abort_reason": "the request ended before its last stage"}] * 3
          + [{"committed": True}] * 4)
    m = GatewayMetrics("tiny")
    m.observe_cluster({"migrations": h.summary(())})
    got = _aborts(m)
    assert set(got) == set(reasons.ALL)  # every reason from the start, at 0 until it happens
    assert (got["refused"], got["source_finished"], got["transport_error"]) == (7, 3, 0)
    aborted = m.registry.get_sample_value("llumnix:migrations_total", {"model_name": "tiny", "outcome": "aborted"})
    assert sum(got.values()) == aborted == 10


def test_a_cluster_view_without_reasons_serves_no_reason_series():
    m = GatewayMetrics("tiny")
    m.observe_cluster({"migrations": {"committed": 1, "aborted": 0}})
    text = generate_latest(m.registry).decode()
    assert "llumnix:migration_aborts" not in text and "llumnix:migrations_total" in text
