"""Two real Ray nodes (``ray start`` processes) on this machine: the head on this host's
address, a second node on 127.0.0.2, token authentication on as Ray sets it up. The
cluster joins by address with one instance per node (a custom resource, one slot on
each); live migrations cross the nodes over tcp and gloo; a second process joins by
address without ``RAY_AUTH_MODE``; the second node dies mid-stream and its requests
finish on the first.

Both nodes are on one machine, over loopback: what crosses "nodes" here is real Ray
node placement and real sockets between different addresses, not a network.

Every engine step of the instances sleeps ``STEP_S`` first (``helpers.sleep_in_steps``, a
Ray worker setup hook): the tiny model makes a token a millisecond, so a 400-token request
used to end within a migration on a loaded machine (at load 10-13 the migration test failed
4 runs in 4, the request finished before the test looked); at ``STEP_S`` it lasts 4 s or more.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

ray = pytest.importorskip("ray")

from llumnix.cluster.startup import free_port  # noqa: E402
from llumnix.core.sampling_params import SamplingParams  # noqa: E402
from llumnix.core.wire import GenerateRequest  # noqa: E402
from tests.cluster.helpers import (  # noqa: E402
    SLOW_STEPS_HOOK,
    STEP_SLEEP_ENV,
    StreamResult,
    running_cluster,
    serve_cluster,
    stream_completion,
    where_is,
)

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SLOT = "llumnix_slot"
SECOND_IP = "127.0.0.2"
PROMPT = [(i * 37 + 11) % 250 for i in range(48)]
N_TOKENS = 450  # the tiny model's context is 512
STEP_S = 0.01  # every step's sleep in the instances (see the module's docstring)
REPO = Path(__file__).resolve().parents[2]


class RayNode:
    """One ``ray start --block`` and everything it starts (raylet, agents, and the
    raylet's workers, which run in process groups of their own)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_started(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    @staticmethod
    def _signal(procs: list[psutil.Process], sig: int) -> None:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):  # psutil checks the pid was not reused
                p.send_signal(sig)

    def kill(self) -> None:
        """The node crashes: every process of it at once (where only the raylet dies, a
        worker outlives it for a while, still serving calls)."""
        self._signal(self._tree(), signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        procs = self._tree()
        self._signal(procs, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._signal(procs + self._tree(), signal.SIGKILL)  # what the SIGTERM left
        self.proc.wait(timeout=30)


@dataclass
class TwoNodes:
    address: str
    head: RayNode
    second: RayNode


def node_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LLUMNIX_MIGRATION_HOST"}
    env["RAY_AUTH_MODE"] = "token"  # a joining `ray start` does not turn it on by itself
    # the nodes' workers can import tests.cluster.helpers (the cluster fixture's step hook)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def two_ray_nodes(slots: tuple[int, int] = (1, 1)) -> Iterator[TwoNodes]:
    """A head (one CPU, ``slots[0]`` instance slots) and a second node on 127.0.0.2,
    both stopped at the end whatever happens."""
    env = node_env()
    # The token Ray makes for a local cluster (~/.ray/auth_token), where there is none yet.
    subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], env=env, capture_output=True, check=True)
    tmp = Path(tempfile.mkdtemp(prefix="llx-", dir="/tmp"))  # short: Ray's socket paths live under it
    port = free_port()
    nodes: list[RayNode] = []
    try:
        nodes.append(RayNode(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "1",
                              "--resources", json.dumps({SLOT: slots[0]}), "--include-dashboard", "false",
                              "--temp-dir", str(tmp)], tmp / "head.log", env))
        nodes[0].wait_started()
        nodes.append(RayNode(["--address", f"127.0.0.1:{port}", "--node-ip-address", SECOND_IP, "--num-cpus", "1",
                              "--resources", json.dumps({SLOT: slots[1]})], tmp / "second.log", env))
        nodes[1].wait_started()
        yield TwoNodes(f"127.0.0.1:{port}", nodes[0], nodes[1])
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes() -> Iterator[TwoNodes]:
    with two_ray_nodes() as n:
        yield n


