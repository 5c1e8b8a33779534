"""What the gateway tells an operator as it serves: one INFO line per finished request, and
while there is traffic a throughput line every interval, as vLLM's server logs them:

    Finished request cmpl-1f0e-0: instance=instance-1 prompt_tokens=42 cached_tokens=32
        output_tokens=128 finish_reason=length ttft=0.081s e2e=2.412s queue=0.004s migrations=1
        [slo_class=interactive: only when the request named a class]
    Avg prompt throughput: 84.0 tokens/s, Avg generation throughput: 251.3 tokens/s,
        Running: 6 reqs, Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.2%,
        Migrations: 2, Instances: 2

Nothing is logged while the gateway is idle: the throughput loop runs only while requests
come, and stops after an interval with no request in flight and no token."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from llumnix.gateway.cluster_metrics import instances_of, kv_usage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinishedRequest:
    request_id: str
    instance_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    finish_reason: str
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    num_migrations: int
    slo_class: str | None = None
    """The class the request named (body or header), logged only then."""


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}s"


def finished_line(r: FinishedRequest) -> str:
    return (f"Finished request {r.request_id}: instance={r.instance_id or '-'} "
            f"prompt_tokens={r.num_prompt_tokens} cached_tokens={r.num_cached_tokens} "
            f"output_tokens={r.num_output_tokens} finish_reason={r.finish_reason} ttft={_secs(r.ttft_s)} "
            f"e2e={_secs(r.e2e_s)} queue={_secs(r.queue_s)} migrations={r.num_migrations}"
            + ("" if r.slo_class is None else f" slo_class={r.slo_class}"))


@dataclass
class _Totals:
    """The cluster's cumulative counts at one throughput line, for the next one's deltas."""

    num_preemptions: int = 0
    num_migrations: int = 0


def _totals_of(info: dict[str, Any]) -> _Totals:
    return _Totals(sum(int(i.get("num_preemptions", 0)) for i in instances_of(info)),
                   int((info.get("migrations") or {}).get("committed", 0)))


class RequestLog:
    """Per-request lines (unless ``log_requests`` is off) and the throughput loop (unless
    ``log_stats`` is off)."""

    def __init__(self, log_requests: bool = True, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, log_stats: bool = True) -> None:
        self.log_requests = log_requests
        self.log_stats = log_stats
        self.interval_s = interval_s
        self.clock = clock
        self.num_prompt_tokens = 0
        """Prompt tokens of the requests whose first token came in this interval."""
        self.num_generation_tokens = 0
        self.num_in_flight = 0
        self._last_time = clock()
        self._was_busy = False
        self._totals: _Totals | None = None
        self._task: asyncio.Task[None] | None = None

    def on_finished(self, r: FinishedRequest) -> None:
        if self.log_requests:
            log.info("%s", finished_line(r))

    def ensure_running(self, cluster_info: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """Start the throughput loop in this event loop, unless it runs already."""
        if self.log_stats and (self._task is None or self._task.done()):
            self._last_time = self.clock()
            self._was_busy = True
            self._task = asyncio.get_running_loop().create_task(self._run(cluster_info))

    async def _run(self, cluster_info: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        async def read() -> dict[str, Any] | None:
            try:
                return await cluster_info()
            except Exception:  # noqa: BLE001 - the gateway's own throughputs are still worth a line
                return None

        # the counts the first line's deltas start from
        first = await read()
        self._totals = None if first is None else _totals_of(first)
        while True:
            await asyncio.sleep(self.interval_s)
            line = self.tick(await read())
            if line is None:
                return
            log.info("%s", line)

    def tick(self, info: dict[str, Any] | None) -> str | None:
        """The line for the interval that ends now, and the start of the next one; None
        when the gateway was idle (no token in this interval nor in the one before, and
        no request in flight)."""
        now = self.clock()
        elapsed = max(1e-9, now - self._last_time)
        prompt_tps, gen_tps = self.num_prompt_tokens / elapsed, self.num_generation_tokens / elapsed
        busy = bool(self.num_prompt_tokens or self.num_generation_tokens or self.num_in_flight)
        self.num_prompt_tokens = self.num_generation_tokens = 0
        self._last_time = now
        was_busy, self._was_busy = self._was_busy, busy
        if not busy and not was_busy:
            return None
        parts = [f"Avg prompt throughput: {prompt_tps:.1f} tokens/s",
                 f"Avg generation throughput: {gen_tps:.1f} tokens/s"]
        if info is not None:
            parts += self._cluster_parts(info)
        return ", ".join(parts)

    def _cluster_parts(self, info: dict[str, Any]) -> list[str]:
        insts = instances_of(info)
        totals = _totals_of(info)
        last, self._totals = self._totals, totals
        parts = [f"Running: {sum(int(i.get('num_running', 0)) for i in insts)} reqs",
                 f"Waiting: {sum(int(i.get('num_waiting', 0)) for i in insts)} reqs"]
        # a count that went down is one that restarted (an instance or LlumSched): no delta
        preempted = max(0, totals.num_preemptions - last.num_preemptions) if last else 0
        if preempted:
            parts.append(f"Preemptions: {preempted}")
        usage = sum(kv_usage(i) for i in insts) / len(insts) if insts else 0.0
        parts.append(f"KV cache usage: {100 * usage:.1f}%")
        queries = sum(int(i.get("num_prefix_cache_queries", 0)) for i in insts)
        if queries:
            hits = sum(int(i.get("num_prefix_cache_hits", 0)) for i in insts)
            parts.append(f"Prefix cache hit rate: {100 * hits / queries:.1f}%")
        if "migrations" in info:
            parts.append(f"Migrations: {max(0, totals.num_migrations - last.num_migrations) if last else 0}")
        parts.append(f"Instances: {len(insts)}")
        return parts
