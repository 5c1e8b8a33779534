"""Strangers at our ports (issue 43, points 3 and 4): ``--num`` unauthenticated
connections to one instance's request channel and as many to another's KV receiver,
half held idle and half trickling a byte each ``--trickle-s``, every one reopened as soon
as the server closes it, from ``--sources`` addresses of 127/8 (so both the per-address
and the total cap are hit). Meanwhile a gateway's line opens and serves a request on the
attacked channel, and a running request live-migrates into the attacked receiver over a
sender connected during the flood; then the source instance is drained (``--drain-requests``
running requests, each live-migrated out over a sender connected during the flood, until
its status says drained). The same checks run first without strangers.

Reports, for the process that holds both instances: threads and RSS before and at peak,
each gate's counts (waiting, closed at the deadline or for a cap), and whether each
request and migration completed, with times. The attackers run in their own processes
(one per port, each holding ``--num`` sockets).

    PYTHONPATH=src python benchmarks/hostile_ports.py --num 10000 --out /tmp/hostile
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TOKEN = b"hostile-ports-bench-token-000000"


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- the attacker (its own process) ---------------------------------------------------

def _open(address: tuple[str, int], source: str) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.settimeout(2.0)
        s.connect(address)
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        return None


def _alive(s: socket.socket, trickle: bool) -> bool:
    try:
        if trickle:
            s.send(b"x")
        while True:  # drain what the server sent (its greeting); b"" means it closed us
            if not s.recv(4096):
                return False
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def attack(address: tuple[str, int], num: int, trickle_s: float, sources: int, hold_s: float) -> dict[str, Any]:
    """Open ``num`` connections, say "ready", then keep them for ``hold_s``: reopen closed ones
    and trickle a byte on the odd ones every ``trickle_s``."""
    raise_fd_limit(num + 256)
    src = [f"127.0.0.{2 + k}" for k in range(sources)]
    socks: list[socket.socket | None] = [_open(address, src[i % sources]) for i in range(num)]
    opened = sum(s is not None for s in socks)
    print(f"ready {opened}", flush=True)
    reopened = passes = 0
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        t0 = time.monotonic()
        for i, s in enumerate(socks):
            if s is not None and _alive(s, trickle=i % 2 == 1):
                continue
            if s is not None:
                s.close()
            socks[i] = _open(address, src[i % sources])
            reopened += socks[i] is not None
        passes += 1
        time.sleep(max(0.0, trickle_s - (time.monotonic() - t0)))
    held = sum(s is not None and _alive(s, False) for s in socks)
    return {"opened": opened, "reopened": reopened, "passes": passes, "open_at_end": held}


# -- the instances --------------------------------------------------------------------

def make_instance(iid: str, step_s: float) -> Any:
    from tests.engine.helpers import make_engine

    from llumnix.cluster.instance import InstanceServer
    from llumnix.core.clock import WallClock
    from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig

    eng = make_engine(num_blocks=1024, instance_id=iid)  # room for a drain's requests on either side
    eng.clock = WallClock()
    run = eng.executor.execute

    def slow(batch: Any) -> Any:
        time.sleep(step_s)  # a step takes time, so a migration finds its request running
        return run(batch)

    eng.executor.execute = slow
    srv = InstanceServer(eng, Llumlet(iid, eng, ReschedulingConfig(), FreenessConfig()))
    srv.start()
    return srv


class Cluster:
    """Two instances in this process: ``src`` with a request channel, ``dst`` with a KV receiver."""

    def __init__(self, step_s: float) -> None:
        from llumnix.cluster.channel import ChannelServer
        from llumnix.migration.destination import DestinationEndpoint
        from llumnix.migration.transport import TransportOptions

        self.options = TransportOptions(bulk_nice=0, bulk_idle=False, timeout_s=10.0)
        self.src, self.dst = make_instance("src", step_s), make_instance("dst", step_s)
        self.channel = ChannelServer(self.src, TOKEN, self._add)
        self.endpoint = DestinationEndpoint(self.dst, TOKEN, reservation_timeout_s=5.0, options=self.options)

    def _add(self, req: Any) -> Any:
        srv = self.src
        return srv.run_at_boundary(lambda: srv.engine.add_request(req.request_id, req.prompt_token_ids,
                                                                  req.params, client=req.client))

    def gates(self) -> dict[str, dict[str, int]]:
        return {name: {"pending": g.num_pending, "expired": g.num_expired, "evicted": g.num_evicted,
                       "refused": g.num_refused, "proven": g.num_proven}
                for name, g in (("channel", self.channel.gate), ("kv_receiver", self.endpoint.receiver.gate))}

    def close(self) -> None:
        self.channel.close()
        self.endpoint.close()
        self.src.stop()
        self.dst.stop()


def serve_request(cluster: Cluster, rid: str) -> dict[str, Any]:
    """A gateway's line opened during the flood, one 16-token request through it."""
    from llumnix.cluster.link import InstanceLink
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.core.wire import GenerateRequest

    class Sink:
        def __init__(self) -> None:
            self.tokens: list[int] = []
            self.done = asyncio.Event()

        def on_outputs(self, _iid: str, outputs: list[Any]) -> None:
            for o in outputs:
                if o.request_id != rid:  # an earlier line's, not acknowledged, sent again
                    continue
                self.tokens += o.new_token_ids
                if o.is_finished:
                    self.done.set()

        def on_statuses(self, _iid: str, _statuses: list[Any]) -> None:
            pass

        def on_add_result(self, _iid: str, request_id: str, error: BaseException | None) -> None:
            if request_id == rid and error is not None:
                self.done.set()

    async def main() -> dict[str, Any]:
        sink = Sink()
        t0 = time.monotonic()
        link = InstanceLink("src", cluster.channel.address, TOKEN, "gw", sink)
        await link.open(timeout_s=10.0)
        opened = time.monotonic() - t0
        runner = asyncio.create_task(link.run())
        link.add(GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=16), 0, 0.0, client="gw"))
        await asyncio.wait_for(sink.done.wait(), 30.0)
        link.close()
        await asyncio.gather(runner, return_exceptions=True)
        return {"completed": len(sink.tokens) == 16, "open_s": round(opened, 4),
                "total_s": round(time.monotonic() - t0, 4)}

    try:
        return asyncio.run(main())
    except (OSError, ConnectionError, TimeoutError) as e:
        return {"completed": False, "error": repr(e)}


