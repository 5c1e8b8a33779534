"""A real cluster: Ray actors, LlumSched, the FastAPI gateway over HTTP (uvicorn)."""
from __future__ import annotations

import asyncio
import gc
import http.client
import json
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.cluster.helpers import ADMIN, running_cluster, serve_cluster, wait_idle

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, redis_url):
    # prefix caching, prefix affinity (the index forgetting what the engines evict), the
    # selection by blocks freed and chunked prefill, as `llumnix serve` runs by default (a
    # smaller budget than serve's, so this model's prompts are chunked too)
    engine = {"num_blocks": 512, "enable_prefix_caching": True, "chunked_prefill": True,
              "max_num_batched_tokens": 64}
    scheduling = {"dispatch": {"params": {"prefix": True}, "prefix_evictions": True},
                  "rescheduling": {"selection": "freed"}}
    with running_cluster(tiny_model_dir, "test", instances=2, cms=redis_url, engine=engine,
                         scheduling=scheduling) as c:
        yield c


def test_completions_over_http_through_the_cluster(server):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 8,
                                                   "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8


def test_concurrent_streams_spread_over_instances_and_complete(server, cluster):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]

    async def one(i: int) -> int:
        async with httpx.AsyncClient(timeout=60) as c, c.stream(
                "POST", f"{url}/v1/completions",
                json={"model": name, "prompt": f"request {i}", "max_tokens": 12, "ignore_eos": True,
                      "stream": True, "stream_options": {"include_usage": True}}) as r:
            chunks = [json.loads(ln[6:]) async for ln in r.aiter_lines()
                      if ln.startswith("data: ") and ln != "data: [DONE]"]
        return chunks[-1]["usage"]["completion_tokens"]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(8)))

    before = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["num_dispatched"]
    assert asyncio.run(main()) == [12] * 8
    info = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
    assert info["num_dispatched"] - before == 8
    assert all(i["age_s"] < 5 for i in info["instances"])
    # every instance got work, and every block came back
    time.sleep(0.3)
    statuses = ray.get([a.status.remote() for a in cluster.instances.values()])
    assert all(s.num_used_blocks == 0 for s in statuses)


def test_a_repeated_prompt_goes_back_to_its_cached_prefix(server, cluster):
    """The prompt's tokens reach LlumSched's prefix index, and the repeat reads the first
    one's blocks from the cache of the instance it went to (the answer's usage says so)."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    before = {i["instance_id"]: i["prefix_blocks_sent"] for i in httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["instances"]}
    body = {"model": name, "prompt": "a long shared prefix " * 12, "max_tokens": 4, "ignore_eos": True,
            "temperature": 0}
    first = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    info = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
    assert info["prefix_affinity"] is True
    grown = {i["instance_id"]: i["prefix_blocks_sent"] - before[i["instance_id"]] for i in info["instances"]}
    n_prompt = first["usage"]["prompt_tokens"]
    assert sorted(grown.values()) == [0, n_prompt // 4]  # every full 4-token block, on one instance
    again = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (n_prompt - 1) // 4 * 4


def test_two_gateways_on_one_cluster_each_get_all_of_their_own_tokens(server, cluster, tiny_model_dir):
    """Gateways sharing instances (several front ends, one cluster) never read each
    other's outputs: every stream on both completes whole."""
    url_a, _ = server
    with serve_cluster(cluster, tiny_model_dir) as (url_b, backend_b):
        assert backend_b.client_id != server[1].client_id
        name = httpx.get(f"{url_a}/v1/models").json()["data"][0]["id"]

        async def one(url: str, i: int) -> int:
            async with httpx.AsyncClient(timeout=60) as c:
                r = await c.post(f"{url}/v1/completions", json={
                    "model": name, "prompt": f"gateway test {i}", "max_tokens": 16, "ignore_eos": True})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"]

        async def main():
            return await asyncio.gather(*(one(url_a if i % 2 else url_b, i) for i in range(8)))

        assert asyncio.run(main()) == [16] * 8


