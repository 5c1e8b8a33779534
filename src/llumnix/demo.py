"""`llumnix demo`: live migration, seen. Starts a small cluster (`llumnix serve`, 2
instances of the packaged model on CPU by default, a small KV cache each), keeps long
requests in flight on it and drains the busiest instance every ``--drain-every`` seconds
(its running requests migrate live, KV cache included, to the other one), prints the
dashboard's address and a line per migration as LlumSched learns of it, and ends after
``--duration`` seconds with a summary: migrations committed and their stall."""
from __future__ import annotations

import argparse
import contextlib
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llumnix.core.errors import LlumnixError


def add_demo_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="start a small cluster and watch it migrate requests (about a minute)",
                       description="Starts `llumnix serve` (2 instances of the packaged model on CPU, a small KV "
                       "cache each), keeps long requests in flight, drains the busiest instance every --drain-every "
                       "seconds (its running requests migrate live, KV cache included, to the other), prints the "
                       "dashboard's address and a line per migration as it happens, and ends after --duration "
                       "seconds with a summary: migrations committed and their stall (downtime).")
    p.add_argument("--model", default="smollm2", help="as `llumnix serve`'s (default: the packaged SmolLM2-135M)")
    p.add_argument("--instances", type=int, default=2, help="instances to start (default 2)")
    p.add_argument("--port", type=int, default=8000, help="the gateway's port (default 8000)")
    p.add_argument("--duration", type=float, default=60.0, metavar="S", help="seconds of workload (default 60)")
    p.add_argument("--drain-every", type=float, default=15.0, metavar="S",
                   help="seconds between drains of the busiest instance (default 15)")
    p.add_argument("--clients", type=int, default=8, help="requests kept in flight (default 8)")
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens of each request (default 256)")
    p.add_argument("--kv-cache-mib", type=int, default=64, help="KV cache per instance (default 64)")
    p.add_argument("--url", default=None, help="drive a running gateway instead of starting one (needs --key)")
    p.add_argument("--key", default=None, help="that gateway's admin key (drains need it)")
    p.add_argument("--keep", action="store_true", help="keep the cluster serving after the summary, until Ctrl-C")
    p.add_argument("--sim", action="store_true",
                   help="no model, no Ray: the same 390 requests to two simulated clusters of 4 instances side by "
                        "side, Llumnix and round-robin, at --speed x wall-clock pace (round-robin preempts, Llumnix "
                        "migrates; about a minute); of the flags above only --port and --keep apply")
    p.add_argument("--speed", type=float, default=10.0, metavar="X",
                   help="with --sim: simulated seconds per wall-clock second (default 10)")
    p.add_argument("--contrast", action="store_true",
                   help="two real clusters of 2 instances side by side, Llumnix and round-robin (no migration), "
                        "the same requests to both: long (--max-tokens) and short in turn, one every --every s for "
                        "--duration s; round-robin sends every long one to the same instance, which preempts")
    p.add_argument("--every", type=float, default=2.0, metavar="S",
                   help="with --contrast: seconds between requests (default 2)")
    p.add_argument("--num-blocks", type=int, default=40,
                   help="with --contrast: KV blocks per instance (default 40: two long requests fill one)")
    p.set_defaults(func=main_demo)