def migrate_request(cluster: Cluster, rid: str) -> dict[str, Any]:
    """A sender connected during the flood (as a drain's first migration to a destination
    connects), then a running request live-migrated through it and stopped where it is."""
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.migration import MigrationConfig
    from llumnix.migration.driver import migrate
    from llumnix.migration.tcp_transport import KVSender, TransportError

    src, dst = cluster.src, cluster.dst
    t0 = time.monotonic()
    try:
        sender = KVSender(cluster.endpoint.address, TOKEN, cluster.options)
    except TransportError as e:
        return {"committed": False, "error": repr(e), "connect_s": round(time.monotonic() - t0, 4)}
    connected = time.monotonic() - t0
    src.call(lambda: src.engine.add_request(rid, list(range(1, 60)), SamplingParams(max_tokens=1000)))
    time.sleep(0.1)
    t1 = time.monotonic()
    try:
        rep = migrate(rid, src, cluster.endpoint, sender, MigrationConfig(max_stages=3))
    finally:
        sender.close()
    migrated = time.monotonic() - t1
    for srv in (src, dst):
        srv.call(lambda srv=srv: srv.engine.abort_request(rid))
    return {"committed": rep.committed, "abort_reason": rep.abort_reason, "connect_s": round(connected, 4),
            "migrate_s": round(migrated, 4), "downtime_s": rep.downtime}


def drain(cluster: Cluster, tag: str, num_requests: int, attackers: list[subprocess.Popen[str]]) -> dict[str, Any]:
    """A drain as LlumSched runs one, on the source: marked terminating, then each request
    on it live-migrated to the destination, one after another, over a sender connected
    during the flood (reconnected if a migration breaks it), until its status says drained
    (``policy.rounds.is_drained``: no request, no migration in or out). Every migration must
    commit; a request that finished before its turn would not count as one."""
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.migration import MigrationConfig
    from llumnix.migration.driver import migrate
    from llumnix.migration.tcp_transport import KVSender, TransportError
    from llumnix.policy.rounds import is_drained

    src, dst = cluster.src, cluster.dst
    rids = [f"{tag}-drain-{k}" for k in range(num_requests)]
    for rid in rids:
        src.call(lambda rid=rid: src.engine.add_request(rid, list(range(1, 21)), SamplingParams(max_tokens=1000)))
    time.sleep(0.1)
    src.call(lambda: setattr(src.llumlet, "is_terminating", True))
    t0 = time.monotonic()
    connects: list[float] = []
    reports: list[dict[str, Any]] = []
    sender = None
    try:
        while time.monotonic() - t0 < 120 and not is_drained(status := src.status()):
            if sender is None:
                t1 = time.monotonic()
                try:
                    sender = KVSender(cluster.endpoint.address, TOKEN, cluster.options)
                finally:
                    connects.append(round(time.monotonic() - t1, 4))
            rid = (status.running or status.waiting)[0].request_id
            rep = migrate(rid, src, cluster.endpoint, sender, MigrationConfig(max_stages=3))
            reports.append({"request_id": rid, "committed": rep.committed, "abort_reason": rep.abort_reason,
                            "downtime_s": rep.downtime})
            if not rep.committed and (rep.abort_reason or "").startswith("TransportError"):
                sender.close()
                sender = None
    except TransportError as e:
        reports.append({"committed": False, "abort_reason": repr(e)})
    finally:
        if sender is not None:
            sender.close()
    drained_s = time.monotonic() - t0
    drained = is_drained(src.status())
    flooded = bool(attackers) and all(p.poll() is None for p in attackers)  # the flood outlasted the drain
    src.call(lambda: setattr(src.llumlet, "is_terminating", False))
    for srv in (src, dst):
        for rid in rids:
            srv.call(lambda srv=srv, rid=rid: srv.engine.abort_request(rid))
    committed = [r for r in reports if r["committed"]]
    return {"num_requests": num_requests, "drained": drained, "drain_s": round(drained_s, 4),
            "num_committed": len(committed), "num_aborted": len(reports) - len(committed),
            "all_moved_by_migration": drained and {r["request_id"] for r in committed} == set(rids),
            "connect_s": connects, "flood_held_throughout": flooded,
            "downtime_max_s": max((r["downtime_s"] for r in committed), default=None),
            "aborts": [r for r in reports if not r["committed"]]}


