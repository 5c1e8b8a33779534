"""``llumnix demo --contrast``: Llumnix against round-robin on two real clusters side by
side. Two `llumnix serve` of 2 instances each start together, one with Llumnix's defaults
(freeness dispatch, live migration) and one with ``--dispatch round-robin --no-migration``,
each with a small KV cache (``--num-blocks``). The same requests go to both, one every
``--every`` seconds for ``--duration`` seconds, alternating long (``--max-tokens``) and
short (8 tokens): round-robin, which counts requests and not their lengths, sends every
long one to the same instance, which fills and preempts; Llumnix dispatches by freeness
and migrates out of the fuller instance. A line is printed per migration and per
preemption on either, then the counts of both."""
from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llumnix.core.errors import LlumnixError

SHORT_TOKENS = 8
SYSTEMS = {"llumnix": (), "round-robin": ("--dispatch", "round-robin", "--no-migration")}


def main_demo_contrast(args: argparse.Namespace) -> int:
    if args.url is not None:
        raise LlumnixError("--contrast starts its own two clusters: --url does not apply")
    if not args.every > 0:
        raise LlumnixError(f"--every must be > 0, got {args.every:g}")
    with _clusters(args) as gateways:
        for name, (url, key) in gateways.items():
            print(f"  {name:<12} {url}/dashboard?key={key}   (llumnix top --url {url} --key {key})", flush=True)
        watch = Watch(gateways)
        stop = threading.Event()
        watcher = threading.Thread(target=watch.loop, args=(stop,), daemon=True)
        watcher.start()
        done = drive(gateways, args)
        time.sleep(1.0)  # the last reports
        stop.set()
        watcher.join(timeout=10)
        watch.poll()
        for name in gateways:
            print(f"summary: {name:<12} {watch.summary(name)}; {done[name]} requests completed", flush=True)
        if args.keep:
            print("still serving both (Ctrl-C stops them)", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    return 0


@contextlib.contextmanager
def _clusters(args: argparse.Namespace) -> Iterator[dict[str, tuple[str, str]]]:
    """Both clusters, started at once (``demo.serve_processes``) and stopped at the end."""
    from llumnix.cluster.startup import free_port
    from llumnix.demo import serve_processes

    folder = Path(tempfile.mkdtemp(prefix="llumnix-contrast-"))
    print(f"starting 2 clusters of 2 instances of {args.model}, Llumnix and round-robin side by side "
          f"(a minute or two on CPU); logs in {folder}", flush=True)
    runs = {name: (args.port + i if args.port else free_port(),
                   ["--model", args.model, "--instances", "2", "--num-gpu-blocks-override", str(args.num_blocks),
                    *flags])
            for i, (name, flags) in enumerate(SYSTEMS.items())}
    with serve_processes(runs, folder) as gateways:
        yield gateways


def drive(gateways: dict[str, tuple[str, str]], args: argparse.Namespace) -> dict[str, int]:
    """The same arrivals to both: one request every ``--every`` s, long and short in turn."""
    import httpx

    done = dict.fromkeys(gateways, 0)
    model = httpx.get(f"{next(iter(gateways.values()))[0]}/v1/models", timeout=30).json()["data"][0]["id"]

    def send(name: str, url: str, n: int) -> None:
        body = {"model": model, "prompt": "Once upon a time,", "max_tokens": n, "ignore_eos": True}
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(f"{url}/v1/completions", json=body, timeout=600).status_code == 200:
                done[name] += 1

    threads: list[threading.Thread] = []
    start, i = time.monotonic(), 0
    while time.monotonic() - start < args.duration:
        n = args.max_tokens if i % 2 == 0 else SHORT_TOKENS
        for name, (url, _) in gateways.items():
            threads.append(threading.Thread(target=send, args=(name, url, n), daemon=True))
            threads[-1].start()
        i += 1
        time.sleep(max(0.0, start + i * args.every - time.monotonic()))
    for t in threads:
        t.join(timeout=600)
    return done


class Watch:
    """Each cluster's ``/admin/cluster``, polled: a line per new migration and per instance
    whose preemption count rose."""

    def __init__(self, gateways: dict[str, tuple[str, str]]) -> None:
        import httpx

        self.clients = {name: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
                        for name, (url, key) in gateways.items()}
        self.t0 = time.monotonic()
        self.seen: set[tuple[Any, ...]] = set()
        self.preempted: dict[tuple[str, str], int] = {}
        self.migrations: dict[str, dict[str, Any]] = {}

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(0.25):
            with contextlib.suppress(Exception):  # a poll that fails is retried on the next tick
                self.poll()

    def poll(self) -> None:
        from llumnix.demo import migration_text

        for name, client in self.clients.items():
            info = client.get("/admin/cluster").json()
            self.migrations[name] = info.get("migrations") or {}
            for m in self.migrations[name].get("recent", []):
                key = (name, m.get("request_id"), m.get("src_instance_id"), m.get("end_time"))
                if key not in self.seen:
                    self.seen.add(key)
                    self._say(name, migration_text(m))
            for inst in info.get("instances", []):
                k2 = (name, inst["instance_id"])
                n, before = int(inst.get("num_preemptions") or 0), self.preempted.get(k2, 0)
                if n > before:
                    self.preempted[k2] = n
                    self._say(name, f"{inst['instance_id']} preempted {n - before} request"
                                    f"{'s' if n - before > 1 else ''} (its KV cache is full: recomputed later)")

    def summary(self, name: str) -> str:
        per = {iid: n for (sys_name, iid), n in sorted(self.preempted.items()) if sys_name == name}
        mig = self.migrations.get(name, {})
        where = ", ".join(f"{iid} {n}" for iid, n in per.items())
        return (f"{sum(per.values())} preemptions{f' ({where})' if where else ''}, "
                f"{mig.get('committed', 0)} migrations committed, {mig.get('aborted', 0)} aborted")

    def _say(self, system: str, text: str) -> None:
        print(f"{time.monotonic() - self.t0:6.1f}s  {system:<12} {text}", flush=True)
