"""A real gateway (uvicorn in a thread) over a real cluster, and an SSE client, for the
cluster tests."""
from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

ADMIN_KEY = "test-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
"""The gateways these tests serve have an admin key (drain needs one); admin calls send it."""


@contextlib.contextmanager
def running_cluster(model_dir: Any, tag: str, **cfg: Any) -> Iterator[Any]:
    """A cluster of the tiny model (tiny engine: 4-token blocks, 8 sequences) in its own
    Ray namespace, shut down with its Ray session at the end."""
    import ray

    from llumnix.cluster.launcher import ClusterConfig, start_cluster

    engine = {"block_size": 4, "max_num_seqs": 8, **cfg.pop("engine", {})}
    cfg = {"reschedule_interval_s": 0.05, **cfg}
    c = start_cluster(ClusterConfig(model=str(model_dir), engine=engine, namespace=f"{tag}-{time.time_ns()}", **cfg))
    try:
        yield c
    finally:
        c.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def serve_cluster(cluster: Any, model_dir: Any, **app_kw: Any) -> Iterator[tuple[str, Any]]:
    """The OpenAI gateway for ``cluster`` on a free loopback port, with ``ADMIN_KEY``
    unless ``app_kw`` says otherwise: yields (url, backend)."""
    from llumnix.cluster.gateway_client import ClusterBackend
    from llumnix.gateway.inprocess import InProcessGateway
    from llumnix.model import Tokenizer

    tok = Tokenizer.from_dir(model_dir, None, 256)
    backend = ClusterBackend(cluster.llumsched, cluster.instances, cluster.info, tok)
    with InProcessGateway(backend, **{"admin_key": ADMIN_KEY, **app_kw}) as url:
        yield url, backend


@dataclass
class StreamResult:
    request_id: str = ""
    text: str = ""
    num_chunks: int = 0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    errors: list[str] = field(default_factory=list)
    done: bool = False


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                            progress: StreamResult | None = None) -> StreamResult:
    """POST a streamed completion; fills ``progress`` as chunks arrive (so a test can
    act mid-stream) and returns it."""
    res = progress or StreamResult()
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                res.done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                res.errors.append(chunk["error"]["message"])
                continue
            res.request_id = chunk["id"]
            if chunk.get("usage"):
                res.completion_tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                res.text += c["text"]
                res.num_chunks += 1
                res.finish_reason = c["finish_reason"] or res.finish_reason
    return res


def wait_idle(instances: dict[str, Any], timeout: float = 30.0) -> dict[str, dict[str, int]]:
    """Wait until every instance holds no request and no block; returns each one's
    ``check_invariants`` counts (the block accounting checked on the instance)."""
    import ray

    deadline = time.time() + timeout
    counts: dict[str, dict[str, int]] = {}
    while time.time() < deadline:
        counts = dict(zip(instances, ray.get([a.check_invariants.remote() for a in instances.values()],
                                             timeout=30), strict=True))
        if all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()):
            break
        time.sleep(0.1)
    return counts


def where_is(instances: dict[str, Any], request_id: str) -> str | None:
    import ray

    for iid, a in instances.items():
        try:
            if ray.get(a.num_output_tokens.remote(request_id), timeout=5) >= 0:
                return iid
        except Exception:  # noqa: BLE001 - a dead instance holds nothing
            continue
    return None


def stream_and_migrate(url: str, body: dict[str, Any], instances: dict[str, Any], chunks_after: int = 3) -> dict:
    """Stream a completion; once its request is found on an instance, live-migrate it to
    another (that instance's ``migrate_request``), then hang up after ``chunks_after``
    more chunks (streamed from the destination). Returns the migration's report."""
    import ray

    report, n_after = None, 0
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if report is None:
                rid = json.loads(line[6:])["id"]
                src = where_is(instances, rid)
                if src is None:
                    continue
                dst = next(i for i in instances if i != src)
                report = ray.get(instances[src].migrate_request.remote(rid, dst, instances[dst]), timeout=60)
                assert report["committed"], report
                assert where_is(instances, rid) == dst
                continue
            n_after += 1
            if n_after == chunks_after:
                break
    assert report is not None, "the request was never found on an instance"
    return report


STEP_SLEEP_ENV = "LLUMNIX_TEST_STEP_SLEEP_S"
"""Seconds every engine step sleeps first in the Ray workers of a job started with
``SLOW_STEPS_HOOK``: the value this variable has in the driver when it calls ``ray.init``."""
SLOW_STEPS_HOOK = "tests.cluster.helpers.slow_steps_runtime_env"
"""``RAY_RUNTIME_ENV_HOOK`` for a ``ray.init``: the job's workers run ``sleep_in_steps``
(they must be able to import ``tests``: the repository on their ``PYTHONPATH``)."""


def slow_steps_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """Ray's runtime-env hook (``RAY_RUNTIME_ENV_HOOK``, called by ``ray.init`` in the
    driver): the job's every worker gets ``$LLUMNIX_TEST_STEP_SLEEP_S`` and runs
    ``sleep_in_steps`` before its actor starts."""
    import os

    env = runtime_env or {}
    return {**env, "env_vars": {**env.get("env_vars", {}), STEP_SLEEP_ENV: os.environ[STEP_SLEEP_ENV]},
            "worker_process_setup_hook": "tests.cluster.helpers.sleep_in_steps"}


def sleep_in_steps() -> None:
    """A rate the test sets: each engine step of this process sleeps ``$LLUMNIX_TEST_STEP_SLEEP_S``
    first, so a request of N tokens decodes for at least N times that however fast the tiny
    model is (1 ms a token: 400 tokens end within a migration on a loaded machine). What the
    step computes is unchanged."""
    import os

    from llumnix.engine.engine_core import EngineCore

    pause = float(os.environ.get(STEP_SLEEP_ENV, "0"))
    step = EngineCore.step
    if pause <= 0 or getattr(step, "sleeps_first", False):
        return

    def slow_step(self: EngineCore) -> Any:
        time.sleep(pause)
        return step(self)

    slow_step.sleeps_first = True  # type: ignore[attr-defined]
    EngineCore.step = slow_step  # type: ignore[method-assign]