@pytest.fixture(scope="module")
def cluster(nodes, tiny_model_dir) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        # This process joins as a user's would: no auth mode set, the token in its default place.
        mp.delenv("RAY_AUTH_MODE", raising=False)
        mp.delenv("LLUMNIX_MIGRATION_HOST", raising=False)
        # the instances' steps sleep STEP_S first: read by this process's ray.init (in the launcher)
        mp.setenv("RAY_RUNTIME_ENV_HOOK", SLOW_STEPS_HOOK)
        mp.setenv(STEP_SLEEP_ENV, str(STEP_S))
        with running_cluster(tiny_model_dir, "two-nodes", ray_address=nodes.address, instance_resources={SLOT: 1},
                             scheduling={"rescheduling": {"enabled": False}},
                             replace_lost_instances=False) as c:
            mp.delenv("RAY_RUNTIME_ENV_HOOK")  # not for the processes the tests start
            mp.delenv(STEP_SLEEP_ENV)
            yield c


def kv_hosts(cluster) -> dict[str, str]:
    return {iid: ray.get(a.kv_address.remote(), timeout=30)[0] for iid, a in cluster.instances.items()}


def by_node(cluster) -> tuple[str, str]:
    """(the instance on the head, the one on the second node)."""
    hosts = kv_hosts(cluster)
    second = next(iid for iid, h in hosts.items() if h == SECOND_IP)
    return next(iid for iid in hosts if iid != second), second


def test_one_instance_on_each_node(cluster):
    hosts = kv_hosts(cluster)
    node_ips = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert len(node_ips) == 2 and SECOND_IP in node_ips
    # each instance's KV receiver binds its own node's address
    assert set(hosts.values()) == node_ips, hosts


def test_gloo_advertises_the_node_address_not_loopback(cluster):
    """A sender on the second node offers its peer an address at 127.0.0.2 (the rank's
    gloo address, carried in the rendezvous half the accept call hands over)."""

    @ray.remote(num_cpus=0, resources={f"node:{SECOND_IP}": 0.01})
    def advertised() -> list[bytes]:
        from llumnix.migration.gloo_transport import GlooSender

        seen: list[bytes] = []

        def accept(pair_id: str, offer: dict[str, dict[str, bytes]]) -> dict[str, dict[str, bytes]]:
            seen.extend(v for half in offer.values() for v in half.values())
            raise ConnectionAbortedError("only the address was wanted")

        with contextlib.suppress(ConnectionAbortedError):
            GlooSender(accept, b"t")
        return seen

    halves = ray.get(advertised.remote(), timeout=60)
    assert len(halves) == 2  # urgent and bulk
    assert all(socket.inet_aton(SECOND_IP) in h and socket.inet_aton("127.0.0.1") not in h for h in halves)


class Outputs:
    """Every token of every request from a set of instances, as (index, token), and which
    instance (its place in ``actors``) made each."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self.tokens: dict[str, list[tuple[int, int]]] = {}
        self.made_by: dict[str, dict[int, int]] = {}
        self.finished: set[str] = set()

    def makers(self, rid: str) -> list[int]:
        """The instances that made ``rid``'s tokens, in token order, each run once."""
        order = [a for _, a in sorted(self.made_by[rid].items())]
        return [a for k, a in enumerate(order) if k == 0 or order[k - 1] != a]

    def result(self, rid: str, timeout: float = 120.0) -> list[int]:
        deadline = time.time() + timeout
        while rid not in self.finished:
            assert time.time() < deadline, f"{rid} did not finish"
            for n, a in enumerate(self.actors):
                for o in ray.get(a.get_outputs.remote(0.05), timeout=30):
                    first = o.num_output_tokens - len(o.new_token_ids) + 1
                    self.tokens.setdefault(o.request_id, []).extend((first + k, t) for k, t in enumerate(o.new_token_ids))
                    self.made_by.setdefault(o.request_id, {}).update((first + k, n) for k in range(len(o.new_token_ids)))
                    if o.finish_reason is not None:
                        self.finished.add(o.request_id)
        got = sorted(self.tokens[rid])
        assert [i for i, _ in got] == list(range(1, len(got) + 1)), "a token was lost or repeated"
        return [t for _, t in got]


def add(actor, rid: str, max_tokens: int) -> None:
    req = GenerateRequest(rid, list(PROMPT), SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0,
                          time.monotonic())
    ray.get(actor.add_request.remote(req), timeout=30)