def test_llumnix_gateway_joins_a_running_cluster_and_leaves_it_running(server, cluster):
    """`llumnix gateway` (its own process) attaches to the cluster by its Ray address and
    namespace, serves through the same LlumSched, and stopping it stops nothing else."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    ctx = ray.get_runtime_context()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "gateway", "--ray-address", ctx.gcs_address,
                             "--namespace", ctx.namespace, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240  # a loaded 2-core machine: import, Ray connect, tokenizer
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "the gateway did not answer /health in 240 s"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        # Gateways dispatch by themselves (over their own channels to the instances):
        # the joined one counts its dispatch, over the very instances the first serves.
        before = httpx.get(f"{url}/admin/cluster").json()
        r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "joined", "max_tokens": 9,
                                                      "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 9
        after = httpx.get(f"{url}/admin/cluster").json()
        assert after["num_dispatched"] == before["num_dispatched"] + 1
        first = httpx.get(f"{server[0]}/admin/cluster", headers=ADMIN).json()
        assert after["gateway"]["instances"] == first["gateway"]["instances"]
        assert after["gateway"]["channels"] == first["gateway"]["instances"]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the gateway dumps every thread's stack
            time.sleep(2)
            proc.kill()
            pytest.fail("the gateway did not stop within 30 s of SIGTERM:\n" + proc.communicate()[0][-20000:])
    r = httpx.post(f"{server[0]}/v1/completions", json={"model": name, "prompt": "still here", "max_tokens": 4,
                                                        "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_bad_request_never_reaches_an_instance(server):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", json={"model": "x", "prompt": "hi"})
    assert r.status_code == 404
    r = httpx.post(f"{url}/v1/completions", json={"model": httpx.get(f"{url}/v1/models").json()["data"][0]["id"],
                                                  "prompt": "hi" * 600, "max_tokens": 5})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_n_choices_sample_as_seeded_single_requests_and_a_hang_up_frees_them_all(server, cluster):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    base = {"model": name, "prompt": "many ways", "max_tokens": 12, "temperature": 1, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json={**base, "seed": 11, "n": 3}, timeout=60).json()
    singles = [httpx.post(f"{url}/v1/completions", json={**base, "seed": 11 + i}, timeout=60).json()
               ["choices"][0]["text"] for i in range(3)]
    assert [c["text"] for c in r["choices"]] == singles and r["usage"]["completion_tokens"] == 36
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                      json={**base, "max_tokens": 450, "n": 3, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                break  # the first token of one choice; hang up on all three
    counts = wait_idle(cluster.instances, timeout=10)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts


def _aborted(url: str) -> float:
    lines = [ln for ln in httpx.get(f"{url}/metrics").text.splitlines()
             if ln.startswith("llumnix:requests_aborted_total")]
    return float(lines[0].split()[-1]) if lines else 0.0


def _finished(url: str) -> dict[str, float]:
    """Requests the gateway finished, by finish reason."""
    out: dict[str, float] = {}
    for ln in httpx.get(f"{url}/metrics").text.splitlines():
        if ln.startswith("vllm:request_success_total{"):
            reason = ln.split('finished_reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0.0) + float(ln.split()[-1])
    return out


def test_a_client_that_gives_up_on_a_non_streamed_request_stops_it(server, cluster):
    """Nothing is sent before a non-streamed answer is complete, so a client's timeout is
    seen only as its disconnect: all its choices must stop then, not run to the end. The
    client closes its connection as soon as its four choices run on the instances: a
    client timeout is the same close, but at a fixed time the engine's speed races (at
    0.3 s, one choice of 480 tokens once finished first)."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    before, finished_before = _aborted(url), _finished(url)
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=10)
    # The gateway runs in this process, which carries the whole suite's heap: a full garbage
    # collection while the choices run would hold its loop (not a served gateway's).
    # Collect now and keep what exists out of later collections.
    gc.collect()
    gc.freeze()
    try:
        conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"}, body=json.dumps({
            "model": name, "prompt": "patience", "max_tokens": 480, "ignore_eos": True, "n": 4}))
        running, deadline = 0, time.monotonic() + 10
        while running < 4 and time.monotonic() < deadline:
            running = sum(c["num_requests"] for c in ray.get(
                [a.check_invariants.remote() for a in cluster.instances.values()], timeout=10))
        conn.close()  # the client gives up: nothing was read
    finally:
        gc.unfreeze()
    assert running == 4, running
    counts = wait_idle(cluster.instances, timeout=10)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts
    deadline = time.monotonic() + 5  # the gateway counts an abort when its choice's stream ends
    while _aborted(url) - before < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    # (a choice that ended otherwise is counted by its finish reason: say which, if any)
    assert _aborted(url) - before == 4, {k: v - finished_before.get(k, 0.0) for k, v in _finished(url).items()}


