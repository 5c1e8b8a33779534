"""`bench cluster --slo-classes`: the classes file, the trace's tags, the client's field,
attainment per class, the paired difference over seeds and the goal, and the simulator's
side (the same tags, by name)."""
from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from llumnix.bench import cluster_slo
from llumnix.bench.cluster_bench import ClusterBenchSettings, make_requests, settings_from_args
from llumnix.bench.cluster_report import run_record
from llumnix.bench.serve_bench import PlannedRequest, RequestRecord, _one
from llumnix.cli import build_parser
from llumnix.core.errors import LlumnixError

TWO = "interactive: {share: 0.3, ttft_s: 1.0, tpot_s: 0.1, priority: high}\n" \
      "batch: {share: 0.7, ttft_s: 10.0, tpot_s: 0.3}\n"
PAIRS = (np.array([8, 12, 20, 30]), np.array([10, 20, 30, 40]))


def _file(tmp_path, text=TWO):
    p = tmp_path / "classes.yaml"
    p.write_text(text)
    return p


def _args(*extra):
    return build_parser().parse_args(["bench", "cluster", *extra])


def test_the_classes_file_is_read_and_checked(tmp_path):
    classes = cluster_slo.read_classes(_file(tmp_path))
    assert classes == {"interactive": {"share": 0.3, "ttft_s": 1.0, "tpot_s": 0.1, "shed_share": 0.0, "priority": 1},
                       "batch": {"share": 0.7, "ttft_s": 10.0, "tpot_s": 0.3, "shed_share": 0.0, "priority": 0}}
    assert cluster_slo.slo_doc(classes)["default_class"] == "batch"  # the largest share


