"""Live migration between instance *processes* (Ray actors with a real model):
every transport (tcp, gloo, ray), and real process kills mid-stage.

One Ray session for the module. The copies run with the default, niced bulk path.
"""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from llumnix.core.sampling_params import SamplingParams  # noqa: E402
from llumnix.core.wire import GenerateRequest  # noqa: E402

TOKEN = b"test-processes-token"
ENGINE = {"num_blocks": 256, "block_size": 4, "max_num_seqs": 8}
PROMPT = [(i * 37 + 11) % 250 for i in range(48)]
PAIR_ENGINE = {**ENGINE, "pace": {"model": "a10-llama7b-serving", "scale": 0.5}}
"""The transports' pair holds each step to about 18 ms (``engine/pace.py``): unpaced, the tiny
model's 300 tokens once ended before a loaded CI machine had set up gloo's group, and the
migration found its request finished."""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from llumnix.cluster.llumsched import LlumSchedActor
    from llumnix.policy import ReschedulingConfig, SchedulingConfig
    from tests.tiny_model import save_tiny_llama

    model_dir = tmp_path_factory.mktemp("tiny-migration-model")
    save_tiny_llama(model_dir)
    ray.init(num_cpus=2, include_dashboard=False, namespace=f"test-mig-{time.time_ns()}",
             log_to_driver=False)
    name = f"llumsched-{time.time_ns()}"
    sched = LlumSchedActor.options(name=name, num_cpus=0).remote(
        SchedulingConfig(rescheduling=ReschedulingConfig(enabled=False)), None, reschedule_interval_s=3600)
    ray.get(sched.cluster_info.remote(), timeout=60)
    yield {"model": str(model_dir), "llumsched": name, "sched": sched}
    ray.shutdown()


def start(session, iid, model=None, engine=None, migration=None):
    from llumnix.cluster.instance_actor import InstanceActor
    from llumnix.config.sections import LiveMigrationConfig

    actor = InstanceActor.options(num_cpus=0).remote(
        iid, model or session["model"], dict(engine or ENGINE), None, session["llumsched"], 1, TOKEN,
        LiveMigrationConfig(**(migration or {})))
    ray.get(actor.ready.remote(), timeout=180)
    return actor


def add(actor, rid, max_tokens, prompt=PROMPT):
    req = GenerateRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens), 0, time.monotonic())
    ray.get(actor.add_request.remote(req), timeout=30)


def wait_tokens(actor, rid, n, timeout=60.0):
    deadline = time.time() + timeout
    while ray.get(actor.num_output_tokens.remote(rid), timeout=30) < n:
        assert time.time() < deadline, f"{rid} made no progress"
        time.sleep(0.01)


class Collector:
    """Every output of every request from a set of actors, as (index, token)."""

    def __init__(self, *actors):
        self.actors = list(actors)
        self.tokens: dict[str, list[tuple[int, int]]] = {}
        self.finished: set[str] = set()

    def poll(self, timeout=0.05):
        for a in self.actors:
            try:
                outs = ray.get(a.get_outputs.remote(timeout), timeout=30)
            except ray.exceptions.RayActorError:
                continue  # killed on purpose
            for o in outs:
                self.tokens.setdefault(o.request_id, []).extend(
                    (o.num_output_tokens - len(o.new_token_ids) + 1 + k, t) for k, t in enumerate(o.new_token_ids))
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)

    def result(self, rid, timeout=120.0):
        deadline = time.time() + timeout
        while rid not in self.finished:
            assert time.time() < deadline, f"{rid} did not finish"
            self.poll()
        got = sorted(self.tokens[rid])
        assert [i for i, _ in got] == list(range(1, len(got) + 1)), "a token was lost or repeated"
        return [t for _, t in got]


def drained(actor, timeout=30.0):
    """Block accounting is exact and every block is free again (checked at a step boundary)."""
    deadline = time.time() + timeout
    while True:
        counts = ray.get(actor.check_invariants.remote(), timeout=30)
        if counts["num_used_blocks"] == 0 and counts["num_requests"] == 0:
            return counts
        assert time.time() < deadline, f"not drained: {counts}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pair(session):
    src, dst = start(session, "p-src", engine=PAIR_ENGINE), start(session, "p-dst", engine=PAIR_ENGINE)
    col = Collector(src, dst)
    add(src, "ref", 300)
    reference = col.result("ref")
    return src, dst, col, reference