def test_scoring_a_prompt_with_echo_gives_the_logprobs_its_generation_had(server):
    """Eval harnesses score text with echo, max_tokens 0 and logprobs. Score a prompt plus
    the greedy continuation the cluster generated for it: the continuation's tokens must
    come back with the logprobs and top alternatives they were generated with."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    prompt = [5, 17, 42, 99, 3, 61]
    gen = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": name, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "logprobs": 2, "return_tokens_as_token_ids": True}).json()["choices"][0]["logprobs"]
    continuation = [int(t.removeprefix("token_id:")) for t in gen["tokens"]]
    scored = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": name, "prompt": prompt + continuation, "max_tokens": 0,
        "echo": True, "logprobs": 2, "return_tokens_as_token_ids": True}).json()
    choice = scored["choices"][0]
    lp = choice["logprobs"]
    assert scored["usage"]["completion_tokens"] == 0 and choice["finish_reason"] == "length"
    assert len(lp["tokens"]) == len(prompt) + 8 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][len(prompt):] == gen["tokens"]
    for mine, theirs in zip(lp["token_logprobs"][len(prompt):], gen["token_logprobs"], strict=True):
        assert abs(mine - theirs) < 1e-3, (mine, theirs)
    for mine, theirs in zip(lp["top_logprobs"][len(prompt):], gen["top_logprobs"], strict=True):
        assert mine.keys() == theirs.keys()
    assert lp["tokens"][:len(prompt)] == [f"token_id:{t}" for t in prompt]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    # streamed, with a continuation: the prompt's chunk carries the same logprobs, and the
    # generated tokens' offsets go on from the prompt's
    both = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": name, "prompt": prompt + continuation, "max_tokens": 3, "echo": True, "logprobs": 2,
        "temperature": 0, "ignore_eos": True}).json()["choices"][0]
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={
            "model": name, "prompt": prompt + continuation, "max_tokens": 3, "echo": True, "logprobs": 2,
            "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        chunks = [json.loads(ln[6:])["choices"][0] for ln in r.iter_lines() if ln.startswith("data: {")]
    assert "".join(c["text"] for c in chunks) == both["text"]
    for key in ("tokens", "text_offset"):
        assert [x for c in chunks for x in c["logprobs"][key]] == both["logprobs"][key]
    streamed = [x for c in chunks for x in c["logprobs"]["token_logprobs"]]
    assert streamed[0] is None and both["logprobs"]["token_logprobs"][0] is None
    assert all(abs(a - b) < 1e-4 for a, b in zip(streamed[1:], both["logprobs"]["token_logprobs"][1:], strict=True))
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "logprobs": True,
        "top_logprobs": 2, "return_tokens_as_token_ids": True}).json()["choices"][0]["logprobs"]["content"]
    assert len(chat) == 3 and all(e["token"].startswith("token_id:") and len(e["top_logprobs"]) == 2
                                  and all(a["token"].startswith("token_id:") for a in e["top_logprobs"])
                                  for e in chat)


def test_statuses_reach_the_shared_redis_meta_store(server, redis_url):
    from llumnix.cluster.meta_store import RedisMetaStore

    statuses = RedisMetaStore(redis_url).all_statuses()
    assert set(statuses) == {"instance-0", "instance-1"}
    assert all(time.time() - s.timestamp < 10 for s in statuses.values())


def test_client_disconnect_aborts_and_frees_kv(server, cluster):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                      json={"model": name, "prompt": "bye", "max_tokens": 450, "ignore_eos": True,
                            "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # got the first token; hang up
    counts = wait_idle(cluster.instances, timeout=10)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts
    assert "llumnix:requests_aborted_total" in httpx.get(f"{url}/metrics").text
    aborted = [ln for ln in httpx.get(f"{url}/metrics").text.splitlines()
               if ln.startswith("llumnix:requests_aborted_total")]
    assert aborted and float(aborted[0].split()[-1]) >= 1


def test_health(server):
    url, _ = server
    h = httpx.get(f"{url}/health").json()
    assert h["status"] == "ok" and all(h["instances"].values())


POISON = [{"temperature": 0.7, "top_p": 1e-300}, {"temperature": 1e-45}, {"temperature": 5e-324},
          {"temperature": 0.7, "top_p": 1e-46}, {"temperature": 0.7, "repetition_penalty": 1e-40},
          {"temperature": 0.7, "repetition_penalty": 1e-300}]


def test_no_sampling_values_take_an_instance_down(server):
    """Issue 28's critical finding: each of these killed the step loop of every instance in
    turn (the gateway resumed the request on the next), leaving the cluster at 503."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    for extra in POISON:
        r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "Hello hello hello", "max_tokens": 4,
                                                      "seed": 1, "ignore_eos": True, **extra}, timeout=60)
        assert r.status_code == 200, (extra, r.text)
        assert r.json()["usage"]["completion_tokens"] == 4
    h = httpx.get(f"{url}/health").json()
    assert h["status"] == "ok" and all(h["instances"].values())


