"""Ray actors: an instance (engine + llumlet) and LlumSched (global scheduler +
cluster meta store). Thin adapters over the plain objects that hold the logic."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import ray

from llumnix.core.batch import RequestOutput
from llumnix.core.status import InstanceStatus
from llumnix.gateway.backend import GenerateRequest
from llumnix.policy import DispatchRequest, GlobalScheduler, Llumlet, SchedulingConfig

LLUMSCHED_NAME = "llumnix-llumsched"
log = logging.getLogger(__name__)


@ray.remote(max_concurrency=16)  # threaded: long polls for outputs never block commands
class InstanceActor:
    def __init__(self, instance_id: str, model: str, engine_kwargs: dict[str, Any],
                 scheduling: dict[str, Any] | None, llumsched_name: str = LLUMSCHED_NAME,
                 threads: int = 1, token: bytes = b"", migration: dict[str, Any] | None = None) -> None:
        import torch

        from llumnix.cluster.instance import InstanceServer
        from llumnix.llm import LLM
        from llumnix.migration import MigrationConfig
        from llumnix.migration.destination import DestinationEndpoint

        torch.set_num_threads(threads)
        cfg = SchedulingConfig.from_dict(scheduling)
        self.llm = LLM(model, instance_id=instance_id, **engine_kwargs)
        self.llumlet = Llumlet(instance_id, self.llm.engine, cfg.rescheduling, cfg.freeness)
        self._llumsched = ray.get_actor(llumsched_name)
        self._self_handle = ray.get_runtime_context().current_actor
        self.server = InstanceServer(self.llm.engine, self.llumlet, on_status=self._push)
        self.server.start()
        self._token = token
        self.migration_config = MigrationConfig(**(migration or {}))
        self.endpoint = DestinationEndpoint(self.server, token,
                                            reservation_timeout_s=2 * self.migration_config.timeout_s)
        self._senders: dict[tuple[str, int], Any] = {}
        self._migrating = threading.Lock()

    def _push(self, status: InstanceStatus) -> None:
        # Fire and forget: the newest wins. The handle rides along so a restarted
        # LlumSched, which lost its state, re-learns every instance from its next push.
        try:
            self._llumsched.update_status.remote(status, self._self_handle)
        except Exception:  # noqa: BLE001 - LlumSched is restarting; the next push retries
            log.debug("status push to LlumSched failed", exc_info=True)

    def ready(self) -> dict[str, Any]:
        e = self.llm.engine
        return {"instance_id": e.instance_id, "max_model_len": e.config.max_model_len,
                "num_blocks": e.kv.num_total_blocks, "block_size": e.kv.block_size,
                "watermark": e.config.cache.watermark, "model": self.llm.loaded.name,
                "vocab_size": self.llm.loaded.config.vocab_size}

    def add_request(self, req: GenerateRequest) -> None:
        e = self.llm.engine
        self.server.call(lambda: e.add_request(req.request_id, req.prompt_token_ids, req.params,
                                               priority=req.priority))

    def abort(self, request_id: str) -> bool:
        return bool(self.server.call(lambda: self.llm.engine.abort_request(request_id)))

    def get_outputs(self, timeout: float = 0.5) -> list[RequestOutput]:
        return self.server.get_outputs(timeout)

    def status(self) -> InstanceStatus:
        return self.server.status()

    def health(self) -> bool:
        return self.server.is_alive

    def shutdown(self) -> None:
        self.endpoint.close()
        self.server.stop()

    # -- migration: destination side ---------------------------------------------
    def kv_address(self) -> tuple[str, int]:
        return self.endpoint.address

    def mig_try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        return self.endpoint.try_reserve(request_id, num_blocks)

    def mig_release(self, request_id: str) -> int:
        return self.endpoint.release(request_id)

    def mig_install(self, snapshot: Any) -> None:
        self.endpoint.install(snapshot)

    def set_terminating(self, terminating: bool) -> None:
        self.server.call(lambda: setattr(self.llumlet, "is_terminating", terminating))

    def step_log(self) -> list[tuple[float, float, int]]:
        return list(self.server.step_log)

    def num_output_tokens(self, request_id: str) -> int:
        e = self.llm.engine
        return self.server.call(lambda: e.requests[request_id].num_output_tokens
                                if request_id in e.requests else -1)

    # -- migration: source side ----------------------------------------------------
    def migrate_request(self, request_id: str, dst_instance_id: str, dst: Any,
                        overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Migrate one named request (benchmarks, admin); returns its report."""
        from llumnix.migration.driver import migrate
        from llumnix.migration.tcp_transport import KVSender

        cfg = dataclasses.replace(self.migration_config, **(overrides or {}))
        addr = tuple(ray.get(dst.kv_address.remote()))
        sender = self._senders.get(addr) or self._senders.setdefault(addr, KVSender(addr, self._token))
        with self._migrating:
            rep = migrate(request_id, self.server, _RemoteDestination(dst_instance_id, dst), sender, cfg)
        return dataclasses.asdict(rep)

    def migrate_out(self, dst_instance_id: str, dst: Any, max_migrations: int = 16) -> list[dict[str, Any]]:
        """Migrate requests to ``dst`` one at a time while this instance is still a
        source (the paper's rule); returns the reports."""
        from llumnix.migration.driver import migrate
        from llumnix.migration.tcp_transport import KVSender

        if not self._migrating.acquire(blocking=False):
            return []  # one migration out at a time
        try:
            addr = tuple(ray.get(dst.kv_address.remote()))
            sender = self._senders.get(addr)
            if sender is None:
                sender = self._senders[addr] = KVSender(addr, self._token)
            remote = _RemoteDestination(dst_instance_id, dst)
            reports = []
            for _ in range(max_migrations):
                picked = self.server.call(lambda: self.llumlet.select_requests_to_migrate(time.time(), 1))
                if not picked:
                    break
                rep = migrate(picked[0], self.server, remote, sender, self.migration_config)
                reports.append(dataclasses.asdict(rep))
                if not rep.committed or not self.server.call(
                        lambda: self.llumlet.should_keep_migrating(time.time())):
                    break
            return reports
        except Exception as e:  # noqa: BLE001 - a failed round is reported, never fatal
            self._senders.clear()
            return [{"committed": False, "abort_reason": f"{type(e).__name__}: {e}"}]
        finally:
            self._migrating.release()


