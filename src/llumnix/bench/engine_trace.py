"""An engine event trace for ``bench cluster --trace``: where each preemption happened and
what the instance had just received, without touching the engine's code.

``bench cluster --trace`` starts `llumnix serve` with ``engine_trace_site/`` first on
``PYTHONPATH`` and ``LLUMNIX_ENGINE_TRACE`` naming a file; every process of that cluster
(Ray's workers inherit the environment) then runs ``install()`` at start-up, which wraps
three engine methods to append one JSON line per event (``O_APPEND``; lines are short,
so processes do not interleave them):

    add      a request dispatched here: the instance's state as it joins the queue
    install  a migrated request resumed here (running, or queued: metadata only)
    preempt  a request preempted here (before its blocks are freed)

Each line: ``ev``, ``t`` (``time.time()``: the processes share the clock), ``iid``,
``rid``, the request's tokens, outputs and migrations so far, and the instance's free,
used and reserved blocks, running and queued requests at that moment. A diagnostic of the
benchmark only: nothing in the product imports this module.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "LLUMNIX_ENGINE_TRACE"


def _state(engine: Any) -> dict[str, Any]:
    kv, sched = engine.kv, engine.scheduler
    return {"free": kv.num_free_blocks, "used": kv.num_used_blocks, "total": kv.num_total_blocks,
            "reserved": kv.num_reserved_blocks, "running": len(sched.running), "waiting": len(sched.waiting)}


def _write(path: str, rec: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
    finally:
        os.close(fd)


def _req(req: Any) -> dict[str, Any]:
    return {"rid": req.request_id, "tokens": req.num_tokens, "outputs": req.num_output_tokens,
            "migrations": req.num_migrations, "arrival": req.arrival_time}


def install(path: str) -> None:
    """Wrap EngineCore.add_request and install_request, and LocalScheduler.preempt (which
    learns its engine's id from EngineCore's constructor) to trace into ``path``."""
    from llumnix.engine.engine_core import EngineCore
    from llumnix.engine.scheduler import LocalScheduler

    if getattr(EngineCore, "_trace_installed", False):
        return
    init, add, inst, preempt = (EngineCore.__init__, EngineCore.add_request, EngineCore.install_request,
                                LocalScheduler.preempt)

    def init_(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.scheduler._trace_engine = self

    def add_(self: Any, *a: Any, **k: Any) -> Any:
        req = add(self, *a, **k)
        _write(path, {"ev": "add", "t": time.time(), "iid": self.instance_id, **_req(req), **_state(self)})
        return req

    def inst_(self: Any, req: Any, *a: Any, **k: Any) -> None:
        inst(self, req, *a, **k)
        _write(path, {"ev": "install", "t": time.time(), "iid": self.instance_id, "queued": req.num_computed_tokens == 0,
                      **_req(req), **_state(self)})

    def preempt_(self: Any, req: Any) -> None:
        eng = getattr(self, "_trace_engine", None)
        if eng is not None:
            _write(path, {"ev": "preempt", "t": time.time(), "iid": eng.instance_id, **_req(req), **_state(eng),
                          "victim_blocks": eng.kv.num_blocks_of(req.request_id)})
        preempt(self, req)

    EngineCore.__init__ = init_  # type: ignore[method-assign]
    EngineCore.add_request = add_  # type: ignore[method-assign]
    EngineCore.install_request = inst_  # type: ignore[method-assign]
    LocalScheduler.preempt = preempt_  # type: ignore[method-assign]
    EngineCore._trace_installed = True  # type: ignore[attr-defined]


def site_dir() -> str:
    """The directory to put first on ``PYTHONPATH`` (its ``sitecustomize`` calls ``install``)."""
    return os.path.join(os.path.dirname(__file__), "engine_trace_site")


def read(path: str, t0: float, t1: float) -> list[dict[str, Any]]:
    """The events with ``t0 <= t <= t1``, in time order."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        evs = [json.loads(line) for line in f if line.strip()]
    return sorted((e for e in evs if t0 <= e["t"] <= t1), key=lambda e: e["t"])