def test_gateway_falls_back_when_llumsched_does_not_answer(server):
    url, backend = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    real = backend.llumsched

    class Dead:
        class dispatch:  # noqa: N801 - mimics an actor method
            @staticmethod
            def remote(*a, **kw):
                raise ray.exceptions.RayActorError()

        cluster_info = real.cluster_info

    backend.llumsched = Dead()
    gs = backend.gs
    try:
        # Dispatch is the gateway's own (over its channels): LlumSched is not on the path.
        local, fallback = backend.num_local_dispatches, backend.num_fallback_dispatches
        r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 200
        assert (backend.num_local_dispatches, backend.num_fallback_dispatches) == (local + 1, fallback)
        # A gateway without dispatch state (LlumSched was away when it started) falls back.
        backend.gs = None
        t0 = time.time()
        r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 200 and backend.num_fallback_dispatches >= 1
        assert time.time() - t0 < 10
    finally:
        backend.llumsched = real
        backend.gs = gs


def test_silent_unresponsive_instance_is_marked_unschedulable(cluster):
    """The health-check pull, on a LlumSched with a stub instance that never answers (in
    the module cluster's Ray session: without one, ``@ray.remote`` would start a session
    nobody shuts down, and the next module's ``ray.init`` fails)."""
    from llumnix.cluster.llumsched import LlumSchedActor
    from llumnix.core.status import InstanceStatus
    from llumnix.policy import DispatchRequest

    @ray.remote(num_cpus=0)
    class Frozen:
        def health(self) -> bool:
            time.sleep(60)
            return True

    sched = LlumSchedActor.options(num_cpus=0).remote(None, None, reschedule_interval_s=0.05)
    old = InstanceStatus("frozen", time.time() - 10, 100, 0, 1, 16, 8)
    ray.get(sched.register.remote(old, Frozen.remote()))
    deadline = time.time() + 15
    while time.time() < deadline:
        if ray.get(sched.dispatch.remote(DispatchRequest("r", 5))) is None:
            break
        time.sleep(0.2)
    assert ray.get(sched.dispatch.remote(DispatchRequest("r2", 5))) is None
    ray.kill(sched)