def wait_tokens(actor, rid: str, n: int, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while ray.get(actor.num_output_tokens.remote(rid), timeout=30) < n:
        assert time.time() < deadline, f"{rid} made no progress"
        time.sleep(0.01)


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_migration_across_nodes_and_back_keeps_the_greedy_tokens(cluster, transport):
    here, there = by_node(cluster)
    actors = cluster.instances
    out = Outputs(list(actors.values()))
    place = {iid: n for n, iid in enumerate(actors)}
    t0 = time.monotonic()
    add(actors[here], f"ref-{transport}", 400)
    reference = out.result(f"ref-{transport}")
    assert time.monotonic() - t0 >= 400 * STEP_S, "the steps do not sleep: the request can end within a migration"
    rid = f"x-{transport}"
    add(actors[here], rid, 400)
    for k, (src, dst) in enumerate(((here, there), (there, here))):
        wait_tokens(actors[src], rid, 20 + 40 * k)
        aborts = []
        for _ in range(3):  # an abort (a timeout on a loaded machine) leaves it on the source
            rep = ray.get(actors[src].migrate_request.remote(rid, dst, actors[dst], None, transport), timeout=120)
            if rep["committed"]:
                break
            aborts.append(rep["abort_reason"])
            assert where_is(actors, rid) == src
        assert rep["committed"], aborts
        assert rep["num_stages"] >= 1 and rep["num_bytes"] > 0
        # there, or already finished there (it decodes on through the pre-copy stages: on a
        # loaded machine it can make its last token before this looks)
        where = where_is(actors, rid)
        assert where == dst or (k == 1 and where is None), where
    assert out.result(rid) == reference
    assert out.makers(rid) == [place[here], place[there], place[here]]  # made here, there, and here again


def test_a_process_joins_by_address_without_ray_auth_mode(nodes, cluster, tiny_model_dir):
    """`llumnix gateway --ray-address HOST:PORT` in a fresh process whose environment
    names no auth mode: it finds the token where Ray puts it and serves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    port = free_port()
    proc = subprocess.Popen([str(BIN / "llumnix"), "gateway", "--ray-address", nodes.address, "--namespace",
                             ray.get_runtime_context().namespace, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            with contextlib.suppress(httpx.HTTPError):
                models = httpx.get(f"{url}/v1/models", timeout=2)
                if models.status_code == 200:
                    break
            assert time.monotonic() < deadline, "the gateway did not come up"
            time.sleep(0.3)
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": models.json()["data"][0]["id"], "prompt": "hello", "max_tokens": 5, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_without_a_token_joining_fails_in_one_line_that_names_the_variable(nodes, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token
    p = subprocess.run([str(BIN / "llumnix"), "gateway", "--ray-address", nodes.address, "--port",
                        str(free_port())], env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "RAY_AUTH_TOKEN" in last and nodes.address in last, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def test_the_second_node_dies_mid_stream_and_its_requests_finish_on_the_first(nodes, cluster, tiny_model_dir):
    """Last: it takes the second node down for good."""
    here, there = by_node(cluster)
    body = {"model": cluster.info["model"], "prompt": "one two three four", "max_tokens": N_TOKENS, "ignore_eos": True,
            "temperature": 0}

    async def run(url: str) -> tuple[StreamResult, list[StreamResult], list[str]]:
        async with httpx.AsyncClient(timeout=180) as client:
            reference = await stream_completion(client, url, body)
            progress = [StreamResult() for _ in range(4)]
            tasks = [asyncio.create_task(stream_completion(client, url, body, p)) for p in progress]
            deadline = time.monotonic() + 60
            while not all(p.num_chunks >= 3 for p in progress):
                assert time.monotonic() < deadline, "the streams did not start"
                await asyncio.sleep(0.05)
            placed = [where_is(cluster.instances, p.request_id) for p in progress]
            nodes.second.kill()
            assert not any(p.done for p in progress), "a stream ended before the node was lost"
            return reference, await asyncio.gather(*tasks), [str(x) for x in placed]

    with serve_cluster(cluster, tiny_model_dir) as (url, backend):
        reference, results, placed = asyncio.run(run(url))
        assert backend.failover.num_resumed >= 1 and there not in backend.instances
    assert there in placed, f"no stream was on the second node: {placed}"  # dispatch spreads 4 over 2
    for r in results:
        assert r.done and not r.errors, r
        assert r.completion_tokens == N_TOKENS
        assert r.text == reference.text  # resumed by recompute: the same greedy tokens
    assert ray.get(cluster.instances[here].check_invariants.remote(), timeout=30)["num_requests"] == 0
