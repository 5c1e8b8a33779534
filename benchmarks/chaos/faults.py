"""The faults a soak injects, at seeded random times: each returns a record of what it
did (when, to what) for the report. Every target is a process of this soak's own serve
tree, its own Redis, or a connection of its own serve process. (``drain`` is no fault but
an operator's action that forces migrations, so that the faults land while requests move.)"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psutil
from benchmarks.chaos.monitor import Monitor
from benchmarks.chaos.procs import RayView, Redis, ray_workers

KINDS = ("kill_instance", "kill_llumsched", "cut_upstream", "cut_client", "restart_redis", "drain")


def schedule(rng: random.Random, duration_s: float, mean_interval_s: float, kinds: tuple[str, ...] = KINDS,
             first_s: float = 10.0) -> list[tuple[float, str]]:
    """Fault times (seconds into the soak, exponential gaps after ``first_s``) and kinds
    (shuffled rounds of ``kinds``, so each comes up as often as the others)."""
    times: list[float] = []
    t = first_s
    while t < duration_s - 15.0:  # the last seconds are left for the cluster to settle
        times.append(round(t, 1))
        t += rng.expovariate(1.0 / mean_interval_s)
    order: list[str] = []
    while len(order) < len(times):
        rnd = list(kinds)
        rng.shuffle(rnd)
        order += rnd
    return list(zip(times, order, strict=False))


class Injector:
    def __init__(self, serve_pid: int, redis: Redis, ray: RayView, rng: random.Random, monitor: Monitor,
                 live_cuts: Callable[[], list[asyncio.Event]], full_wait_s: float = 90.0,
                 redis_down_s: float = 2.0, drain_s: float = 10.0) -> None:
        self.serve_pid = serve_pid
        self.redis = redis
        self.ray = ray
        self.rng = rng
        self.monitor = monitor
        self.health = monitor.health
        self.live_cuts = live_cuts
        self.drain_s = drain_s
        """A drained instance is undrained after this long: its requests migrate out meanwhile."""
        self.full_wait_s = full_wait_s
        """A kill of an instance waits until the cluster is whole again, at most this long."""
        self.redis_down_s = redis_down_s

    async def inject(self, kind: str) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": kind, "time": time.time()}
        try:
            rec.update(await getattr(self, kind)())
        except Exception as e:  # noqa: BLE001 - a fault that could not be injected is reported as such
            rec.update(ok=False, detail=f"{type(e).__name__}: {e}"[:300])
        return rec

    async def kill_instance(self) -> dict[str, Any]:
        waited = await self._wait_whole()
        if waited is None:
            return {"ok": False, "detail": f"skipped: the cluster was not whole for {self.full_wait_s:.0f} s"}
        pids = await asyncio.to_thread(self.ray.instance_pids)
        procs = ray_workers(self.serve_pid, "instance")
        by_pid = {p.pid: p for p in procs}
        choices = sorted((iid, pid) for iid, pid in pids.items() if pid in by_pid)
        if not choices:  # no mapping: any instance worker of ours
            choices = [("?", p.pid) for p in procs]
        if not choices:
            return {"ok": False, "detail": "no instance process found"}
        iid, pid = self.rng.choice(choices)
        os.kill(pid, signal.SIGKILL)
        return {"ok": True, "target": iid, "pid": pid, "waited_for_whole_s": round(waited, 1)}

    async def _wait_whole(self) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.full_wait_s:
            h = await self.health()
            if h.get("status") == "ok":
                return time.monotonic() - t0
            await asyncio.sleep(2.0)
        return None

    async def kill_llumsched(self) -> dict[str, Any]:
        procs = ray_workers(self.serve_pid, "llumsched")
        if not procs:
            return {"ok": False, "detail": "no LlumSched process found (restarting?)"}
        pid = procs[0].pid
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        new = None
        while time.monotonic() - t0 < 60 and new is None:
            await asyncio.sleep(0.5)
            new = next((p.pid for p in ray_workers(self.serve_pid, "llumsched") if p.pid != pid), None)
        return {"ok": True, "pid": pid, "new_pid": new,
                "restarted_in_s": None if new is None else round(time.monotonic() - t0, 1)}

    async def cut_upstream(self) -> dict[str, Any]:
        """Reset the gateway's TCP connections to the instance and LlumSched workers
        (``ss -K``): Ray's gRPC channels reconnect, calls on them fail."""
        peers: dict[int, str] = {}  # listening port -> role
        for role in ("instance", "llumsched"):
            for p in ray_workers(self.serve_pid, role):
                try:
                    for c in p.net_connections("tcp"):
                        if c.status == psutil.CONN_LISTEN:
                            peers[c.laddr.port] = role
                except psutil.Error:
                    continue
        conns = [c for c in psutil.Process(self.serve_pid).net_connections("tcp")
                 if c.raddr and c.status == psutil.CONN_ESTABLISHED and c.raddr.port in peers]
        killed = []
        for c in conns:
            expr = f"src {_ss_addr(c.laddr.ip, c.laddr.port)} and dst {_ss_addr(c.raddr.ip, c.raddr.port)}"
            r = await asyncio.to_thread(subprocess.run, ["ss", "-K", "-tn", *expr.split()],
                                        capture_output=True, text=True, timeout=10)
            if r.returncode == 0 and len(r.stdout.strip().splitlines()) > 1:
                killed.append(peers[c.raddr.port])
        return {"ok": bool(killed), "num_connections": len(conns), "num_reset": len(killed),
                "to": sorted(set(killed))}

    async def cut_client(self) -> dict[str, Any]:
        live = self.live_cuts()
        if not live:
            return {"ok": False, "detail": "no request in flight"}
        picked = self.rng.sample(live, min(len(live), self.rng.randint(1, 3)))
        for ev in picked:
            ev.set()
        return {"ok": True, "num_cut": len(picked)}

    async def drain(self) -> dict[str, Any]:
        """Drain a serving instance through the admin route (its requests migrate out),
        then undrain it: migrations under way while the other faults land."""
        serving = (await self.health()).get("serving") or []
        if len(serving) < 2:
            return {"ok": False, "detail": f"skipped: {len(serving)} instance(s) serving"}
        iid = self.rng.choice(sorted(serving))
        code, text = await self.monitor.admin_post(f"/admin/instances/{iid}/drain")
        if code != 200:
            return {"ok": False, "target": iid, "detail": f"drain: {code} {text}"}
        await asyncio.sleep(self.drain_s)
        code2, text2 = await self.monitor.admin_post(f"/admin/instances/{iid}/undrain")
        return {"ok": True, "target": iid, "drained_s": self.drain_s,
                "undrain": code2 if code2 == 200 else f"{code2} {text2}"}

    async def restart_redis(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.redis.kill()
        await asyncio.sleep(self.redis_down_s)
        await asyncio.to_thread(self.redis.start)
        return {"ok": True, "port": self.redis.port, "down_s": round(time.monotonic() - t0, 1)}


def _ss_addr(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
