"""A `llumnix serve` process for ``bench cluster``, and what its gateway tells about the
cluster: ``/metrics`` counters and ``/admin/cluster`` samples (KV usage, migrations)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from llumnix.cluster.startup import die_with_parent
from llumnix.core.aio import within
from llumnix.core.errors import LlumnixError


class ServeProcess:
    """``with ServeProcess(config, log) as server``: `llumnix serve --config config` on a free
    loopback port until the block ends (SIGTERM, then SIGKILL), or until this process dies:
    a benchmark killed outright takes its servers, and their Ray clusters, with it."""

    def __init__(self, config: Path, log: Path, start_timeout_s: float = 600.0,
                 env: dict[str, str] | None = None) -> None:
        self.config, self.log_path, self.timeout = config, log, start_timeout_s
        self.env = env or {}
        """Added to the serve process's environment (``bench cluster --trace``)."""
        self.url = ""
        self.model = ""

    def __enter__(self) -> ServeProcess:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llumnix.cli", "serve", "--config", str(self.config), "--port", str(port),
             "--shutdown-grace", "5"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(),
            env={**os.environ, "RAY_DEDUP_LOGS": "0", **self.env})
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                tail = self.log_path.read_text().strip().splitlines()[-1:] or ["(no output)"]
                raise LlumnixError(f"llumnix serve exited with {self.proc.returncode}: {tail[0][:200]}")
            if time.monotonic() > deadline:
                self.__exit__()
                raise LlumnixError(f"llumnix serve did not answer /health in {self.timeout:.0f} s")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.model = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"]
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._log.close()

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Until no instance runs or queues a request and no migration is under way (the
        next run starts on an empty cluster); then one status interval more."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = admin_cluster(self.url)
            busy = any(i["num_running"] or i["num_waiting"] for i in info.get("instances", ()))
            if not busy and not info.get("migrations", {}).get("in_flight"):
                time.sleep(0.3)
                return
            time.sleep(0.2)
        raise LlumnixError(f"the cluster was still busy {timeout_s:.0f} s after a run")


def admin_cluster(url: str, tries: int = 30) -> dict[str, Any]:
    """``/admin/cluster``, retried for a while: it answers 503 while LlumSched is busy or
    replacing an instance (seen on a machine loaded 10x over its cores)."""
    for k in range(tries):
        try:
            r = httpx.get(f"{url}/admin/cluster", timeout=30)
            r.raise_for_status()
            out: dict[str, Any] = r.json()
            return out
        except httpx.HTTPError as e:
            if k == tries - 1:
                raise LlumnixError(f"{url}/admin/cluster: {e}") from None
            time.sleep(1.0)
    raise AssertionError("unreachable")


def metric_sums(text: str, keep: tuple[str, ...] = ()) -> dict[str, float]:
    """Prometheus text -> {sample name with its non-model labels: value summed over the rest}.
    ``vllm:num_preemptions_total`` sums the instances; ``llumnix:migrations_total{outcome=
    "aborted"}`` keeps its outcome."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine") or k in keep}
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(labels.items()))
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def aborts_by_reason(sums: dict[str, float]) -> dict[str, float]:
    """``metric_sums``' ``llumnix:migration_aborts_total{reason=...}`` -> {reason: count}."""
    prefix = "llumnix:migration_aborts_total{reason="
    return {k[len(prefix):-1]: v for k, v in sums.items() if k.startswith(prefix)}


def by_label(sums: dict[str, float], name: str, label: str) -> dict[str, float]:
    """``metric_sums``' ``name{label=...}`` -> {label value: count}."""
    prefix = f"{name}{{{label}="
    return {k[len(prefix):-1]: v for k, v in sums.items() if k.startswith(prefix)}


def cluster_counters(url: str) -> dict[str, Any]:
    """Preemptions and migrations so far (aborts by reason), from ``/metrics``; downtimes from
    ``/admin/cluster``."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    m = metric_sums(text)
    mig = admin_cluster(url).get("migrations", {})
    per_engine = {k: v for k, v in metric_sums(text, keep=("engine",)).items()
                  if k.startswith("vllm:num_preemptions_total")}
    return {"num_preemptions": m.get("vllm:num_preemptions_total", 0.0), "preemptions_by_engine": per_engine,
            "migrations_committed": m.get("llumnix:migrations_total{outcome=committed}", 0.0),
            "migrations_aborted": m.get("llumnix:migrations_total{outcome=aborted}", 0.0),
            "aborts_by_reason": aborts_by_reason(m),
            "committed_running": mig.get("committed_running", 0),
            # a paced cluster's (--pace): steps held to the model, and those whose real work overran it
            "paced_steps": m.get("llumnix:paced_steps_total", 0.0),
            "pace_overrun_steps": m.get("llumnix:pace_overrun_steps_total", 0.0),
            # the gateway's own TTFT (a client on a loaded machine reads its first chunk late)
            "gateway_ttft_sum_s": m.get("vllm:time_to_first_token_seconds_sum", 0.0),
            "gateway_ttft_count": m.get("vllm:time_to_first_token_seconds_count", 0.0),
            "downtimes_s": list(mig.get("recent_downtimes_s", ())),
            # per SLO class (scheduling.slo): finished requests, and those meeting both objectives
            "slo_requests": by_label(m, "llumnix:slo_requests_total", "slo_class"),
            "slo_met": by_label(m, "llumnix:slo_met_total", "slo_class")}


async def poll_cluster(url: str, every_s: float, samples: list[dict[str, Any]], stop: asyncio.Event,
                       t0: float | None = None) -> None:
    """Append ``/admin/cluster``'s instances every ``every_s`` until ``stop`` (and once
    more after it), timed from ``t0`` (``perf_counter``; default: now)."""
    t0 = time.perf_counter() if t0 is None else t0
    async with httpx.AsyncClient(timeout=30) as client:
        while True:
            try:
                info = (await client.get(f"{url}/admin/cluster")).json()
                samples.append({"t": time.perf_counter() - t0,
                                "instances": [{k: i.get(k) for k in ("instance_id", "num_used_blocks",
                                                                     "num_total_blocks", "num_running",
                                                                     "num_waiting", "freeness")}
                                              for i in info.get("instances", ())]})
            except (httpx.HTTPError, ValueError):
                pass  # one missed sample; the next poll tries again
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await within(stop.wait(), every_s)
