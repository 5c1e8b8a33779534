"""What the gateway logs for an operator: a line per finished request (off with
``log_requests=False``), a throughput line while there is traffic, nothing while idle."""
from __future__ import annotations

import json
import logging
import re
import time

import httpx

from llumnix.gateway.inprocess import InProcessGateway
from llumnix.gateway.request_log import RequestLog
from tests.gateway.fake_backend import EngineBackend
from tests.gateway.test_metrics import StatusBackend

LOGGER = "llumnix.gateway.request_log"


def _complete(url: str, n: int = 1, max_tokens: int = 6, **extra: object) -> list[str]:
    ids = []
    with httpx.Client(timeout=30) as c:
        for i in range(n):
            r = c.post(f"{url}/v1/completions", json={"model": "fake", "prompt": f"request {i}",
                                                       "max_tokens": max_tokens, "ignore_eos": True, **extra})
            assert r.status_code == 200, r.text
            first = r.text.removeprefix("data: ").split("\n", 1)[0]  # the first chunk when streamed
            ids.append(json.loads(first)["id"])
    return ids


def _finished_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.INFO and r.getMessage().startswith("Finished request")]


def test_each_finished_request_logs_one_line_with_what_an_operator_looks_for(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    backend = EngineBackend()
    with InProcessGateway(backend) as url:
        ids = _complete(url, n=2, max_tokens=6)
        ids += _complete(url, n=1, max_tokens=4, stream=True)
    lines = _finished_lines(caplog)
    assert len(lines) == 3
    pattern = re.compile(r"Finished request (\S+): instance=(\S+) prompt_tokens=(\d+) cached_tokens=0 "
                         r"output_tokens=(\d+) finish_reason=length ttft=(\d+\.\d{3})s e2e=(\d+\.\d{3})s "
                         r"queue=(\d+\.\d{3})s migrations=0$")
    parsed = [pattern.match(line) for line in lines]
    assert all(parsed), lines
    assert [p.group(1) for p in parsed] == ids  # the response id the client got
    assert {p.group(2) for p in parsed} == {backend.engine.instance_id}
    assert [int(p.group(3)) for p in parsed] == [len(b"request 0"), len(b"request 1"), len(b"request 0")]
    assert [int(p.group(4)) for p in parsed] == [6, 6, 4]
    assert all(float(p.group(5)) <= float(p.group(6)) for p in parsed)  # ttft within e2e


def test_disable_log_requests_silences_the_per_request_lines(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    with InProcessGateway(EngineBackend(), log_requests=False) as url:
        _complete(url, n=2)
    assert _finished_lines(caplog) == []


def test_a_throughput_line_while_there_is_traffic_and_none_while_idle(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    interval = 0.2

    def throughput_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == LOGGER and r.getMessage().startswith("Avg prompt throughput")]

    with InProcessGateway(StatusBackend(), log_stats_interval_s=interval) as url:
        deadline = time.monotonic() + 4 * interval
        while time.monotonic() < deadline:
            _complete(url, n=1, max_tokens=8)
        time.sleep(5 * interval)  # a line for the interval the traffic ended in, and one for the next
        busy = throughput_lines()
        time.sleep(5 * interval)
        assert throughput_lines() == busy  # idle: nothing more
        assert len(busy) >= 2
        # one client, one request at a time: it is running, or waiting at the instance for its
        # first step, or done, when a line reads the status
        line = re.compile(r"Avg prompt throughput: (\d+\.\d) tokens/s, Avg generation throughput: (\d+\.\d) "
                          r"tokens/s, Running: ([01]) reqs, Waiting: ([01]) reqs, KV cache usage: \d+\.\d%, "
                          r"Migrations: 0, Instances: 1$")
        assert all(line.match(b) for b in busy), busy
        assert all(int(m.group(3)) + int(m.group(4)) <= 1 for m in map(line.match, busy)), busy
        assert float(line.match(busy[0]).group(2)) > 0
        # traffic again: the lines come back
        _complete(url, n=1, max_tokens=8)
        time.sleep(2 * interval)
        assert len(throughput_lines()) > len(busy)


def test_the_throughput_line_reads_the_cluster_and_counts_deltas():
    now = [100.0]
    rlog = RequestLog(interval_s=10, clock=lambda: now[0])

    def info(preemptions: int, committed: int, hits: int) -> dict:
        inst = {"instance_id": "instance-0", "num_running": 3, "num_waiting": 2, "num_used_blocks": 30,
                "num_total_blocks": 100, "num_preemptions": preemptions, "num_prefix_cache_queries": 200,
                "num_prefix_cache_hits": hits}
        idle = {**inst, "instance_id": "instance-1", "num_running": 0, "num_waiting": 0, "num_used_blocks": 10,
                "num_prefix_cache_queries": 0, "num_prefix_cache_hits": 0, "num_preemptions": 0}
        return {"instances": [inst, idle], "migrations": {"committed": committed}}

    rlog.num_in_flight = 1
    assert rlog.tick(info(1, 4, 50)) is not None  # the first line sets the counts' start
    rlog.num_in_flight = 0
    now[0] += 10
    rlog.num_prompt_tokens, rlog.num_generation_tokens = 120, 455
    assert rlog.tick(info(3, 5, 100)) == (
        "Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 45.5 tokens/s, Running: 3 reqs, "
        "Waiting: 2 reqs, Preemptions: 2, KV cache usage: 20.0%, Prefix cache hit rate: 50.0%, "
        "Migrations: 1, Instances: 2")
    now[0] += 10
    assert rlog.tick(info(3, 5, 100)).startswith("Avg prompt throughput: 0.0 tokens/s")  # the interval after
    now[0] += 10
    assert rlog.tick(info(3, 5, 100)) is None  # then idle: no line
    now[0] += 10
    rlog.num_in_flight = 1  # a request waiting for its first token is traffic
    assert rlog.tick(info(3, 5, 100)) is not None
