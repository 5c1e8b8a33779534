"""Ray actors: an instance (engine + llumlet) and LlumSched (global scheduler +
cluster meta store). Thin adapters over the plain objects that hold the logic."""
from __future__ import annotations

import threading
import time
from typing import Any

import ray

from llumnix.core.batch import RequestOutput
from llumnix.core.status import InstanceStatus
from llumnix.gateway.backend import GenerateRequest
from llumnix.policy import DispatchRequest, GlobalScheduler, Llumlet, SchedulingConfig

LLUMSCHED_NAME = "llumnix-llumsched"


@ray.remote(max_concurrency=16)  # threaded: long polls for outputs never block commands
class InstanceActor:
    def __init__(self, instance_id: str, model: str, engine_kwargs: dict[str, Any],
                 scheduling: dict[str, Any] | None, llumsched_name: str = LLUMSCHED_NAME,
                 threads: int = 1) -> None:
        import torch

        from llumnix.cluster.instance import InstanceServer
        from llumnix.llm import LLM

        torch.set_num_threads(threads)
        cfg = SchedulingConfig.from_dict(scheduling)
        self.llm = LLM(model, instance_id=instance_id, **engine_kwargs)
        self.llumlet = Llumlet(instance_id, self.llm.engine, cfg.rescheduling, cfg.freeness)
        self._llumsched = ray.get_actor(llumsched_name)
        self.server = InstanceServer(self.llm.engine, self.llumlet, on_status=self._push)
        self.server.start()

    def _push(self, status: InstanceStatus) -> None:
        self._llumsched.update_status.remote(status)  # fire and forget: the newest wins

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
        self.server.stop()


@ray.remote(max_concurrency=8)
class LlumSchedActor:
    def __init__(self, scheduling: dict[str, Any] | None, cms_url: str | None = None, seed: int = 0) -> None:
        from llumnix.cluster.meta_store import make_meta_store

        cfg = SchedulingConfig.from_dict(scheduling)
        self.gs = GlobalScheduler(cfg, seed=seed)
        self.store = make_meta_store(cms_url)
        self._lock = threading.Lock()
        self.num_dispatched = 0

    def register(self, status: InstanceStatus) -> None:
        with self._lock:
            self.gs.add_instance(status)
            self.store.put_status(status)

    def update_status(self, status: InstanceStatus) -> None:
        with self._lock:
            if status.instance_id in self.gs.statuses:
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
            return {"dispatch_policy": self.gs.config.dispatch.policy,
                    "num_dispatched": self.num_dispatched,
                    "instances": [{"instance_id": s.instance_id, "freeness": freeness(s, fcfg),
                                   "num_running": s.num_running, "num_waiting": s.num_waiting,
                                   "num_used_blocks": s.num_used_blocks,
                                   "num_total_blocks": s.num_total_blocks,
                                   "is_terminating": s.is_terminating,
                                   "age_s": time.time() - s.timestamp}
                                  for s in self.gs.statuses.values()]}
