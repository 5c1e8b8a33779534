"""Issue 47's shedding measure (``bench/shed_goal.py``): hand-made records that count and that
do not, the gateway's real log line read back, a simulator run's records."""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import httpx
import pytest

from llumnix.bench.shed_goal import (
    UNKNOWN,
    ShedRecord,
    measure,
    prefill_instance,
    records_from_log,
    shed_from_client,
)
from llumnix.gateway.inprocess import InProcessGateway
from llumnix.gateway.request_log import FinishedRequest, finished_line
from llumnix.logging_setup import DATE_FORMAT, FORMAT
from tests.gateway.fake_backend import EngineBackend


def inter(inst: str, arrival: float, start: float, first: float) -> ShedRecord:
    return ShedRecord("interactive", False, inst, arrival, start, first)


def batch(inst: str, start: float, arrival: float = 0.0) -> ShedRecord:
    return ShedRecord("batch", False, inst, arrival, start, start + 0.5)


def test_a_miss_with_batch_prefilled_ahead_on_its_instance_counts():
    got = measure([inter("i0", 10.0, 11.8, 12.0), batch("i0", 10.5), batch("i0", 10.9, arrival=10.2)], 1.0)
    assert got["num_missed_ttft"] == 1
    assert got["num_missed_by_batch"] == 1 and got["num_batch_prefills_ahead"] == 2
    assert got["num_missed_by_batch_before_deadline"] == 1
    assert got["num_missed_other"] == 0 and got["goal_met"] is False


def test_batch_elsewhere_before_arrival_or_after_the_first_token_does_not_count():
    recs = [inter("i0", 10.0, 11.8, 12.0),  # a miss, 2 s
            batch("i1", 10.5),  # another instance
            batch("i0", 9.9),  # prefilled before it arrived (running work, not queued ahead)
            batch("i0", 12.0),  # at its first token
            inter("i0", 10.1, 11.0, 11.5)]  # interactive work ahead of it, itself met (1.4 s)
    got = measure(recs, 1.5)
    assert got["num_missed_ttft"] == 1 and got["num_missed_by_batch"] == 0
    assert got["num_missed_other"] == 1 and got["num_missed_other_behind_own_class"] == 1
    assert got["goal_met"] is True


def test_batch_ahead_only_once_the_request_was_late_counts_but_not_before_its_deadline():
    got = measure([inter("i0", 10.0, 11.8, 12.0), batch("i0", 11.0), batch("i0", 11.5)], 1.0)
    assert got["num_missed_ttft"] == 1 and got["num_missed_by_batch"] == 1 and got["goal_met"] is False
    assert got["num_missed_by_batch_before_deadline"] == 0 and got["goal_met_before_deadline"] is True


def test_a_met_request_is_no_miss_even_with_batch_ahead():
    got = measure([inter("i0", 10.0, 10.6, 10.9), batch("i0", 10.2)], 1.0)
    assert got["num_missed_ttft"] == 0 and got["goal_met"] is True


def test_batch_of_unknown_instance_makes_a_miss_maybe_by_batch():
    recs = [inter("i0", 10.0, 11.8, 12.0), batch(UNKNOWN, 10.5), inter(UNKNOWN, 20.0, 21.5, 21.6),
            batch("i3", 20.5)]
    got = measure(recs, 1.0)
    assert got["num_missed_ttft"] == 2 and got["num_missed_by_batch"] == 0
    assert got["num_missed_maybe_by_batch"] == 2 and got["num_missed_other"] == 0
    assert got["goal_met"] is True and got["goal_met_surely"] is False
    assert got["num_unknown_instance"] == 2


def test_the_prefill_instance_is_the_source_of_the_first_move_after_it():
    moves = [(5.0, "i0"), (9.0, "i1")]  # queued on i0, moved to i1 at 5; prefilled on i1 at 6; moved to i2 at 9
    assert prefill_instance("i2", 6.0, moves) == "i1"
    assert prefill_instance("i2", 4.0, moves) == "i0"
    assert prefill_instance("i2", 9.5, moves) == "i2"
    assert prefill_instance("i2", None, moves) == "i2"


def test_no_first_token_is_a_miss_and_shed_requests_count_per_class():
    recs = [ShedRecord("interactive", False, "i0", 10.0, None, None), batch("i0", 10.5),
            ShedRecord("batch", True), ShedRecord("batch", True), batch("i1", 1.0)]
    got = measure(recs, 1.0)
    assert got["num_missed_ttft"] == 1 and got["num_missed_by_batch"] == 1  # never served, batch ahead in time
    assert got["classes"]["batch"] == {"num_requests": 4, "num_shed": 2, "shed_share": 0.5}
    assert got["classes"]["interactive"]["num_shed"] == 0


def test_client_429s_are_shed_records_and_other_errors_are_not():
    got = shed_from_client(["batch", "interactive", "batch", None],
                           ["HTTP 429: b'shed'", "HTTP 400: b'bad'", None, "HTTP 429: b''"])
    assert got == [ShedRecord("batch", True)]


def test_the_gateway_log_line_reads_back_with_its_times():
    line = finished_line(FinishedRequest("cmpl-1", "instance-2", 40, 0, 8, "length", 1.25, 3.0, 0.75, 1,
                                         "interactive"))
    rec = logging.LogRecord("llumnix.gateway.request_log", logging.INFO, __file__, 1, line, None, None)
    rec.created, rec.msecs = 1_800_000_100.0, 0.0
    text = logging.Formatter(FORMAT, DATE_FORMAT).format(rec)
    lines = [text, "2026-11-29 10:00:00.000 INFO other: noise", text.replace(" slo_class=interactive", ""),
             text.replace("migrations=1", "migrations=0")]
    r, unmoved = records_from_log(lines)
    assert (r.slo_class, r.instance_id, unmoved.instance_id) == ("interactive", UNKNOWN, "instance-2")
    assert r.arrival_s == pytest.approx(1_800_000_100.0 - 3.0)
    assert r.prefill_start_s == pytest.approx(r.arrival_s + 0.75)
    assert r.first_token_s == pytest.approx(r.arrival_s + 1.25)