def main_demo(args: argparse.Namespace) -> int:
    if args.sim:
        from llumnix.demo_sim import main_demo_sim

        return main_demo_sim(args)
    if args.contrast:
        from llumnix.demo_contrast import main_demo_contrast

        return main_demo_contrast(args)
    if args.url is not None and not args.key:
        raise LlumnixError("--url needs --key: the gateway's admin key (a drain needs it)")
    if args.instances < 2:
        raise LlumnixError("--instances must be at least 2: a migration needs somewhere to go")
    with _cluster(args) as (url, key):
        print(f"dashboard: {url}/dashboard?key={key}", flush=True)
        watcher = MigrationPrinter(url, key)
        watcher.start()
        num_done = Workload(url, key, args).run()
        time.sleep(1.0)  # LlumSched reports a migration after its round: the last ones
        watcher.stop()
        print(watcher.summary(num_done), flush=True)
        if args.keep:
            print(f"still serving at {url} (Ctrl-C stops it)", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    return 0


@contextlib.contextmanager
def _cluster(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """A gateway to drive: the one named, or `llumnix serve` started here (its output in a
    log file, shown if it fails) and stopped at the end."""
    if args.url is not None:
        yield args.url.rstrip("/"), args.key
        return
    folder = Path(tempfile.mkdtemp(prefix="llumnix-demo-"))
    print(f"starting {args.instances} instances of {args.model} (a minute or two on CPU); "
          f"serve log: {folder / 'serve.log'}", flush=True)
    flags = ["--model", args.model, "--instances", str(args.instances), "--kv-cache-mib", str(args.kv_cache_mib)]
    with serve_processes({"serve": (args.port, flags)}, folder) as started:
        yield started["serve"]


@contextlib.contextmanager
def serve_processes(runs: dict[str, tuple[int, list[str]]], folder: Path) -> Iterator[dict[str, tuple[str, str]]]:
    """`llumnix serve` started here for each of ``runs`` (name -> its port and flags), all at
    once, each with an admin key of its own, rescheduling every 0.1 s and its output in
    ``folder/NAME.log`` (its last lines in the error if it never gets healthy); yields name
    -> (url, admin key), and stops them all at the end (the demo and its ``--contrast``)."""
    from llumnix.cluster.startup import wait_until_healthy

    procs: dict[str, tuple[subprocess.Popen[bytes], str, str, Path]] = {}
    try:
        for name, (port, flags) in runs.items():
            key, log = secrets.token_hex(12), folder / f"{name}.log"
            cmd = [sys.executable, "-m", "llumnix.cli", "serve", "--port", str(port), "--admin-key", key,
                   "--reschedule-interval", "0.1", "--shutdown-grace", "2", *flags]
            with log.open("w") as out:
                procs[name] = (subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL),
                               f"http://127.0.0.1:{port}", key, log)
        for name, (proc, url, _, log) in procs.items():
            try:
                wait_until_healthy(url, proc, 600.0, "llumnix serve" if len(runs) == 1 else f"llumnix serve ({name})")
            except LlumnixError as e:
                raise LlumnixError(f"{e}; its last lines:\n{_tail(log)}") from None
        yield {name: (url, key) for name, (_, url, key, _) in procs.items()}
    finally:
        for proc, *_ in procs.values():
            proc.terminate()
        for proc, *_ in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _tail(path: Path, n: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


class Workload:
    """``--clients`` long requests kept in flight, and the busiest instance drained every
    ``--drain-every`` seconds until its running requests have moved out (then undrained)."""

    def __init__(self, url: str, key: str, args: argparse.Namespace) -> None:
        import httpx

        self.url, self.args = url, args
        self.admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        self.model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        self.start = time.monotonic()
        self.deadline = self.start + args.duration
        self.num_done = 0
        self.errors: list[str] = []

    def run(self) -> int:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.args.clients)]
        for t in threads:
            t.start()
        next_drain = self.start + min(8.0, self.args.drain_every)
        while time.monotonic() < self.deadline:
            if time.monotonic() >= next_drain:
                self._drain_busiest()
                next_drain = time.monotonic() + self.args.drain_every
            time.sleep(0.2)
        stop_by = time.monotonic() + 5.0  # the requests still running end with the cluster, not the other way
        for t in threads:
            t.join(timeout=max(0.0, stop_by - time.monotonic()))
        if self.errors:
            print(f"{len(self.errors)} requests failed, the first: {self.errors[0]}", flush=True)
        return self.num_done

    def _client(self, i: int) -> None:
        import httpx

        body = {"model": self.model, "prompt": f"Once upon a time, in a city of {i + 2} bridges,",
                "max_tokens": self.args.max_tokens, "ignore_eos": True, "temperature": 0.8}
        with httpx.Client(base_url=self.url, timeout=300) as client:
            while time.monotonic() < self.deadline:
                try:
                    r = client.post("/v1/completions", json=body)
                except httpx.HTTPError as e:
                    if time.monotonic() < self.deadline:
                        self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                if r.status_code == 200:
                    self.num_done += 1
                elif time.monotonic() < self.deadline:  # not the cluster stopping under it
                    self.errors.append(f"{r.status_code} {r.text[:200]}")

    def _drain_busiest(self) -> None:
        instances = self.admin.get("/admin/cluster").json()["instances"]
        serving = [i for i in instances if not i["is_terminating"]]
        if len(serving) < 2:
            return
        busiest = max(serving, key=lambda i: (i["num_running"], i["num_used_blocks"]))
        iid, n = busiest["instance_id"], busiest["num_running"]
        self._say(f"draining {iid}: its {n} running requests migrate live to the others")
        self.admin.post(f"/admin/instances/{iid}/drain").raise_for_status()
        until = time.monotonic() + 10.0
        while time.monotonic() < until:
            now = {i["instance_id"]: i for i in self.admin.get("/admin/cluster").json()["instances"]}
            if now.get(iid, {}).get("num_running", 0) == 0:
                break
            time.sleep(0.2)
        self.admin.post(f"/admin/instances/{iid}/undrain").raise_for_status()
        self._say(f"undrained {iid}: it takes requests again")

    def _say(self, text: str) -> None:
        print(f"{time.monotonic() - self.start:6.1f}s  {text}", flush=True)


class MigrationPrinter:
    """A line per migration as ``/admin/cluster`` lists it (polled every 0.25 s), and the
    demo's summary: counts since the start, and the stalls of those seen."""

    def __init__(self, url: str, key: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        first = self._info()["migrations"]
        self.base = {k: first.get(k, 0) for k in ("committed", "aborted")}
        self.seen = {self._key(m) for m in first.get("recent", [])}
        self.stalls: list[float] = []
        self.last: dict[str, Any] = first
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = self.client.get("/admin/cluster").json()
        return info

    @staticmethod
    def _key(m: dict[str, Any]) -> tuple[Any, ...]:
        return m.get("request_id"), m.get("src_instance_id"), m.get("end_time")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self._poll()  # the last ones

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):  # a poll that fails is retried on the next tick
                self._poll()

    def _poll(self) -> None:
        self.last = self._info()["migrations"]
        for m in self.last.get("recent", []):
            if self._key(m) in self.seen:
                continue
            self.seen.add(self._key(m))
            print(f"{time.monotonic() - self.t0:6.1f}s  {migration_text(m)}", flush=True)
            if m.get("committed") and m.get("downtime") is not None:
                self.stalls.append(float(m["downtime"]))

    def summary(self, num_done: int) -> str:
        committed = self.last.get("committed", 0) - self.base["committed"]
        aborted = self.last.get("aborted", 0) - self.base["aborted"]
        s = sorted(self.stalls)
        stall = ("no running request moved" if not s else
                 f"stall (downtime) of the {len(s)} running ones: median {1000 * s[len(s) // 2]:.1f} ms, "
                 f"max {1000 * s[-1]:.1f} ms")
        return (f"summary: {committed} migrations committed, {aborted} aborted (a request that ended first, or "
                f"a destination without room); {stall}; {num_done} requests completed")


def migration_text(m: dict[str, Any]) -> str:
    """One migration as the demo prints it."""
    from llumnix.top import outcome

    return f"migration {m.get('request_id')} {m.get('src_instance_id')} -> {m.get('dst_instance_id')} {outcome(m)}"
