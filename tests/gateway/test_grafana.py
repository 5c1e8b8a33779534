"""The Grafana dashboard in docs/observability/ reads only what the gateway exports: every
panel query's series is a sample a real scrape of the gateway has, and every label it
groups by is one of that series' labels."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llumnix.gateway.inprocess import InProcessGateway
from tests.gateway.test_metrics import StatusBackend

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "observability" / "grafana-llumnix.json"
SERIES = re.compile(r"\b((?:vllm|llumnix):[a-z0-9_]+)")


def exported() -> dict[str, set[str]]:
    """Each sample name of a scrape, with its label names (the gateway over one instance
    that has served a few requests, prefix caching on)."""
    with InProcessGateway(StatusBackend(prefix_caching=True)) as url, httpx.Client(timeout=30) as c:
        for i in range(2):
            r = c.post(f"{url}/v1/completions", json={"model": "fake", "prompt": "a b c d e f", "max_tokens": 3 + i})
            assert r.status_code == 200, r.text
        text = c.get(f"{url}/metrics").text
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]]


def test_every_panel_reads_a_series_the_gateway_exports_with_its_labels():
    samples = exported()
    assert len(queries()) >= 15
    for title, expr in queries():
        names = SERIES.findall(expr)
        assert names, (title, expr)
        for name in names:
            assert name in samples, f"panel {title!r}: {name} is not exported"
            for group in re.findall(r"by \(([a-z_, ]+)\)", expr):
                labels = {g.strip() for g in group.split(",")}
                assert labels <= samples[name], f"panel {title!r}: {name} has no label {labels - samples[name]}"


def test_the_dashboard_is_importable_json_with_unique_panel_ids():
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "llumnix"
    assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in doc["panels"] for t in p["targets"])