def test_a_served_request_that_named_a_class_logs_it(caplog):
    caplog.set_level(logging.INFO, logger="llumnix.gateway.request_log")
    with InProcessGateway(EngineBackend()) as url, httpx.Client(timeout=30) as c:
        for extra in ({"slo_class": "batch"}, {}):
            r = c.post(f"{url}/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 3,
                                                       "ignore_eos": True, **extra})
            assert r.status_code == 200, r.text
    lines = [x.getMessage() for x in caplog.records if x.getMessage().startswith("Finished request")]
    assert len(lines) == 2
    assert lines[0].endswith(" slo_class=batch") and "slo_class" not in lines[1]


def test_a_simulator_run_gives_one_record_a_request():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "slo"))
    from shed_goal import one, variants  # the study's own path

    classes = variants(Path(__file__).resolve().parents[2] / "benchmarks/slo/classes_shed.yaml")["same_priority"]
    got = one(classes, "slo", 6.144, 20, "a10-llama7b-serving")
    total = sum(c["num_requests"] for c in got["classes"].values())
    assert total == 128 and got["classes"]["interactive"]["num_requests"] == 38
    assert got["classes"]["interactive"]["num_shed"] == 0  # shed_share 0
    assert 0 < got["classes"]["batch"]["shed_share"] <= 0.25 + 1 / 90
    assert got["num_missed_ttft"] == got["num_missed_by_batch"] + got["num_missed_other"]
    assert got["num_unknown_instance"] == 0 and got["num_missed_maybe_by_batch"] == 0  # the simulator knows


def test_a_real_runs_record_summarizes_per_system_and_seed(tmp_path):
    import subprocess

    root = Path(__file__).resolve().parents[2]
    late = measure([inter("i0", 10.0, 11.8, 12.0), batch("i0", 10.5), ShedRecord("batch", True)], 1.0)
    fine = measure([inter("i0", 10.0, 10.2, 10.4), batch("i0", 10.5)], 1.0)
    runs = [{"seed": k, "shed_goal": g, "by_slo_class": {"interactive": {"attainment": a}, "batch": {"attainment": 1.0}}}
            for k, g, a in ((20, late, 0.0), (21, fine, 1.0))]
    (tmp_path / "cluster.json").write_text(json.dumps({"systems": [{"system": "slo", "runs": runs},
                                                                   {"system": "infaas++", "runs": []}]}))
    subprocess.run([sys.executable, str(root / "benchmarks/slo/shed_goal.py"), "--real", str(tmp_path / "cluster.json"),
                    "--out", str(tmp_path / "s.json")], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(root / "src")})
    got = json.loads((tmp_path / "s.json").read_text())["systems"]
    assert list(got) == ["slo"]  # a system with no measured run is left out
    mean = got["slo"]["mean"]
    assert (mean["num_missed_by_batch"], mean["num_seeds_goal_met"], mean["shed_share_batch"]) == (0.5, 1, 0.25)
    assert got["slo"]["per_seed"]["20"]["goal_met"] is False


def test_run_once_keeps_the_runs_own_log_lines_and_the_run_gets_its_measure(tmp_path):
    """``bench cluster``'s code path on a real socket: the gateway's Finished lines go to the
    server's log file, ``run_once`` keeps only those written during the run, ``run_record``
    measures them with the client's records."""
    from llumnix.bench.cluster_bench import ClusterBenchSettings, run_once
    from llumnix.bench.cluster_report import run_record
    from llumnix.bench.serve_bench import PlannedRequest
    from tests.gateway.test_metrics import StatusBackend

    log_path = tmp_path / "serve.log"
    log_path.write_text("2026-11-29 09:00:00.000 INFO llumnix.gateway.request_log: Finished request cmpl-old: "
                        "instance=instance-0 prompt_tokens=1 cached_tokens=0 output_tokens=1 finish_reason=length "
                        "ttft=9.000s e2e=9.000s queue=0.000s migrations=0 slo_class=interactive\n")  # an earlier run's
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    logger = logging.getLogger("llumnix.gateway.request_log")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    class Server:
        model = "fake"

        def __init__(self, url: str) -> None:
            self.url, self.log_path = url, log_path

        def wait_idle(self) -> None:
            pass

    classes = {"interactive": {"share": 0.5, "ttft_s": 1.0, "tpot_s": 0.5, "shed_share": 0.0, "priority": 0},
               "batch": {"share": 0.5, "ttft_s": 10.0, "tpot_s": 1.0, "shed_share": 0.0, "priority": 0}}
    reqs = [PlannedRequest(0.01 * i, f"request {i}", 2, 3, c) for i, c in enumerate(["interactive", "batch"] * 2)]
    try:
        with InProcessGateway(StatusBackend()) as url:
            raw = run_once(Server(url), reqs)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
    assert len(raw["log_lines"]) == 4 and not any("cmpl-old" in x for x in raw["log_lines"])
    got = run_record(ClusterBenchSettings(slo_classes=classes), raw, 1.2, 0, 1.0)["shed_goal"]
    assert {c: x["num_requests"] for c, x in got["classes"].items()} == {"interactive": 2, "batch": 2}
    assert got["num_missed_ttft"] == 0 and got["num_unknown_instance"] == 0 and got["goal_met_surely"] is True