def test_a_membership_watch_answers_on_change_not_on_a_timer(cluster):
    """A gateway's membership watch: answered at once for a version it has not seen, held
    while nothing changes, and woken by a new member (well before its timeout) with the
    new instance's handle; its threads are apart from the ones that take dispatches."""
    from llumnix.cluster.llumsched import LlumSchedActor
    from llumnix.core.status import InstanceStatus
    from llumnix.policy import DispatchRequest

    @ray.remote(num_cpus=0)
    class Stub:
        def health(self) -> bool:
            return True

    sched = LlumSchedActor.options(num_cpus=0).remote(None, None, reschedule_interval_s=0.05)
    version, members = ray.get(sched.watch_members.remote([], None, 30.0), timeout=10)
    assert members == {}
    t0 = time.monotonic()
    again, _ = ray.get(sched.watch_members.remote([], version, 0.5), timeout=10)
    assert again == version and time.monotonic() - t0 >= 0.45  # nothing changed: held to its timeout
    watches = [sched.watch_members.remote([], version, 30.0) for _ in range(12)]  # more than max_concurrency
    assert ray.get(sched.dispatch.remote(DispatchRequest("r", 5)), timeout=5) is None  # not blocked by them
    t0 = time.monotonic()
    ray.get(sched.register.remote(InstanceStatus("a", time.time(), 100, 0, 1, 16, 8), Stub.remote()), timeout=10)
    answers = ray.get(watches, timeout=10)
    assert time.monotonic() - t0 < 5
    assert all(v != version and set(m) == {"a"} and m["a"]["handle"] is not None and m["a"]["role"] == "mixed"
               for v, m in answers)
    ray.kill(sched)


def test_a_hung_redis_does_not_stall_dispatch(cluster):
    """Issue 28 finding 8: LlumSched wrote each status to Redis under its lock, so a hung
    Redis (2 s socket timeout) stalled every dispatch behind the status pushes. Statuses no
    longer reach LlumSched by Ray at all (the instances write their own to the store); what
    LlumSched still writes, a gone instance's records, goes off the lock."""
    import os
    import signal

    from llumnix.cluster.llumsched import LlumSchedActor
    from llumnix.core.status import InstanceStatus
    from llumnix.policy import DispatchRequest
    from tests.cluster.conftest import redis_server

    @ray.remote(num_cpus=0)
    class Stub:  # answers the health check that a status falling silent brings on
        def health(self) -> bool:
            return True

    with redis_server() as (url, proc):
        sched = LlumSchedActor.options(num_cpus=0).remote(None, url, reschedule_interval_s=0.05)
        ray.get(sched.register.remote(InstanceStatus("i0", time.time(), 100, 0, 1, 16, 8), Stub.remote()))
        ray.get([sched.register.remote(InstanceStatus(f"x{i}", time.time(), 1, 0, 1, 16, 8)) for i in range(10)])
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            slowest = 0.0
            for i in range(10):
                gone = sched.remove_instance.remote(f"x{i}", "test")
                t0 = time.perf_counter()
                assert ray.get(sched.dispatch.remote(DispatchRequest(f"r{i}", 5)), timeout=30) is not None
                slowest = max(slowest, time.perf_counter() - t0)
                assert ray.get(gone, timeout=30)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            ray.kill(sched)
    assert slowest < 0.5, slowest


def test_llumsched_is_restarted_by_ray_and_relearns_the_instances(server, cluster):
    url, backend = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    ray.kill(cluster.llumsched, no_restart=False)
    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200  # served meanwhile (fallback or the restarted scheduler)
    deadline = time.time() + 30

    def relearnt(done) -> dict:  # type: ignore[no-untyped-def]
        info: dict = {}
        while time.time() < deadline:
            try:  # Ray may report the actor unavailable for a moment after it answered once
                info = ray.get(cluster.llumsched.cluster_info.remote(), timeout=5)
                if done(info):
                    break
            except Exception:  # noqa: BLE001 - still restarting
                pass
            time.sleep(0.2)
        return info

    info = relearnt(lambda i: len(i["instances"]) == 2)
    assert len(info["instances"]) == 2
    # ...and reads their statuses on its own lines to their channels again
    info = relearnt(lambda i: len(i["instances"]) == 2 and len(i["status_feed"]["live"]) >= 2)
    assert info["status_feed"]["live"] == sorted(i["instance_id"] for i in info["instances"])
    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "y", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200
    # The restarted scheduler decides again over what it relearnt (gateways use its
    # dispatch when they have no channel, and to place a resumed request).
    from llumnix.policy import DispatchRequest

    picked = ray.get(cluster.llumsched.dispatch.remote(DispatchRequest("probe", 4, 0, time.time())), timeout=10)
    assert picked in {i["instance_id"] for i in info["instances"]}


