"""What the soak watches while it runs: /health every few seconds, /admin/cluster's
migration and gateway counters, process RSS, and serve's log afterwards."""
from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.chaos.procs import ray_workers, rss_mib


class Monitor:
    def __init__(self, url: str, client: Any, admin_key: str, health_every_s: float = 2.0,
                 cluster_every_s: float = 10.0) -> None:
        self.url = url
        self.client = client
        self._admin = {"Authorization": f"Bearer {admin_key}"}
        self.health_every_s = health_every_s
        self.cluster_every_s = cluster_every_s
        self.health_series: list[tuple[float, int, str, int]] = []
        """(seconds into the soak, HTTP status, /health status, instances serving)."""
        self.cluster_series: list[dict[str, Any]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = 0.0

    async def health(self) -> dict[str, Any]:
        try:
            r = await self.client.get(self.url + "/health", timeout=5.0)
            body = r.json()
            return {**body, "http": r.status_code}
        except Exception as e:  # noqa: BLE001 - an unreachable gateway is a health state too
            return {"status": "unreachable", "http": 0, "error": f"{type(e).__name__}: {e}"[:200]}

    async def cluster(self) -> dict[str, Any]:
        try:
            r = await self.client.get(self.url + "/admin/cluster", headers=self._admin, timeout=10.0)
            return dict(r.json()) if r.status_code == 200 else {"error": f"HTTP {r.status_code}: {r.text[:200]}"}
        except Exception as e:  # noqa: BLE001 - recorded, the soak goes on
            return {"error": f"{type(e).__name__}: {e}"[:200]}

    async def admin_post(self, path: str) -> tuple[int, str]:
        try:
            r = await self.client.post(self.url + path, headers=self._admin, timeout=30.0)
            return r.status_code, r.text[:200]
        except Exception as e:  # noqa: BLE001 - recorded by the caller
            return 0, f"{type(e).__name__}: {e}"[:200]

    async def is_idle(self) -> bool:
        """Every instance reports no running or waiting request."""
        info = await self.cluster()
        insts = info.get("instances")
        return bool(insts) and not any(i["num_running"] or i["num_waiting"] for i in insts)

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._tasks = [asyncio.create_task(self._health_loop()), asyncio.create_task(self._cluster_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _health_loop(self) -> None:
        while True:
            h = await self.health()
            self.health_series.append((round(time.time() - self._t0, 1), int(h.get("http", 0)), str(h.get("status")),
                                       len(h.get("serving") or ())))
            await asyncio.sleep(self.health_every_s)

    async def _cluster_loop(self) -> None:
        while True:
            info = await self.cluster()
            mig = info.get("migrations") or {}
            self.cluster_series.append({
                "t": round(time.time() - self._t0, 1), "error": info.get("error"),
                "committed": mig.get("committed"), "aborted": mig.get("aborted"),
                "instances": sorted(i["instance_id"] for i in info.get("instances") or []),
                "num_running": sum(i["num_running"] for i in info.get("instances") or []),
                "num_waiting": sum(i["num_waiting"] for i in info.get("instances") or []),
                "gateway": {k: v for k, v in (info.get("gateway") or {}).items() if k != "instances"},
                "replaced": (info.get("capacity") or {}).get("num_replaced")})
            await asyncio.sleep(self.cluster_every_s)

    def health_summary(self) -> dict[str, Any]:
        """Seconds spent in each state (each sample stands for the time to the next), and
        the transitions."""
        secs: Counter[str] = Counter()
        changes = []
        prev = None
        for i, (t, code, status, n) in enumerate(self.health_series):
            nxt = self.health_series[i + 1][0] if i + 1 < len(self.health_series) else t + self.health_every_s
            secs[status] += nxt - t
            if status != prev:
                changes.append({"t": t, "status": status, "http": code, "serving": n})
                prev = status
        return {"num_samples": len(self.health_series), "every_s": self.health_every_s,
                "seconds_by_status": {k: round(v, 1) for k, v in secs.items()}, "transitions": changes}


def process_rss(serve_pid: int, instance_pids: dict[str, int]) -> dict[str, dict[str, Any]]:
    out = {"gateway (serve)": {"pid": serve_pid, "mib": rss_mib(serve_pid)}}
    for iid, pid in sorted(instance_pids.items()):
        out[iid] = {"pid": pid, "mib": rss_mib(pid) if pid else None}
    for p in ray_workers(serve_pid, "llumsched"):
        out["llumsched"] = {"pid": p.pid, "mib": rss_mib(p.pid)}
    return out


PATTERNS = {
    "instance_failed": r"gateway: instance \S+ failed",
    "resumed": r"gateway: request \S+ resumed",
    "instance_removed": r"instance \S+ removed",
    "instance_replaced": r"replaces a lost instance",
    "replace_failed": r"replacing a lost instance with \S+ failed",
    "llumsched_unavailable": r"LlumSched unavailable",
    "orphan_reaped": r"stopped an orphaned or fenced-off copy",
    "meta_store_unreachable": r"meta store \S+ is unreachable",
    "meta_store_back": r"meta store \S+ is reachable again",
    "rescheduling_round_failed": r"rescheduling round failed",
    "traceback": r"Traceback \(most recent call last\)",
    "error_line": r"\bERROR\b",
}


def log_summary(path: Path, num_samples: int = 8) -> dict[str, Any]:
    """Counts of the lines that tell what the cluster went through, and a few of each
    error-like kind (tracebacks' last lines) as evidence."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return {"error": str(e)}
    counts: Counter[str] = Counter()
    samples: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        for key, pat in PATTERNS.items():
            if re.search(pat, line):
                counts[key] += 1
                if key in ("traceback", "error_line", "rescheduling_round_failed", "replace_failed") and \
                        len(samples.setdefault(key, [])) < num_samples:
                    tail = line if key != "traceback" else _traceback_end(lines, i)
                    samples[key].append(tail[:400])
    serve_s = [float(m.group(1)) for line in lines if (m := re.search(r"serving ([\d.]+) s after the loss", line))]
    return {"path": str(path), "num_lines": len(lines), "counts": dict(counts), "samples": samples,
            "replacement_seconds_to_serve": serve_s}


def _traceback_end(lines: list[str], start: int) -> str:
    """The exception line that ends the traceback starting at ``start``."""
    for line in lines[start + 1:start + 200]:
        if line and not line.startswith((" ", "\t", "Traceback")) and not line.startswith("During handling"):
            return line
    return lines[start]
