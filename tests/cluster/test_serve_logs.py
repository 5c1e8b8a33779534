"""`llumnix serve` as a real process: the log lines docs/serving.md promises reach its
terminal (stdout and stderr, as an operator sees them): a timestamped `Finished request`
line per request, the throughput line while traffic flows, and the lines LlumSched logs in
its Ray actor (a drain, the migration it causes, with its downtime); `llumnix top --once`
shows that cluster; `--disable-log-requests` silences the request lines only; SIGTERM exits 0."""
from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.serve_process import serve_process

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"
LLUMSCHED = r"^\(LlumSchedActor pid=\d+\)"
"""Ray's prefix on a line from LlumSched's actor (no colour codes: the output is a file)."""
FINISHED = re.compile(rf"^{STAMP} INFO llumnix\.gateway\.request_log: Finished request (\S+): instance=instance-\d "
                      r"prompt_tokens=\d+ cached_tokens=\d+ output_tokens=(\d+) finish_reason=length "
                      r"ttft=[\d.]+s e2e=[\d.]+s queue=[\d.]+s migrations=(\d+)$", re.M)
THROUGHPUT = re.compile(rf"^{STAMP} INFO llumnix\.gateway\.request_log: Avg prompt throughput: [\d.]+ tokens/s, "
                        r"Avg generation throughput: [\d.]+ tokens/s, Running: \d+ reqs, .*Instances: 2$", re.M)


def serve(model_dir: Path, log: Path, *flags: str) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """``serve_process`` with the throughput line every 0.5 s."""
    return serve_process(model_dir, log, "--log-stats-interval", "0.5", *flags)


def wait_for(log: Path, pattern: re.Pattern[str] | str, count: int = 1, timeout_s: float = 30.0) -> list[str]:
    """The lines of ``log`` matching ``pattern`` once there are ``count`` of them."""
    rx = re.compile(pattern, re.M) if isinstance(pattern, str) else pattern
    deadline = time.monotonic() + timeout_s
    while True:
        found = [m.group(0) for m in rx.finditer(log.read_text())]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{count} line(s) matching {rx.pattern!r} not in the output:\n{log.read_text()[-6000:]}")
        time.sleep(0.2)


def complete(url: str, max_tokens: int, headers: dict[str, str] | None = None) -> str:
    model = httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"]
    body = {"model": model, "prompt": "tell me a story", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def drain_a_busy_instance(url: str, admin: dict[str, str]) -> str:
    """Three long requests in flight, and a drain of an instance that runs one of them
    (once the requests have ended): the drained instance."""
    threads = [threading.Thread(target=complete, args=(url, 480)) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    busy: list[str] = []
    while not busy and time.monotonic() < deadline:
        insts = httpx.get(f"{url}/admin/cluster", headers=admin).json()["instances"]
        busy = [i["instance_id"] for i in insts if i.get("num_running")]
        time.sleep(0.02)
    assert busy, "no request seen running"
    assert httpx.post(f"{url}/admin/instances/{busy[0]}/drain", headers=admin).status_code == 200
    for t in threads:
        t.join(120)
    return busy[0]


def test_request_throughput_drain_and_migration_lines_reach_the_terminal(tiny_model_dir, tmp_path):
    log = tmp_path / "serve.log"
    admin = {"Authorization": "Bearer k"}
    with serve(tiny_model_dir, log, "--instances", "2", "--admin-key", "k", "--reschedule-interval", "0.05") as (
            url, proc):
        ids = [complete(url, 8) for _ in range(3)]
        finished = wait_for(log, FINISHED, 3)
        assert all(any(i in line for line in finished) for i in ids)  # every request, by its id
        wait_for(log, THROUGHPUT)

        # Long requests, and a drain of an instance that runs one: LlumSched (a Ray actor)
        # logs the drain and the migration, and Ray forwards its lines to this terminal. A
        # request can finish before its migration starts (480 tokens take 0.4-1 s here):
        # then the instance is undrained and the drain tried again.
        migration = (rf"{LLUMSCHED} {STAMP} INFO llumnix\.cluster\.history: migration of \S+ (instance-\d) -> "
                     r"instance-\d committed: \d+ blocks \(\d+ adopted\) in \d+ stages in [\d.]+ s, downtime [\d.]+ ms$")
        for _ in range(5):
            busy = drain_a_busy_instance(url, admin)
            wait_for(log, rf"{LLUMSCHED} {STAMP} INFO llumnix\.cluster\.llumsched: instance {busy} draining \(admin\)")
            time.sleep(1.0)  # LlumSched's report of a migration comes after the request's end
            moved = [m for m in re.findall(migration, log.read_text(), re.M) if m == busy]
            if moved:
                break
            assert httpx.post(f"{url}/admin/instances/{busy}/undrain", headers=admin).status_code == 200
        assert moved, log.read_text()[-4000:]
        assert any(line.endswith("migrations=1") for line in wait_for(log, FINISHED, 4)), log.read_text()[-4000:]

        # `llumnix top --once` shows the same cluster: the drained instance and the migration
        top = subprocess.run([sys.executable, "-m", "llumnix.cli", "top", "--url", url, "--key", "k", "--once"],
                             capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        rows = {line.split()[0]: line.split() for line in top.stdout.splitlines() if line.startswith("instance-")}
        assert rows[busy][1] == "draining" and len(rows) == 2, top.stdout
        assert re.search(rf"^ +[\d.]+s ago  \S+  {busy} -> instance-\d  committed, stall [\d.]+ ms$", top.stdout,
                         re.M), top.stdout

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]  # a clean stop, not 130


def test_disable_log_requests_silences_the_request_lines_only(tiny_model_dir, tmp_path, monkeypatch):
    """Also: with an API key, the printed `try:` command works as printed (it was a 401)."""
    monkeypatch.delenv("LLUMNIX_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    log = tmp_path / "serve.log"
    with serve(tiny_model_dir, log, "--instances", "2", "--disable-log-requests", "--api-key", "s3cret") as (url, _):
        try_line = wait_for(log, r"^  try: curl .*$")[0].removeprefix("  try: ")
        answer = subprocess.run(["bash", "-c", try_line], capture_output=True, text=True, timeout=60)
        assert '"choices"' in answer.stdout, (try_line, answer.stdout, answer.stderr)
        for _ in range(3):
            complete(url, 8, {"Authorization": "Bearer s3cret"})
        wait_for(log, THROUGHPUT)  # the logging works: the throughput line comes
        time.sleep(1.0)  # and a request line, had there been one, was written before it
        assert "Finished request" not in log.read_text()


def test_an_instance_actors_lines_reach_the_terminal_too(tiny_model_dir, tmp_path):
    """PD: each prefill instance logs its hand-offs, forwarded by Ray with its prefix. The
    requests are 480 tokens (the tiny model's context is 512): 64 took 26-51 ms with the
    engine's faster weights, and in a fresh-clone CI all three ended on the prefill
    instance before a hand-off committed (one that the request's end overtakes logs nothing)."""
    log = tmp_path / "serve.log"
    with serve(tiny_model_dir, log, "--instances", "2", "--prefill-instances", "1") as (url, _):
        for _ in range(3):
            complete(url, 480)
        wait_for(log, rf"^\(InstanceActor pid=\d+\) {STAMP} INFO llumnix\.cluster\.handoff: "
                      r"PD hand-off of \S+ instance-0 -> instance-1 committed: .*, downtime [\d.]+ ms$")