def test_official_openai_client_completions_and_chat_streaming_and_not(server, cluster):
    openai = pytest.importorskip("openai")
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    (model,) = [m.id for m in client.models.list().data]
    kw = {"model": model, "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}

    c = client.completions.create(prompt="Hello there", **kw)
    assert c.object == "text_completion" and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 10 and c.usage.prompt_tokens == len("Hello there")
    streamed = list(client.completions.create(prompt="Hello there", stream=True,
                                              stream_options={"include_usage": True}, **kw))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == c.choices[0].text
    assert streamed[-1].usage.completion_tokens == 10

    msgs = [{"role": "user", "content": "What is 2+2?"}]
    chat = client.chat.completions.create(messages=msgs, **kw)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(messages=msgs, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices for ch in chunks)  # the README's loop reads choices[0] of every chunk
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == chat.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"

    with pytest.raises(openai.BadRequestError) as e:  # our error body parses as OpenAI's
        client.completions.create(model=model, prompt="x", max_tokens=0)
    assert e.value.status_code == 400 and "max_tokens" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=msgs)
    statuses = ray.get([a.check_invariants.remote() for a in cluster.instances.values()])
    assert all(s["num_used_blocks"] == 0 for s in statuses)


def test_logprobs_in_completions_and_chat(server):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": name, "prompt": "log", "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json={**body, "logprobs": 0}, timeout=60).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 6
    assert "".join(lp["tokens"]) == r["choices"][0]["text"] and all(x <= 0 for x in lp["token_logprobs"])
    assert lp["text_offset"][0] == 0
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"] is None
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "logprobs": 0, "stream": True},
                      timeout=60) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    streamed = [x for c in chunks for ch in c["choices"] if ch["logprobs"] for x in ch["logprobs"]["token_logprobs"]]
    assert streamed == pytest.approx(lp["token_logprobs"])
    offsets = [x for c in chunks for ch in c["choices"] if ch["logprobs"] for x in ch["logprobs"]["text_offset"]]
    assert offsets == lp["text_offset"]  # offsets into the whole text, not into each chunk
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True,
        "logprobs": True}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and all(c["logprob"] <= 0 and isinstance(c["token"], str) for c in content)
    assert all(c["top_logprobs"] == [] for c in content)  # no alternatives unless asked


