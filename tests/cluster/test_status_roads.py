"""Issue 44, one road for a status (the part done): the shared meta store is read back by
LlumSched only when it starts (a restart resumes from it); while it runs, statuses reach
its view from the instances, never from the store. No Ray, no Redis: the store's reads
are counted."""
from __future__ import annotations

import time

import pytest

from llumnix.cluster.llumsched import LlumSchedActor
from llumnix.cluster.meta_store import RedisMetaStore
from llumnix.core.status import InstanceStatus

pytest.importorskip("redis")


def test_llumsched_reads_the_store_back_only_when_it_starts(monkeypatch):
    reads: list[str] = []
    monkeypatch.setattr(RedisMetaStore, "members", lambda self: reads.append("members") or {})
    monkeypatch.setattr(RedisMetaStore, "all_statuses", lambda self: reads.append("statuses") or {})
    sched = LlumSchedActor.__ray_actor_class__(None, "redis://127.0.0.1:1", reschedule_interval_s=0.02)
    assert reads == ["members", "statuses"]  # the resume at start
    sched.register(InstanceStatus("i0", time.time(), 100, 0, 1, 16, 8), handle=object())
    time.sleep(0.3)  # fifteen periodic rounds
    sched.close()
    assert reads == ["members", "statuses"] and sched.rescheduler.num_passes >= 5


# -- one road: after registration, a status reaches a view only off an instance's channel --

TOKEN = b"r" * 32


class _Handle:
    """An instance actor's handle, its calls answered in process (``ray.get`` is patched to
    return what ``.remote`` gave)."""

    def __init__(self, srv, chan) -> None:
        self.channel_address = _Call(lambda: chan.address)
        self.status = _Call(srv.status)
        self.health = _Call(lambda: True)
        self.set_role = _Call(lambda role: None)


class _Call:
    def __init__(self, fn) -> None:
        self.remote = fn


def _instance():
    from llumnix.cluster.channel import ChannelServer
    from llumnix.cluster.instance import InstanceServer
    from llumnix.core.clock import WallClock
    from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
    from tests.engine.helpers import make_engine

    eng = make_engine()
    eng.clock = WallClock()
    srv = InstanceServer(eng, Llumlet(eng.instance_id, eng, ReschedulingConfig(), FreenessConfig()),
                         status_interval_s=0.01)
    srv.start()
    return srv, ChannelServer(srv, TOKEN, lambda req: None, heartbeat_s=0.2)


@pytest.mark.parametrize("learnt_by", ["registration", "announcement"])
def test_every_status_after_registration_comes_off_the_instances_channel(monkeypatch, learnt_by):
    """A registered instance (or, after a restart of LlumSched, one it learns from the
    instance's announcement: handle and role, no status) is then seen only through its
    channel: every status in LlumSched's view after that was read by the feed's thread,
    and announcements carry none."""
    import threading

    import ray

    from llumnix.core.sampling_params import SamplingParams

    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    srv, chan = _instance()
    sched = LlumSchedActor.__ray_actor_class__(None, None, reschedule_interval_s=0.05,
                                               instance_spec={"token": TOKEN})
    try:
        handle = _Handle(srv, chan)
        if learnt_by == "registration":
            sched.register(srv.status(), handle)
        else:
            sched.announce("i0", handle, None)
        assert "i0" in sched.gs.statuses
        roads: list[str] = []
        real = sched.gs.update_status

        def counted(status, refresh=True):
            roads.append(threading.current_thread().name)
            return real(status, refresh=refresh)

        monkeypatch.setattr(sched.gs, "update_status", counted)
        srv.call(lambda: srv.engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=240)))
        deadline = time.time() + 10
        while srv.call(srv.engine.has_unfinished_requests) and time.time() < deadline:
            sched.announce("i0", handle, None)  # as often as the test likes: never a status
            time.sleep(0.01)
        last_step = srv.status().step_id
        while sched.gs.statuses["i0"].step_id < last_step and time.time() < deadline:
            time.sleep(0.01)
        assert sched.gs.statuses["i0"].step_id >= last_step >= 240  # the view followed the request
        assert roads and set(roads) == {"status-feed"}, set(roads)
    finally:
        sched.close()  # its health check would ask the stub's handle through the real ray.get
        chan.close()
        srv.stop()


def test_llumsched_takes_no_status_by_ray_but_at_registration():
    """Of LlumSched's Ray methods, only ``register`` takes an ``InstanceStatus``; and in
    the cluster's code a scheduler's view takes a status only where registration or a
    channel's reader puts it (a scan: a new road fails here)."""
    import ast
    import inspect
    from pathlib import Path

    cls = LlumSchedActor.__ray_actor_class__
    takers = sorted(name for name, fn in inspect.getmembers(cls, inspect.isfunction)
                    if not name.startswith("_") and any("InstanceStatus" in str(p.annotation)
                                                        for p in inspect.signature(fn).parameters.values()))
    assert takers == ["register"], takers

    allowed = {("llumsched.py", "register"), ("llumsched.py", "_relearn"), ("llumsched.py", "_on_fed_statuses"),
               ("gateway_client.py", "on_statuses")}
    found = set()
    root = Path(__file__).resolve().parents[2] / "src" / "llumnix"
    for path in [*(root / "cluster").glob("*.py"), *(root / "gateway").glob("*.py")]:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("update_status", "add_instance"):
                    found.add((path.name, fn.name))
    assert found == allowed, found ^ allowed
