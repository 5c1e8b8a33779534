"""``llumnix demo --sim``: the paper's contrast, seen side by side in a minute. The same
requests go to two simulated clusters of 4 instances (LLaMA-7B on A10s: the simulator's
latency model, small KV caches), one scheduled by Llumnix (freeness dispatch, live
migration) and one by round-robin; both run at ``--speed`` times wall-clock pace, each
served as a gateway serves a cluster (``/llumnix/dashboard``, ``/round-robin/dashboard``,
``llumnix top --url``). A line is printed per migration on Llumnix's cluster and per
preemption on either, then a summary: preemptions, migrations and prefill latency of both.
No model, no Ray: the simulator drives the same policy code the real cluster runs."""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

from llumnix.core.errors import LlumnixError

RATE = 1.3
"""Requests a simulated second."""
NUM_REQUESTS = 390
"""300 simulated seconds of arrivals: ~45 s of wall time for Llumnix at 10x, ~67 s for round-robin."""
CONFIG: dict[str, Any] = {
    "name": "demo",
    "latency_model": "a10-llama7b",
    "cluster": {"num_instances": 4, "num_blocks": 400, "max_model_len": 6000},
    "systems": {"llumnix": {"dispatch": "llumnix", "migration": True, "migrate_out_threshold": 3},
                "round-robin": {"dispatch": "round-robin"}},
    "traces": [{"name": "M-M", "kind": "M-M", "rates": [RATE], "num_requests": NUM_REQUESTS}],
}
"""Medium prompts and outputs near the 4 instances' capacity. Seed 0: round-robin, blind to
how full each KV cache is, preempts 37 times and its P99 prefill is 199 s; Llumnix spreads
by freeness and migrates 118 times: 4 preemptions, P99 prefill 1.1 s."""


def main_demo_sim(args: argparse.Namespace) -> int:
    from llumnix.sim.config import parse_config
    from llumnix.sim.live_server import LiveSession, first_point

    if not args.speed > 0:
        raise LlumnixError(f"--speed must be > 0, got {args.speed:g}")
    if args.url is not None:
        raise LlumnixError("--sim starts its own simulated clusters: --url does not apply")
    session = LiveSession(first_point(parse_config(CONFIG)), args.speed, "127.0.0.1", args.port)
    print(f"simulated: the same {NUM_REQUESTS} requests (M-M, {RATE:g} req/s) to two clusters of 4 instances "
          f"(LLaMA-7B on A10s, the simulator's latency model) at {args.speed:g}x wall-clock speed:", flush=True)
    print("\n".join(session.addresses()), flush=True)
    news = News(session.runs)
    session.start()
    try:
        records = session.wait(news.poll, every_s=0.25)
        print(summary(records, news), flush=True)
        if args.keep:
            print(f"still serving the last state at {session.server.url}/ (Ctrl-C stops it)", flush=True)
            session.hold()
    except KeyboardInterrupt:
        pass
    finally:
        session.server.close()
    return 0


class News:
    """What changed in each run's document since the last look: a line per migration and
    per instance whose preemption count rose."""

    def __init__(self, runs: dict[str, Any]) -> None:
        self.runs = runs
        self.t0 = time.monotonic()
        self.seen: set[tuple[Any, ...]] = set()
        self.preempted: dict[tuple[str, str], int] = {}
        self.stalls: dict[str, list[float]] = {}
        """Per system, the stalls of its committed migrations of running requests."""

    def poll(self) -> None:
        from llumnix.demo import migration_text

        for run in self.runs.values():
            doc = json.loads(run.body)
            for m in (doc.get("migrations") or {}).get("recent", []):
                key = (run.name, m["request_id"], m["src_instance_id"], m["end_time"])
                if key not in self.seen:
                    self.seen.add(key)
                    if not m.get("was_queued"):  # a queued request's move (no KV yet) is only counted
                        self._say(run.name, migration_text(m))
                    if m.get("committed") and m.get("downtime") is not None:
                        self.stalls.setdefault(run.name, []).append(float(m["downtime"]))
            for inst in doc.get("instances", []):
                key2 = (run.name, inst["instance_id"])
                n, before = int(inst.get("num_preemptions") or 0), self.preempted.get(key2, 0)
                if n > before:
                    self.preempted[key2] = n
                    self._say(run.name, f"{inst['instance_id']} preempted {n - before} request"
                                        f"{'s' if n - before > 1 else ''} (its KV cache is full: recomputed later)")

    def _say(self, system: str, text: str) -> None:
        print(f"{time.monotonic() - self.t0:6.1f}s  {system:<12} {text}", flush=True)


def summary(records: list[dict[str, Any]], news: News) -> str:
    lines = [f"summary (simulated; the same {records[0]['num_requests']} requests to both):"]
    for r in records:
        s = sorted(news.stalls.get(r["system"], ()))
        stall = f" (stall median {1000 * s[len(s) // 2]:.1f} ms)" if s else ""
        mig = r["migrations"]
        lines.append(f"  {r['system']:<12} {r['num_preemptions']} preemptions, {mig['num_committed']} migrations "
                     f"committed{stall} and {mig['num_aborted']} aborted; prefill (TTFT) mean {r['prefill']['mean']:.2f} s, "
                     f"P99 {r['prefill']['p99']:.2f} s")
    return "\n".join(lines)