def test_top_logprobs_list_the_most_likely_tokens(server):
    """logprobs=N (completions) and top_logprobs=N (chat) give the N most likely tokens
    at each position; greedy decoding picks the first of them."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": name, "prompt": "log", "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    lp = httpx.post(f"{url}/v1/completions", json={**body, "logprobs": 3}, timeout=60).json()["choices"][0]["logprobs"]
    assert len(lp["top_logprobs"]) == 6
    for tok, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert 1 <= len(top) <= 4 and top[tok] == pytest.approx(chosen)  # the chosen one is always there
        assert chosen == pytest.approx(max(top.values())) and all(v <= 0 for v in top.values())
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True,
        "temperature": 0, "logprobs": True, "top_logprobs": 2}).json()
    for c in chat["choices"][0]["logprobs"]["content"]:
        alts = c["top_logprobs"]
        assert len(alts) == 2 and alts[0]["logprob"] >= alts[1]["logprob"]
        assert alts[0]["logprob"] == pytest.approx(c["logprob"]) and alts[0]["token"] == c["token"]


def test_client_disconnect_after_a_migration_frees_the_blocks_where_the_request_went(server, cluster):
    """The request is live-migrated mid-stream (through the instance's migrate_request),
    then the client hangs up: the abort must find it on its new instance, and no block
    stays allocated anywhere."""
    from tests.cluster.helpers import stream_and_migrate, wait_idle

    url, backend = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    stream_and_migrate(url, {"model": name, "prompt": "migrate me", "max_tokens": 450, "ignore_eos": True},
                       cluster.instances)  # streamed from the new instance, then hung up
    assert backend.instances  # the gateway is still serving
    counts = wait_idle(cluster.instances)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts


def test_a_migration_to_an_instance_that_caches_the_prompt_sends_only_the_rest(server, cluster):
    """Prefix caching (on in this cluster): a first stream is migrated to the other
    instance, which from then on caches its prompt's blocks; a second stream with the
    same prompt is migrated between the two, and whichever way it goes the destination
    already caches the prompt (the source of the first keeps it, evictable): those
    blocks are adopted there by their keys, not sent. Every block comes back."""
    from tests.cluster.helpers import stream_and_migrate, wait_idle

    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": name, "prompt": "the shared document says hello " * 3, "max_tokens": 300, "ignore_eos": True}
    stream_and_migrate(url, body, cluster.instances)  # decoded on the destination, which keys its blocks
    second = stream_and_migrate(url, body, cluster.instances)
    # 93 characters of prompt: at least 20 tokens, 5 full blocks of 4
    assert second["num_blocks_cached"] >= 5 and second["num_bytes"] > 0, second
    counts = wait_idle(cluster.instances)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts


def test_the_prefix_index_forgets_what_the_instances_report_evicted(server, cluster):
    """Sixteen distinct prompts with long outputs need 1,600 blocks of two instances' 1,024:
    the engines evict cached prefixes, their status pushes name the keys, and LlumSched's
    index forgets the ones it had sent there (``/admin/cluster`` counts them)."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]

    def forgotten() -> dict[str, int]:
        return {i["instance_id"]: i["prefix_blocks_forgotten"]
                for i in httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["instances"]}

    async def one(i: int) -> int:
        body = {"model": name, "prompt": f"{i:02d} evicted document " * 5, "max_tokens": 300,
                "ignore_eos": True}
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(f"{url}/v1/completions", json=body)
        return r.json()["usage"]["completion_tokens"]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(16)))

    before = forgotten()
    assert asyncio.run(main()) == [300] * 16
    counts = wait_idle(cluster.instances)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts
    deadline = time.time() + 10
    while sum(forgotten().values()) == sum(before.values()) and time.time() < deadline:
        time.sleep(0.1)
    after = forgotten()
    assert sum(after.values()) > sum(before.values()), (before, after)
    assert all(after[i] >= before.get(i, 0) for i in after)