class Sampler:
    """This process's threads and RSS, every 50 ms: the peak of each."""

    def __init__(self) -> None:
        self.peak_threads = self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> tuple[int, int]:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
        return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            threads, rss = self.now()
            self.peak_threads, self.peak_rss = max(self.peak_threads, threads), max(self.peak_rss, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def checks(cluster: Cluster, tag: str, rounds: int) -> list[dict[str, Any]]:
    out = []
    for k in range(rounds):
        out.append({"request": serve_request(cluster, f"{tag}-req-{k}"),
                    "migration": migrate_request(cluster, f"{tag}-mig-{k}")})
    return out


def start_attackers(args: argparse.Namespace, cluster: Cluster) -> list[subprocess.Popen[str]]:
    procs = []
    for address in (cluster.channel.address, cluster.endpoint.address):
        cmd = [sys.executable, __file__, "--attack", f"{address[0]}:{address[1]}", "--num", str(args.num),
               "--trickle-s", str(args.trickle_s), "--sources", str(args.sources), "--hold-s", str(args.hold_s)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("ready"):
            raise SystemExit(f"an attacker did not start: {line!r}")
    return procs


def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit(4096)
    cluster = Cluster(args.step_s)
    try:
        idle_threads, idle_rss = Sampler.now()
        baseline = checks(cluster, "base", 1)
        baseline_drain = drain(cluster, "base", args.drain_requests, [])
        before_threads, before_rss = Sampler.now()
        sampler = Sampler()
        t0 = time.monotonic()
        attackers = start_attackers(args, cluster)
        opened_s = time.monotonic() - t0
        time.sleep(args.settle_s)  # the flood in full: trickles going, closed ones reopened
        under = checks(cluster, "attack", args.rounds)
        under_drain = drain(cluster, "attack", args.drain_requests, attackers)
        gates = cluster.gates()
        stats = []
        for p in attackers:
            out, _ = p.communicate(timeout=args.hold_s + 120)
            stats.append(json.loads(out.strip().splitlines()[-1]))
        sampler.stop()
        after_threads, after_rss = Sampler.now()
    finally:
        cluster.close()
    return {
        "settings": vars(args), "attack_open_s": round(opened_s, 2), "attackers": stats,
        "threads": {"idle": idle_threads, "before": before_threads, "peak": sampler.peak_threads,
                    "after": after_threads},
        "rss_mib": {"idle": round(idle_rss / 2**20, 1), "before": round(before_rss / 2**20, 1),
                    "peak": round(sampler.peak_rss / 2**20, 1), "after": round(after_rss / 2**20, 1)},
        "gates": gates, "baseline": baseline, "under_attack": under,
        "drain": {"baseline": baseline_drain, "under_attack": under_drain},
        "all_completed": all(c["request"]["completed"] and c["migration"]["committed"] for c in under)
        and under_drain["all_moved_by_migration"] and under_drain["flood_held_throughout"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num", type=int, default=10_000, help="strangers per port")
    p.add_argument("--trickle-s", type=float, default=1.0, help="each trickler's byte, and each reopen pass")
    p.add_argument("--sources", type=int, default=100, help="source addresses (127.0.0.2 up)")
    p.add_argument("--hold-s", type=float, default=70.0, help="how long the attackers hold on")
    p.add_argument("--settle-s", type=float, default=5.0, help="flood time before the checks")
    p.add_argument("--rounds", type=int, default=3, help="requests and migrations under attack")
    p.add_argument("--step-s", type=float, default=0.01, help="an engine step's time")
    p.add_argument("--drain-requests", type=int, default=3, help="running requests the drain moves")
    p.add_argument("--out", default=None, help="folder for the JSON (default: llumnix-results/)")
    p.add_argument("--attack", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.attack:
        host, port = args.attack.rsplit(":", 1)
        print(json.dumps(attack((host, int(port)), args.num, args.trickle_s, args.sources, args.hold_s)))
        return
    from llumnix.bench.machine import RESULTS_DIR, machine_info, write_result

    res = {"machine": machine_info(with_torch=False), **run(args)}
    path = Path(args.out or RESULTS_DIR) / f"hostile_ports-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_result(path, res)
    summary = {k: res[k] for k in ("threads", "rss_mib", "gates", "drain", "all_completed")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
