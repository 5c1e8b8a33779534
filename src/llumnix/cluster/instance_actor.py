"""The instance actor: one engine and its llumlet in a Ray actor, reached by LlumSched
(registration, commands, migration rounds), gateways (request channels, resumes) and other
instances (a migration's destination side). Thin: the engine loop is ``InstanceServer``,
migrations out ``MigrationSource``, its announcements to LlumSched ``Announcer``."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

import ray

from llumnix.cluster.announce import Announcer
from llumnix.cluster.migration_source import MigrationSource
from llumnix.config.sections import LiveMigrationConfig
from llumnix.core.batch import RequestOutput
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest
from llumnix.logging_setup import configure_logging
from llumnix.policy import Llumlet, SchedulingConfig

if TYPE_CHECKING:
    from llumnix.cluster.channel import ChannelServer
    from llumnix.policy.pd import PDConfig

LLUMSCHED_NAME = "llumnix-llumsched"
log = logging.getLogger(__name__)


def set_switch_interval() -> None:
    """``LLUMNIX_GIL_SWITCH_S``, if set, becomes this process's GIL switch interval: how long
    a thread that wants the GIL waits before the holder is asked to drop it (Python's
    default 5 ms). A migration's copy thread re-takes the GIL after each torch call; while
    the step thread runs pure Python (a step replayed from a CUDA graph is mostly that),
    each re-take can wait the whole interval."""
    value = os.environ.get("LLUMNIX_GIL_SWITCH_S")
    if value:
        sys.setswitchinterval(float(value))


# threaded: long polls for outputs never block commands. (Ray's stubs know neither
# max_concurrency on a class nor the decorated class's .options(): hence the ignores.)
@ray.remote(max_concurrency=16)  # type: ignore[call-overload]
class InstanceActor:
    def __init__(self, instance_id: str, model: str, engine_kwargs: dict[str, Any],
                 scheduling: SchedulingConfig | None, llumsched_name: str = LLUMSCHED_NAME,
                 threads: int = 1, token: bytes = b"", migration: LiveMigrationConfig | None = None) -> None:
        """``scheduling`` and ``migration``: the frozen configs the serve process built and
        checked, passed whole (parsed once per process, never here)."""
        import torch

        from llumnix.cluster.instance import InstanceServer
        from llumnix.llm import LLM
        from llumnix.migration.destination import DestinationEndpoint
        from llumnix.migration.tcp_transport import migration_host
        from llumnix.migration.transport import TransportOptions
        from llumnix.migration.transports import check_transport

        configure_logging()  # $LLUMNIX_LOG_LEVEL, from the serve process
        torch.set_num_threads(threads)
        set_switch_interval()
        cfg = scheduling or SchedulingConfig()
        self.llm = LLM(model, instance_id=instance_id, **engine_kwargs)
        if cfg.dispatch.policy == "slo":  # the engine orders its queue by the classes' objectives
            self.llm.engine.set_objectives(cfg.slo.objectives(), cfg.slo.engine_order, cfg.slo.classes_of())
        self.llumlet = Llumlet(instance_id, self.llm.engine, cfg.rescheduling, cfg.freeness,
                               records_steps=cfg.dispatch.policy == "slo")  # the predictor's steps
        self._llumsched = ray.get_actor(llumsched_name)
        self._cms = self._open_cms(instance_id)
        self.role: str | None = None
        """This instance's PD role (``policy/pd.py``) once LlumSched has assigned it (``set_role``)."""
        self.channel: ChannelServer | None = None  # opened below: where every status goes
        self.announcer = Announcer(self._llumsched, ray.get_runtime_context().current_actor, self._cms,
                                   role=lambda: self.role)
        self.server = InstanceServer(self.llm.engine, self.llumlet, on_status=self.announcer.on_status)
        self.handoff = self._handoff_worker(cfg.pd) if cfg.pd.is_on else None
        self.server.start()
        mig = migration or LiveMigrationConfig()
        transport = check_transport(mig.transport)
        options = TransportOptions(**mig.transport_options)
        self.migration_config = mig.protocol
        self.source = MigrationSource(self.server, self.llumlet, self.migration_config, transport, options, token,
                                      on_report=self._report_migration)
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.endpoint = DestinationEndpoint(self.server, token,
                                            reservation_timeout_s=2 * self.migration_config.timeout_s,
                                            host=migration_host(node_ip), options=options)
        from llumnix.cluster.channel import ChannelServer

        self.channel = ChannelServer(self.server, token, self._add_at_boundary, host=migration_host(node_ip))
        self._closed = False  # set by close_if_idle: a stopping instance takes no new work
        self.stop_when_empty = False
        """Marked terminating by scale-in (not by an admin drain): to be stopped once empty.
        Kept here, so a restarted LlumSched learns it again from the instance."""
        if self.handoff is not None:
            self.handoff.start()
        from llumnix.cluster.gc_watch import GCWatch, freeze_startup_objects

        freeze_startup_objects()  # last: the model and Ray's state stay out of full collections
        self.gc_watch = GCWatch()

    def _open_cms(self, instance_id: str) -> Any:
        """With a shared meta store, this llumlet writes its statuses there itself, and its
        membership record (its actor's name: where a restarted LlumSched finds it)."""
        from llumnix.cluster.meta_store import RedisMetaStore, StoreWriter

        url = cast(str | None, ray.get(self._llumsched.cms_url.remote(), timeout=60))
        if url is None or url == "memory":
            return None
        cms = StoreWriter(RedisMetaStore(url))
        name = ray.get_runtime_context().get_actor_name()
        if name:
            cms.put_member(instance_id, {"actor_name": name})
        return cms

    # -- PD (cluster/pd.py) -------------------------------------------------------
    def _handoff_worker(self, pd: PDConfig) -> Any:
        from llumnix.cluster.handoff import HandoffWorker

        iid = self.llm.engine.instance_id

        def ask(request_id: str, num_blocks: int) -> tuple[str, Any] | None:
            got = cast(tuple[str, Any] | None,
                       ray.get(self._llumsched.pd_destination.remote(iid, request_id, num_blocks), timeout=10))
            return None if got is None else (str(got[0]), got[1])

        def done(report: dict[str, Any]) -> None:
            keep = ("request_id", "dst_instance_id", "committed", "abort_reason", "abort_code", "downtime",
                    "duration", "num_blocks", "num_bytes", "num_stages", "num_prefill_stages", "num_last_stage_blocks")
            with contextlib.suppress(Exception):  # LlumSched restarting: one count lost
                self._llumsched.pd_handoff_done.remote(iid, {k: report.get(k) for k in keep})

        def migrate(request_id: str, dst_id: str, dst: Any, overrides: dict[str, Any] | None) -> dict[str, Any]:
            return self.migrate_request(request_id, dst_id, dst, overrides, exclusive=False)  # several in flight

        worker = HandoffWorker(self.server, ask, migrate, done,
                               stop_and_copy=pd.stop_and_copy_behind_prefill, follow_prefill=pd.precopy_prefill_chunks,
                               max_in_flight=pd.max_handoffs_in_flight)
        self.server.on_step = worker.on_step  # set before the step thread starts
        return worker

    def set_role(self, role: str) -> None:
        """LlumSched's PD role for this instance; a prefill one hands off its decodes."""
        self.role = role
        if self.handoff is not None:
            self.handoff.set_role(role)

    def gc_stats(self) -> dict[str, Any]:
        """Full garbage collections in this process since start-up (``gc_watch``)."""
        return self.gc_watch.stats()

    def ready(self) -> dict[str, Any]:
        e = self.llm.engine
        return {"instance_id": e.instance_id, "max_model_len": e.config.max_model_len,
                "num_blocks": e.kv.num_total_blocks, "block_size": e.kv.block_size,
                "watermark": e.config.cache.watermark, "model": self.llm.loaded.name,
                "vocab_size": self.llm.loaded.config.vocab_size}

    def add_request(self, req: GenerateRequest) -> None:
        if req.admit_by is not None and time.time() > req.admit_by:
            raise TimeoutError(f"request {req.request_id} was forwarded after its gateway stopped waiting")
        self._add_at_boundary(req).result(30.0)

    def _add_at_boundary(self, req: GenerateRequest) -> Future[None]:
        """Queue ``req`` for the engine's next step boundary (Ray calls and the request
        channel alike)."""
        e = self.llm.engine

        def add() -> None:
            self._check_open()
            e.add_request(req.request_id, req.prompt_token_ids, req.params, priority=req.priority,
                          client=req.client, epoch=req.epoch, slo_class=req.slo_class or "")
            if req.final_only:
                self.server.hold_until_final(req.request_id)

        return self.server.run_at_boundary(add)

    def channel_address(self) -> tuple[str, int]:
        """Where a gateway's request channel connects (``channel.py``)."""
        assert self.channel is not None
        return self.channel.address

    def resume_request(self, req: GenerateRequest, output_token_ids: list[int]) -> None:
        """Take over a request whose instance died: queue it with the outputs already
        streamed, to be recomputed (one prefill over prompt + outputs) and continued. With
        the request's seed, the next token is the one the dead instance would have drawn."""
        from llumnix.core.request import Request

        e = self.llm.engine
        if not output_token_ids:
            self.add_request(req)
            return

        def install() -> None:
            self._check_open()
            e.install_request(Request(
                request_id=req.request_id, prompt_token_ids=list(req.prompt_token_ids),
                sampling_params=req.params, arrival_time=e.clock.now(), priority=req.priority,
                seed=req.params.seed if req.params.seed is not None else 0,
                eos_token_id=e.eos_token_id, output_token_ids=list(output_token_ids), client=req.client,
                epoch=req.epoch, slo_class=req.slo_class or e.slo_classes_of.get(req.priority, "")))
            if req.final_only:
                self.server.hold_until_final(req.request_id)

        self.server.call(install)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"instance {self.llm.engine.instance_id} is stopping")

    def close_if_idle(self) -> bool:
        """At a step boundary: if no request is here, take no more (scale-in stops it next)."""
        e = self.llm.engine

        def close() -> bool:
            if e.requests or e.kv.num_used_blocks:
                return False
            self._closed = True
            return True

        return bool(self.server.call(close))

    def check_invariants(self) -> dict[str, int]:
        """Block accounting, checked at a step boundary; returns the counts for tests."""
        e = self.llm.engine

        def check() -> dict[str, int]:
            e.check_invariants()
            return {"num_requests": len(e.requests), "num_used_blocks": e.kv.num_used_blocks,
                    "num_free_blocks": e.kv.num_free_blocks, "num_total_blocks": e.kv.num_total_blocks}

        counts: dict[str, int] = self.server.call(check)
        return counts

    def abort(self, request_id: str) -> bool:
        def abort() -> bool:
            self.server.forget(request_id)
            return self.llm.engine.abort_request(request_id)

        return bool(self.server.call(abort))

    def get_outputs(self, timeout: float = 0.5, client: str = "") -> list[RequestOutput]:
        return self.server.get_outputs(timeout, client)

    def poll_outputs(self, timeout: float = 0.5, client: str = "", ack: int = 0) -> tuple[int, list[RequestOutput]]:
        return self.server.poll_outputs(timeout, client, ack)

    def status(self) -> InstanceStatus:
        return self.server.status()

    def health(self) -> bool:
        return self.server.is_alive

    def shutdown(self) -> None:
        if self.handoff is not None:
            self.handoff.stop()
        if self.channel is not None:
            self.channel.close()
        self.endpoint.close()
        self.server.stop()

    # -- migration: destination side ---------------------------------------------
    def kv_address(self) -> tuple[str, int]:
        return self.endpoint.address

    def mig_try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        return self.endpoint.try_reserve(request_id, num_blocks)

    def mig_try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        return self.endpoint.try_reserve_with_cache(request_id, keys)

    def mig_num_reservations(self) -> int:
        """Migrations into this instance holding reserved blocks, not yet installed."""
        return int(self.endpoint.num_reservations())

    def mig_release(self, request_id: str) -> int:
        return self.endpoint.release(request_id)

    def mig_install(self, snapshot: Any) -> float:
        return self.endpoint.install(snapshot)

    def mig_first_step(self, request_id: str, timeout_s: float) -> tuple[float, float] | None:
        return self.endpoint.first_step(request_id, timeout_s)

    def mig_accept_gloo(self, pair_id: str, offer: Any) -> dict[str, dict[str, bytes]]:
        return self.endpoint.accept_gloo(pair_id, offer)

    def mig_write_kv(self, request_id: str, block_ids: list[int], refs: list[Any], urgent: bool = True) -> bool:
        return self.endpoint.write(request_id, block_ids, memoryview(ray.get(refs[0], timeout=30)), urgent=urgent)

    def set_terminating(self, terminating: bool, stop_when_empty: bool = False) -> None:
        self.stop_when_empty = terminating and stop_when_empty
        self.server.call(lambda: setattr(self.llumlet, "is_terminating", terminating))

    def is_scaling_in(self) -> bool:
        return self.stop_when_empty

    def step_log(self, cpu: bool = False) -> list[tuple[float, ...]]:
        """(start, end, batch size) of recent steps; with ``cpu``, also the step
        thread's CPU seconds in each, whether it was a prefill step, the tokens it computed
        and the decodes among them."""
        return [step if cpu else step[:3] for step in list(self.server.step_log)]

    def num_output_tokens(self, request_id: str) -> int:
        e = self.llm.engine
        return self.server.call(lambda: e.requests[request_id].num_output_tokens
                                if request_id in e.requests else -1)

    # -- migration: source side (``MigrationSource``) ----------------------------------
    def _report_migration(self, report: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # now, not at the round's end (seconds later in a drain);
            self._llumsched.migration_reported.remote(report)  # the round's return is the record

    def migrate_request(self, request_id: str, dst_instance_id: str, dst: Any,
                        overrides: dict[str, Any] | None = None, transport: str | None = None,
                        exclusive: bool = True) -> dict[str, Any]:
        """Migrate one named request (benchmarks, admin); returns its report."""
        return self.source.migrate_request(request_id, dst_instance_id, dst, overrides, transport, exclusive)

    def migrate_out(self, dst_instance_id: str, dst: Any, overrides: dict[str, Any] | None = None,
                    request_id: str | None = None) -> list[dict[str, Any]]:
        """A rescheduling round's migrations to ``dst``; returns the reports (``overrides``:
        MigrationConfig fields for this round, for benchmarks; ``request_id``: the request
        the order names, a rescue's, moved alone)."""
        return self.source.migrate_out(dst_instance_id, dst, overrides, request_id)