class _RemoteDestination:
    """The Destination protocol over Ray calls to another instance actor."""

    def __init__(self, instance_id: str, actor: Any) -> None:
        self.instance_id = instance_id
        self._actor = actor

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        return ray.get(self._actor.mig_try_reserve.remote(request_id, num_blocks), timeout=30)

    def release(self, request_id: str) -> int:
        return ray.get(self._actor.mig_release.remote(request_id), timeout=30)

    def install(self, snapshot: Any) -> None:
        ray.get(self._actor.mig_install.remote(snapshot), timeout=30)


@ray.remote(max_concurrency=8)
class LlumSchedActor:
    def __init__(self, scheduling: dict[str, Any] | None, cms_url: str | None = None, seed: int = 0,
                 reschedule_interval_s: float = 0.5) -> None:
        from llumnix.cluster.meta_store import make_meta_store

        cfg = SchedulingConfig.from_dict(scheduling)
        self.gs = GlobalScheduler(cfg, seed=seed)
        self.store = make_meta_store(cms_url)
        self._lock = threading.Lock()
        self.num_dispatched = 0
        self.handles: dict[str, Any] = {}
        self._in_flight: dict[str, Any] = {}  # source instance -> ObjectRef of its migrate_out
        self.migrations: list[dict[str, Any]] = []
        self._interval = reschedule_interval_s
        self.health_timeout_s = 2.0
        threading.Thread(target=self._reschedule_loop, daemon=True, name="rescheduler").start()

    def register(self, status: InstanceStatus, handle: Any = None) -> None:
        with self._lock:
            self.gs.add_instance(status)
            self.store.put_status(status)
            if handle is not None:
                self.handles[status.instance_id] = handle

    def drain(self, instance_id: str) -> dict[str, Any]:
        """Mark an instance terminating: its fake request of infinite usage makes it a
        migration source until it is empty, and dispatch skips it."""
        handle = self.handles.get(instance_id)
        if handle is None:
            raise KeyError(f"no instance {instance_id!r}")
        ray.get(handle.set_terminating.remote(True))
        return {"instance_id": instance_id, "draining": True}

    def _health_check(self) -> None:
        """Pull, as a fallback to the pushes: an instance silent for too long is asked
        directly; if it does not answer in time it is marked unschedulable."""
        now = time.time()
        with self._lock:
            silent = [(iid, self.handles.get(iid)) for iid, s in self.gs.statuses.items()
                      if now - s.timestamp > self.health_timeout_s]
        for iid, handle in silent:
            ok = False
            if handle is not None:
                try:
                    ok = bool(ray.get(handle.health.remote(), timeout=self.health_timeout_s))
                except Exception:  # noqa: BLE001 - no answer is the answer
                    ok = False
            with self._lock:
                s = self.gs.statuses.get(iid)
                if s is not None and s.is_schedulable != ok:
                    log.warning("instance %s is %s", iid, "healthy again" if ok else "unresponsive")
                    self.gs.statuses[iid] = dataclasses.replace(s, is_schedulable=ok)

    def _reschedule_loop(self) -> None:
        last_health = 0.0
        while True:
            time.sleep(self._interval)
            if time.time() - last_health > self.health_timeout_s:
                last_health = time.time()
                self._health_check()
            with self._lock:
                self._reap_finished()
                orders = self.gs.reschedule(time.time())
                for o in orders:
                    if o.src_instance_id in self._in_flight or o.dst_instance_id not in self.handles:
                        continue
                    src = self.handles.get(o.src_instance_id)
                    if src is None:
                        continue
                    self._in_flight[o.src_instance_id] = src.migrate_out.remote(
                        o.dst_instance_id, self.handles[o.dst_instance_id])

    def _reap_finished(self) -> None:
        done = [k for k, ref in self._in_flight.items() if ray.wait([ref], timeout=0)[0]]
        for k in done:
            try:
                self.migrations.extend(ray.get(self._in_flight.pop(k)))
            except Exception as e:  # noqa: BLE001 - a dead source: recorded as a failed round
                self.migrations.append({"committed": False, "abort_reason": repr(e)})

    def update_status(self, status: InstanceStatus, handle: Any = None) -> None:
        with self._lock:
            if status.instance_id not in self.gs.statuses:
                if handle is None:
                    return
                self.gs.add_instance(status)  # first push after a restart of this actor
                self.handles[status.instance_id] = handle
            self.gs.update_status(status)
            self.store.put_status(status)

    def dispatch(self, req: DispatchRequest) -> str | None:
        with self._lock:
            iid = self.gs.dispatch(req, time.time())
            self.num_dispatched += iid is not None
            return iid

    def cluster_info(self) -> dict[str, Any]:
        from llumnix.policy import freeness

        with self._lock:
            fcfg = self.gs.config.freeness
            committed = [m for m in self.migrations if m.get("committed")]
            return {"dispatch_policy": self.gs.config.dispatch.policy,
                    "num_dispatched": self.num_dispatched,
                    "migrations": {"committed": len(committed),
                                   "aborted": len(self.migrations) - len(committed),
                                   "in_flight": sorted(self._in_flight),
                                   "downtime_s": [m["downtime"] for m in committed][-20:],
                                   "all_downtimes_s": [m["downtime"] for m in committed]},
                    "instances": [{"instance_id": s.instance_id, "freeness": freeness(s, fcfg),
                                   "num_running": s.num_running, "num_waiting": s.num_waiting,
                                   "num_used_blocks": s.num_used_blocks,
                                   "num_total_blocks": s.num_total_blocks,
                                   "is_terminating": s.is_terminating,
                                   "age_s": time.time() - s.timestamp}
                                  for s in self.gs.statuses.values()]}