@pytest.mark.parametrize("text,message", [
    ("a: {share: 0.5, ttft_s: 1, tpot_s: 1}\n", "the shares must add up to 1, got 0.5"),
    ("a: {share: 0, ttft_s: 1, tpot_s: 1}\n", "a.share: must be a number in (0, 1], got 0"),
    ("a: {share: 1, ttft_s: -1, tpot_s: 1}\n", "slo.classes.a.ttft_s: must be a number > 0"),
    ("a: {share: 1, ttft_s: 1}\n", "slo.classes.a.tpot_s: is required"),
    ("a: {share: 1, ttft_s: 1, tpot_s: 1, ttft: 2}\n", "unknown field 'slo.classes.a.ttft'"),
    ("a: {share: 1, ttft_s: 1, tpot_s: 1, priority: urgent}\n", "unknown priority 'urgent'"),
    ("- a\n", "must map each class name to"),
    ("a: 3\n", "a: must be a mapping"),
])
def test_a_bad_classes_file_is_one_line(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(LlumnixError) as e:
        settings_from_args(_args("--slo-classes", str(path)))
    assert str(e.value).startswith(f"bench cluster: --slo-classes {path}: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file_is_one_line_and_shared_priorities_are_taken_under_the_simulator_too(tmp_path):
    with pytest.raises(LlumnixError, match="cannot read it"):
        settings_from_args(_args("--slo-classes", str(tmp_path / "none.yaml")))
    same = _file(tmp_path, "a: {share: 0.5, ttft_s: 1, tpot_s: 1}\nb: {share: 0.5, ttft_s: 2, tpot_s: 2}\n")
    assert settings_from_args(_args("--slo-classes", str(same))).slo_classes["b"]["priority"] == 0
    # the simulator tells the classes apart by name now (the trace's requests name them)
    s = settings_from_args(_args("--slo-classes", str(same), "--with-sim", "p.json"))
    assert s.slo_classes["a"]["priority"] == s.slo_classes["b"]["priority"] == 0


def test_every_systems_config_has_the_classes_and_serve_takes_it(tmp_path):
    from llumnix.config import SystemConfig

    s = settings_from_args(_args("--slo-classes", str(_file(tmp_path)), "--systems", "infaas++,slo",
                                 "--pairing", "fit"))
    for name in ("infaas++", "llumnix", "slo", "llumnix-default"):
        slo = SystemConfig.from_dict(s.system_doc(name)).scheduling.slo
        assert slo.get("interactive").ttft_s == 1.0 and slo.get("batch").tpot_s == 0.3
        assert slo.default_class == "batch"
    doc = s.system_doc("slo")
    assert doc["scheduling"]["dispatch"]["policy"] == "slo" and doc["scheduling"]["rescheduling"]["pairing"] == "fit"
    assert "slo" not in settings_from_args(_args()).systems  # only when named
    assert "slo" not in settings_from_args(_args()).system_doc("llumnix")["scheduling"]  # no classes: serve's


def test_the_trace_tags_the_stated_shares_the_same_at_every_rate():
    classes = cluster_slo.check_classes({"i": {"share": 0.3, "ttft_s": 1, "tpot_s": 1, "priority": "high"},
                                         "b": {"share": 0.7, "ttft_s": 9, "tpot_s": 1}}, "x")
    tags = cluster_slo.draw_classes(classes, 64, seed=0)
    assert (tags.count("i"), tags.count("b")) == (19, 45)  # 19.2 and 44.8, the largest remainders
    assert tags == cluster_slo.draw_classes(classes, 64, seed=0) != cluster_slo.draw_classes(classes, 64, seed=1)
    assert tags[:20].count("i") not in (0, 20)  # shuffled, not in blocks
    s = ClusterBenchSettings(slo_classes=classes)
    a, b = make_requests(s, PAIRS, 20, 1.0, 3, 257), make_requests(s, PAIRS, 20, 2.0, 3, 257)
    assert [r.slo_class for r in a] == [r.slo_class for r in b] == cluster_slo.draw_classes(classes, 20, 3)
    assert {r.slo_class for r in make_requests(ClusterBenchSettings(), PAIRS, 5, 1.0, 3, 257)} == {None}


def _sse(text: str) -> bytes:
    chunks = [{"choices": [{"text": ch}]} for ch in text]
    chunks.append({"choices": [], "usage": {"completion_tokens": len(text), "prompt_tokens": 3}})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def test_the_client_names_the_class_in_the_body_as_a_user_would():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=_sse("abc"), headers={"content-type": "text/event-stream"})

    async def go(req):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await _one(client, "http://x", "m", req, False, {})

    rec = asyncio.run(go(PlannedRequest(0.0, [1, 2, 3], 3, 3, slo_class="interactive")))
    assert rec.num_output_tokens == 3 and rec.error is None
    asyncio.run(go(PlannedRequest(0.0, [1, 2, 3], 3, 3)))
    assert bodies[0]["slo_class"] == "interactive" and "slo_class" not in bodies[1]


def _rec(ttft, e2e, n, error=None):
    return RequestRecord(arrival_s=0.0, ttft_s=ttft, e2e_s=e2e, num_output_tokens=n, error=error)


def _counters(requests, met):
    return {"num_preemptions": 0, "migrations_committed": 0, "migrations_aborted": 0, "committed_running": 0,
            "downtimes_s": [], "aborts_by_reason": {}, "slo_requests": requests, "slo_met": met}


def test_attainment_per_class_counts_both_objectives_and_errors_as_misses(tmp_path):
    s = settings_from_args(_args("--slo-classes", str(_file(tmp_path))))
    records = [_rec(0.5, 0.5 + 0.05 * 10, 11),   # interactive: met (TPOT 0.05)
               _rec(1.5, 2.0, 11),               # interactive: TTFT over 1 s
               _rec(0.2, 0.2 + 0.2 * 10, 11),    # interactive: TPOT 0.2 over 0.1
               _rec(None, None, 0, "HTTP 500"),  # interactive: an error
               _rec(9.0, 9.0 + 0.3 * 4, 5),      # batch: met at both bounds
               _rec(2.0, 2.0 + 0.4 * 4, 5),      # batch: TPOT over
               _rec(3.0, 3.0, 1)]                # batch: one token, no TPOT: TTFT alone
    names = ["interactive"] * 4 + ["batch"] * 3
    raw = {"records": records, "duration_s": 10.0, "samples": [], "slo_classes": names,
           "before": _counters({"interactive": 5.0}, {"interactive": 2.0}),
           "after": _counters({"interactive": 8.0, "batch": 3.0}, {"interactive": 3.0, "batch": 2.0})}
    r = run_record(s, raw, 0.85, 0, 1.0)["by_slo_class"]
    assert r["interactive"] == {"num_requests": 4, "num_met": 1, "attainment": 0.25, "num_shed": 0,
                                "goodput_req_s": 0.1, "gateway_requests": 3, "gateway_met": 1}
    assert r["batch"] == {"num_requests": 3, "num_met": 2, "attainment": pytest.approx(2 / 3), "num_shed": 0,
                          "goodput_req_s": 0.2, "gateway_requests": 3, "gateway_met": 2}
    assert run_record(s, raw, 0.85, 0, 1.0)["line"].endswith("; interactive 1/4 met, batch 2/3 met")


def test_a_run_with_its_gateway_log_reports_429s_and_the_shedding_measure(tmp_path):
    s = settings_from_args(_args("--slo-classes", str(_file(tmp_path))))
    records = [_rec(2.0, 3.0, 11), _rec(None, None, 0, "HTTP 429: b'shed'"), _rec(1.0, 2.0, 5)]
    names = ["interactive", "batch", "batch"]
    stamp = "2026-11-29 10:00:{:06.3f} INFO llumnix.gateway.request_log: Finished request cmpl-{}: instance=instance-0 "
    log = [stamp.format(13.0, 1) + "prompt_tokens=9 cached_tokens=0 output_tokens=11 finish_reason=length "
           "ttft=2.000s e2e=3.000s queue=1.500s migrations=0 slo_class=interactive",  # arrived at 10 s, first token 12
           stamp.format(12.5, 2) + "prompt_tokens=9 cached_tokens=0 output_tokens=5 finish_reason=length "
           "ttft=1.000s e2e=2.000s queue=0.200s migrations=0 slo_class=batch",  # prefilled at 10.7: ahead of it
           "2026-11-29 10:00:14.000 INFO llumnix.gateway.request_log: Avg prompt throughput: 1.0 tokens/s"]
    raw = {"records": records, "duration_s": 10.0, "samples": [], "slo_classes": names, "log_lines": log,
           "before": _counters({}, {}), "after": _counters({}, {})}
    run = run_record(s, raw, 1.2, 0, 1.0)
    assert run["by_slo_class"]["batch"]["num_shed"] == 1 and run["by_slo_class"]["interactive"]["num_shed"] == 0
    got = run["shed_goal"]
    assert (got["tight"], got["loose"]) == ("interactive", "batch")
    assert got["classes"]["batch"] == {"num_requests": 2, "num_shed": 1, "shed_share": 0.5}
    assert (got["num_missed_ttft"], got["num_missed_by_batch"], got["goal_met"]) == (1, 1, False)


def test_the_paired_difference_and_its_interval():
    d, lo, hi = cluster_slo.paired_difference([0.9, 0.8, 0.7, 0.9], [0.5, 0.6, 0.5, 0.5])
    assert d == pytest.approx(0.3) and 0.2 <= lo < d < hi <= 0.4
    assert cluster_slo.paired_difference([0.6, 0.7], [0.5, 0.6]) == pytest.approx((0.1, 0.1, 0.1))


def _sys(name, att):
    """Runs at 0.85 over seeds: per seed (interactive, batch) attainment."""
    runs = [{"load": 0.85, "seed": k, "by_slo_class": {
        "interactive": {"attainment": i, "goodput_req_s": i}, "batch": {"attainment": b, "goodput_req_s": b}}}
        for k, (i, b) in enumerate(att)]
    return {"system": name, "runs": runs}


def test_the_summary_and_the_goal_over_paired_seeds():
    classes = {"interactive": {}, "batch": {}}
    systems = [_sys("infaas++", [(0.5, 0.9), (0.6, 0.9), (0.4, 0.8)]),
               _sys("llumnix", [(0.55, 0.9), (0.7, 0.95), (0.45, 0.8)]),
               _sys("slo", [(0.8, 0.9), (0.8, 0.92), (0.7, 0.78)]),
               _sys("other", [(0.9, 0.99), (0.9, 0.99), (0.9, 0.99)])]
    systems[3]["runs"] = systems[3]["runs"][:2]  # two seeds: paired on those alone
    summary = cluster_slo.summarize(systems, classes)
    row = summary["0.85"]["slo"]["interactive"]
    assert row["attainment"] == {"median": 0.8, "min": 0.7, "max": 0.8}
    assert row["attainment_vs_infaas++"]["difference"] == pytest.approx((0.3 + 0.2 + 0.3) / 3)  # paired: seed by seed
    assert "attainment_vs_infaas++" not in summary["0.85"]["infaas++"]["interactive"]
    assert summary["0.85"]["other"]["batch"]["attainment_vs_infaas++"]["seeds"] == [0, 1]
    g = cluster_slo.goal(summary)
    assert g["slo"]["interactive_points"] == pytest.approx(0.2667, abs=1e-4)
    assert g["slo"]["batch_points"] == pytest.approx(0.0)
    assert g["slo"]["met"] is True  # 27 points up, batch level (0.0, not lower)
    assert g["llumnix"]["met"] is False  # 6.7 points
    systems[2]["runs"][2]["by_slo_class"]["batch"]["attainment"] = 0.7
    assert cluster_slo.goal(cluster_slo.summarize(systems, classes))["slo"]["met"] is False  # batch lower


def test_the_simulator_sends_each_class_at_its_priority_and_reports_its_attainment():
    from llumnix.bench.sim_vs_real import ATTAINMENT, real_metrics, sim_trace, simulate
    from llumnix.sim.latency import get_latency_model

    classes = cluster_slo.check_classes({"interactive": {"share": 0.25, "ttft_s": 1, "tpot_s": 0.1,
                                                         "priority": "high"},
                                         "batch": {"share": 0.75, "ttft_s": 10, "tpot_s": 0.3}}, "x")
    trace = sim_trace(PAIRS, 40, 4.0, 2, classes)
    tags = cluster_slo.draw_classes(classes, 40, 2)
    assert trace.priorities.tolist() == [1 if t == "interactive" else 0 for t in tags]
    assert trace.slo_class_ids is not None
    assert [trace.slo_class_names[k] for k in trace.slo_class_ids.tolist()] == tags
    s = ClusterBenchSettings(slo_classes=classes, instances=2, num_blocks=40)
    out = simulate(s, "slo", PAIRS, 40, 4.0, 2, get_latency_model("a10-llama7b-serving"))
    assert 0.0 <= out[f"{ATTAINMENT}interactive"] <= 1.0 and f"{ATTAINMENT}batch" in out
    assert f"{ATTAINMENT}batch" not in simulate(ClusterBenchSettings(instances=2, num_blocks=40), "infaas++",
                                                PAIRS, 40, 4.0, 2, get_latency_model("a10-llama7b-serving"))
    run = {"num_preemptions": 1, "ttft_s": {"p99": 1.0}, "itl_s": {"p99": 0.1},
           "by_slo_class": {"interactive": {"attainment": 0.5}, "batch": {"attainment": None}}}
    assert real_metrics(run)[f"{ATTAINMENT}interactive"] == 0.5 and f"{ATTAINMENT}batch" not in real_metrics(run)


def test_sim_vs_real_compares_each_classs_attainment_as_a_difference(monkeypatch):
    import dataclasses

    import llumnix.sim.sharegpt as sharegpt
    from llumnix.bench.sim_vs_real import compare
    from llumnix.sim.latency import get_latency_model

    monkeypatch.setattr(sharegpt, "sharegpt_lengths", lambda model: PAIRS)
    classes = cluster_slo.check_classes({"interactive": {"share": 0.5, "ttft_s": 1, "tpot_s": 0.1,
                                                         "priority": "high"},
                                         "batch": {"share": 0.5, "ttft_s": 10, "tpot_s": 0.3}}, "x")
    s = ClusterBenchSettings(seeds=(0, 1), loads=(0.8,), systems=("infaas++", "slo"), slo_classes=classes,
                             instances=2, num_blocks=40)

    def run(seed, inter):
        return {"load": 0.8, "seed": seed, "num_requests": 12, "num_preemptions": 1, "ttft_s": {"p99": 1.0},
                "itl_s": {"p99": 0.1}, "by_slo_class": {"interactive": {"attainment": inter},
                                                        "batch": {"attainment": 1.0}}}

    # a record cut short: the probe's capacity is with its first system only
    record = {"settings": dataclasses.asdict(s), "capacity": None, "partial": "cut short",
              "systems": [{"system": "infaas++", "capacity": {"capacity_req_s": 3.0},
                           "runs": [run(0, 0.5), run(1, 0.25)]},
                          {"system": "slo", "runs": [run(0, 1.0), run(1, 0.75)]}]}
    rows = compare(record, get_latency_model("a10-llama7b-serving"), sim_seeds=2)
    assert [(r["system"], r["metric"]) for r in rows][3:] == [("slo", "attainment:interactive"),
                                                              ("slo", "attainment:batch")]
    inter, batch = rows[3], rows[4]
    assert (inter["measured"], inter["low"], inter["high"]) == (0.5, 0.5, 0.5)  # +0.5 on both seeds
    assert batch["measured"] == 0.0 and -1.0 <= batch["predicted"] <= 1.0