@pytest.mark.parametrize("transport", ["tcp", "gloo", "ray"])
def test_migrated_request_between_processes_gives_the_same_greedy_tokens_once(pair, transport):
    src, dst, col, reference = pair
    rid = f"mig-{transport}"
    add(src, rid, 300)
    wait_tokens(src, rid, 20)
    rep = ray.get(src.migrate_request.remote(rid, "p-dst", dst, None, transport), timeout=120)
    assert rep["committed"], rep["abort_reason"]
    assert rep["num_stages"] >= 2 and rep["downtime"] is not None and rep["downtime"] > 0
    assert col.result(rid) == reference
    drained(src)
    drained(dst)


PACED = {"timeout_s": 2.0,  # the destination frees an uncommitted reservation after 2 x 2 s
         "transport_options": {"bulk_rate_bytes_per_s": 5_000, "chunk_bytes": 1024, "timeout_s": 10.0}}


def wait_reserved(actor, timeout=30.0):
    deadline = time.time() + timeout
    while ray.get(actor.check_invariants.remote(), timeout=30)["num_used_blocks"] == 0:
        assert time.time() < deadline, "the destination never reserved blocks"
        time.sleep(0.02)


def test_source_process_killed_mid_stage_destination_frees_everything(session):
    src, dst = start(session, "ks-src", migration=PACED), start(session, "ks-dst", migration=PACED)
    add(src, "x", 400)
    wait_tokens(src, "x", 10)
    ref = src.migrate_request.remote("x", "ks-dst", dst)
    wait_reserved(dst)
    time.sleep(0.5)  # mid-stage: the paced bulk copy takes seconds
    ray.kill(src)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(ref, timeout=60)
    counts = drained(dst, timeout=20)  # the watchdog freed the orphaned reservation
    assert counts["num_free_blocks"] == counts["num_total_blocks"]
    assert ray.get(dst.num_output_tokens.remote("x"), timeout=30) == -1  # never installed here
    col = Collector(dst)  # the survivor still serves
    add(dst, "after", 20)
    assert len(col.result("after")) == 20
    drained(dst)


def test_destination_process_killed_mid_stage_request_completes_once_on_the_source(session, pair):
    reference = pair[3]
    src, dst = start(session, "kd-src", migration=PACED), start(session, "kd-dst", migration=PACED)
    col = Collector(src)
    add(src, "x", 300)
    wait_tokens(src, "x", 10)
    ref = src.migrate_request.remote("x", "kd-dst", dst)
    wait_reserved(dst)
    time.sleep(0.5)
    ray.kill(dst)
    rep = ray.get(ref, timeout=60)
    assert not rep["committed"] and "TransportError" in rep["abort_reason"]
    assert col.result("x") == reference  # every token once, as if never migrated
    drained(src)


@pytest.mark.slow
def test_smollm2_migrated_over_every_transport_matches_the_unmigrated_greedy_output(session):
    """The real default model in two processes: tcp there, gloo back, ray there again."""
    engine = {"kv_cache_bytes": 64 * 2**20, "max_num_seqs": 4}
    a = start(session, "s-a", model="smollm2", engine=engine)
    b = start(session, "s-b", model="smollm2", engine=engine)
    col = Collector(a, b)
    prompt = [(i * 7919) % 20000 + 100 for i in range(200)]
    add(a, "ref", 120, prompt)
    reference = col.result("ref", timeout=300)
    add(a, "x", 120, prompt)
    holder, names = (a, "s-a"), {"s-a": a, "s-b": b}
    for k, transport in enumerate(("tcp", "gloo", "ray")):
        wait_tokens(holder[0], "x", 10 + 25 * k, timeout=120)
        other = "s-b" if holder[1] == "s-a" else "s-a"
        rep = ray.get(holder[0].migrate_request.remote("x", other, names[other], None, transport), timeout=120)
        assert rep["committed"], (transport, rep["abort_reason"])
        holder = (names[other], other)
    assert col.result("x", timeout=300) == reference
    drained(a)
    drained(b)