BAD_INPUTS = [  # (endpoint, body, status, param); chat bodies get "messages" unless they set it
    ("completions", b"{not json", 400, None),
    ("completions", b"[1, 2]", 400, None),
    ("completions", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("chat/completions", {"model": "nope"}, 404, "model"),
    ("completions", {"model": None, "prompt": "x"}, 400, "model"),
    ("completions", {"model": 12, "prompt": "x"}, 400, "model"),
    ("completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
    ("chat/completions", {"max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "hi" * 600}, 400, "prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi" * 600}]}, 400, "prompt"),
    ("completions", {"prompt": [1, 2, 100000]}, 400, "prompt"),
    ("completions", {"prompt": ""}, 400, "prompt"),
    ("completions", {"prompt": "x", "temperature": 5}, 400, "temperature"),
    ("completions", {"prompt": "x", "temperature": -0.1}, 400, "temperature"),
    ("completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"prompt": "x", "top_k": -7}, 400, "top_k"),
    ("completions", {"prompt": "x", "logprobs": 99}, 400, "logprobs"),
    ("completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("completions", {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"prompt": 7}, 400, "prompt"),
    ("completions", {"prompt": "x", "stop": 5}, 400, "stop"),
    ("completions", {"prompt": "x", "logprobs": "many"}, 400, "logprobs"),
    ("completions", {"prompt": "x", "priority": "urgent"}, 400, "priority"),
    ("chat/completions", {"messages": "hi"}, 400, "messages"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ("completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("chat/completions", {"n": 17}, 400, "n"),
]


@pytest.mark.parametrize("endpoint,body,status,param", BAD_INPUTS)
def test_bad_input_gets_an_openai_error_and_reaches_no_instance(server, cluster, endpoint, body, status,
                                                                param):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    before = ray.get(cluster.llumsched.cluster_info.remote())["num_dispatched"]
    if isinstance(body, bytes):
        r = httpx.post(f"{url}/v1/{endpoint}", content=body, headers={"content-type": "application/json"})
    else:
        full = {"model": name, **({"messages": [{"role": "user", "content": "hi"}]}
                                  if endpoint.startswith("chat") else {}), **body}
        r = httpx.post(f"{url}/v1/{endpoint}", json=full, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    assert ray.get(cluster.llumsched.cluster_info.remote())["num_dispatched"] == before


def test_drain_migrates_running_requests_and_streams_survive(server, cluster):
    """Runs last: it leaves instance-1 terminating."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    n_tokens = 480

    async def one(i: int) -> list[str]:
        async with httpx.AsyncClient(timeout=120) as c, c.stream(
                "POST", f"{url}/v1/completions",
                json={"model": name, "prompt": f"r{i}", "max_tokens": n_tokens, "ignore_eos": True,
                      "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}) as r:
            return [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]

    async def main():
        tasks = [asyncio.create_task(one(i)) for i in range(4)]
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{url}/admin/instances/instance-1/drain", headers=ADMIN)
            assert r.status_code == 200, r.text
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    for lines in results:
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == n_tokens
    deadline = time.time() + 5
    while time.time() < deadline:
        info = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
        if not info["migrations"]["in_flight"]:
            break
        time.sleep(0.1)
    assert info["migrations"]["committed"] >= 1, info
    assert info["migrations"]["blocks_sent"] >= 1, info  # their KV moved: counted from the reports
    # LlumSched's orders (migrate_out): each one's wait from the order to its first stage, shown
    moved = [m for m in info["migrations"]["recent"] if m["committed"] and not m["was_queued"]]
    assert moved and all(m["start_wait_s"] >= 0 and m["first_stage_s"] >= 0 for m in moved), moved
    assert moved[-1]["start_wait_s"] in info["migrations"]["start_wait_s"]  # the last 20 of them
    text = httpx.get(f"{url}/metrics").text
    assert 'llumnix:migrations_total{model_name=' in text and "llumnix:migration_downtime_seconds_count" in text
    assert 'llumnix:instance_freeness{instance_id="instance-0"' in text
    statuses = {s.instance_id: s for s in ray.get([a.status.remote() for a in cluster.instances.values()])}
    assert statuses["instance-1"].is_terminating and not statuses["instance-1"].running
    assert all(s.num_used_blocks == 0 for s in statuses.values())


def test_scale_out_without_a_free_gpu_fails_at_once(cluster):
    """A scale-out whose instance needs a GPU the Ray cluster lacks is refused at once,
    with an event saying why, instead of an actor left pending until its start timeout
    (300 s) while the scheduler makes no other scaling decision."""
    from llumnix.cluster.llumsched import LlumSchedActor

    sched = LlumSchedActor.options(name=f"gpu-check-{time.time_ns()}").remote(  # type: ignore[attr-defined]
        None, instance_spec={"num_gpus": 1, "start_timeout_s": 300})
    try:
        t0 = time.time()
        ray.get(sched.start_instance.remote(), timeout=60)
        assert time.time() - t0 < 10
        events = ray.get(sched.cluster_info.remote())["scaling"]["events"]
        assert [e["kind"] for e in events] == ["start-failed"], events
        assert "needs 1 GPU and 0 are free" in events[0]["reason"]
    finally:
        ray.kill(sched)
