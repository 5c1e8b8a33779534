"""Ray actors: an instance (engine + llumlet) and LlumSched (global scheduler +
cluster meta store). Thin adapters over the plain objects that hold the logic."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

import ray

from llumnix.cluster.history import HISTORY, MigrationHistory, ReactionHistogram
from llumnix.cluster.status_feed import CLIENT as FEED_CLIENT
from llumnix.cluster.status_feed import StatusFeed
from llumnix.core.batch import RequestOutput
from llumnix.core.errors import LlumnixError
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest
from llumnix.logging_setup import configure_logging
from llumnix.policy import DispatchRequest, GlobalScheduler, Llumlet, SchedulingConfig
from llumnix.policy.lifecycle import InstanceState, Lifecycles
from llumnix.policy.pd import DECODES
from llumnix.policy.rounds import pairs_to_start, scaling_round, victims_to_stop
from llumnix.policy.trigger import PassTimer, Reactions

if TYPE_CHECKING:
    from llumnix.cluster.channel import ChannelServer

LLUMSCHED_NAME = "llumnix-llumsched"
SCALED_IN = "scaled in"
SCALE_IN = "scale-in"
"""The reason of a TERMINATING instance that is stopped once drained (an admin drain is not)."""
"""``remove_instance``'s reason for a planned stop: the one loss that is not replaced."""
log = logging.getLogger(__name__)


def _was_restarted() -> bool:
    """This actor is a restart (Ray reconstructed it after it died), not a fresh start."""
    try:
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id:
            warnings.simplefilter("ignore", DeprecationWarning)  # a warning in every quick start
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - outside an actor (tests): a fresh start
        return False


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
                 scheduling: dict[str, Any] | None, llumsched_name: str = LLUMSCHED_NAME,
                 threads: int = 1, token: bytes = b"", migration: dict[str, Any] | None = None) -> None:
        import torch

        from llumnix.cluster.instance import InstanceServer
        from llumnix.llm import LLM
        from llumnix.migration import MigrationConfig
        from llumnix.migration.destination import DestinationEndpoint
        from llumnix.migration.tcp_transport import migration_host
        from llumnix.migration.transport import TransportOptions
        from llumnix.migration.transports import check_transport

        configure_logging()  # $LLUMNIX_LOG_LEVEL, from the serve process
        torch.set_num_threads(threads)
        set_switch_interval()
        cfg = SchedulingConfig.from_dict(scheduling)
        self._scheduling = scheduling
        self.llm = LLM(model, instance_id=instance_id, **engine_kwargs)
        self.llumlet = Llumlet(instance_id, self.llm.engine, cfg.rescheduling, cfg.freeness)
        self._llumsched = ray.get_actor(llumsched_name)
        self._self_handle = ray.get_runtime_context().current_actor
        self._cms = self._open_cms(instance_id)
        self._evicted: list[bytes] = []
        self._last_pushed: InstanceStatus | None = None
        self._pushed_at = self._handle_sent_at = -1e9
        self.role: str | None = None
        """This instance's PD role (``policy/pd.py``) once LlumSched has assigned it (``set_role``)."""
        self.channel: ChannelServer | None = None  # opened below (a push before then goes by Ray)
        self.server = InstanceServer(self.llm.engine, self.llumlet, on_status=self._push)
        self.handoff = self._handoff_worker() if cfg.pd.is_on else None
        self.server.start()
        self._token = token
        mig = dict(migration or {})
        self.transport = check_transport(mig.pop("transport", "tcp"))
        self.transport_options = TransportOptions(**mig.pop("transport_options", {}))
        self.migration_config = MigrationConfig(**mig)
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.endpoint = DestinationEndpoint(self.server, token,
                                            reservation_timeout_s=2 * self.migration_config.timeout_s,
                                            host=migration_host(node_ip), options=self.transport_options)
        from llumnix.cluster.channel import ChannelServer

        self.channel = ChannelServer(self.server, token, self._add_at_boundary, host=migration_host(node_ip))
        self._senders: dict[tuple[str, str], Any] = {}
        self._senders_lock = threading.Lock()  # PD hand-offs run migrations side by side
        self._migrating = threading.Lock()
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

    PUSH_INTERVAL_S = 0.25
    HANDLE_EVERY_S = 2.0

    def _push(self, status: InstanceStatus) -> bool:
        """To the meta store, and to LlumSched at most every ``PUSH_INTERVAL_S``: it
        reschedules twice a second and dispatches only when a gateway cannot, while the
        gateways get every status on their channels; each push is a Ray call that costs
        LlumSched about a millisecond. False when the push was held back: the server then
        reports again soon (``InstanceServer``), so the last status before a quiet spell
        is never lost. A skipped push's evicted prefix keys ride on the next one; a change
        of state (drain, health) is never held back."""
        if self._cms is not None:
            self._cms.put_status(status)  # never waits on Redis (StoreWriter)
        now = time.monotonic()
        self._evicted.extend(status.evicted_prefix_keys)
        last = self._last_pushed
        changed = last is None or (last.is_terminating, last.is_schedulable) != (
            status.is_terminating, status.is_schedulable)
        if not changed and self.channel is not None and self.channel.has_client(FEED_CLIENT):
            # LlumSched reads the statuses on its line to our channel (``status_feed``);
            # a push now and then still carries the handle and the role
            if now - self._handle_sent_at < self.HANDLE_EVERY_S:
                return True
        elif not changed and now - self._pushed_at < self.PUSH_INTERVAL_S:
            return False
        status = dataclasses.replace(status, evicted_prefix_keys=tuple(self._evicted))
        self._evicted.clear()
        self._last_pushed, self._pushed_at = status, now
        # The handle rides along now and then, so a restarted LlumSched (which lost its
        # state) re-learns every instance from a push; deserializing it costs LlumSched
        # more than the status.
        handle = None
        if now - self._handle_sent_at >= self.HANDLE_EVERY_S:
            handle, self._handle_sent_at = self._self_handle, now
        try:  # fire and forget: the newest wins
            self._llumsched.update_status.remote(status, handle, self.role)
        except Exception:  # noqa: BLE001 - LlumSched is restarting; the next push retries
            log.debug("status push to LlumSched failed", exc_info=True)
        return True

    # -- PD (cluster/pd.py) -------------------------------------------------------
    def _handoff_worker(self) -> Any:
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

        pd = SchedulingConfig.from_dict(self._scheduling).pd
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
                          client=req.client, epoch=req.epoch)
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
                epoch=req.epoch))
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

    def mig_accept_gloo(self, host: str, port: int, pair_id: str) -> None:
        self.endpoint.accept_gloo(host, port, pair_id)

    def mig_write_kv(self, request_id: str, block_ids: list[int], refs: list[Any], urgent: bool = True) -> bool:
        return self.endpoint.write(request_id, block_ids, memoryview(ray.get(refs[0], timeout=30)), urgent=urgent)

    def set_terminating(self, terminating: bool, stop_when_empty: bool = False) -> None:
        self.stop_when_empty = terminating and stop_when_empty
        self.server.call(lambda: setattr(self.llumlet, "is_terminating", terminating))

    def is_scaling_in(self) -> bool:
        return self.stop_when_empty

    def step_log(self, cpu: bool = False) -> list[tuple[float, ...]]:
        """(start, end, batch size) of recent steps; with ``cpu``, also the step
        thread's CPU seconds in each and whether it was a prefill step."""
        return [step if cpu else step[:3] for step in list(self.server.step_log)]

    def num_output_tokens(self, request_id: str) -> int:
        e = self.llm.engine
        return self.server.call(lambda: e.requests[request_id].num_output_tokens
                                if request_id in e.requests else -1)

    # -- migration: source side ----------------------------------------------------
    def _sender(self, dst_instance_id: str, dst: Any, transport: str | None = None) -> Any:
        from llumnix.migration.transports import connect

        key = (transport or self.transport, dst_instance_id)
        with self._senders_lock:
            if key not in self._senders:
                self._senders[key] = connect(key[0], dst, self._token, self.transport_options)
            return self._senders[key]

    def _drop_if_broken(self, rep: Any, dst_instance_id: str, transport: str | None = None) -> None:
        if not rep.committed and (rep.abort_reason or "").startswith("TransportError"):
            with contextlib.suppress(Exception):  # the channel broke: reconnect next time
                self._senders.pop((transport or self.transport, dst_instance_id)).close()

    def migrate_request(self, request_id: str, dst_instance_id: str, dst: Any,
                        overrides: dict[str, Any] | None = None, transport: str | None = None,
                        exclusive: bool = True) -> dict[str, Any]:
        """Migrate one named request (benchmarks, admin); returns its report. ``exclusive``
        False (PD hand-offs, several in flight): beside other migrations out of here."""
        from llumnix.migration.driver import migrate

        cfg = dataclasses.replace(self.migration_config, **(overrides or {}))
        with self._migrating if exclusive else contextlib.nullcontext():
            sender = self._sender(dst_instance_id, dst, transport)
            rep = migrate(request_id, self.server, _RemoteDestination(dst_instance_id, dst), sender, cfg)
            self._drop_if_broken(rep, dst_instance_id, transport)
        return dataclasses.asdict(rep)

    def migrate_out(self, dst_instance_id: str, dst: Any,
                    overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Migrate requests to ``dst`` one at a time while the pairing holds (the paper's
        rule, ``policy.rounds.keep_migrating``, as in the simulator); returns the reports.
        ``overrides``: MigrationConfig fields for this round (benchmarks)."""
        from llumnix.migration.driver import migrate, migrate_next

        marks = {"order_received": time.monotonic()}  # the report's clock: where its start's wait began
        if not self._migrating.acquire(blocking=False):
            return []  # one migration out at a time
        try:
            cfg = dataclasses.replace(self.migration_config, **(overrides or {}))
            sender = self._sender(dst_instance_id, dst)
            remote = _RemoteDestination(dst_instance_id, dst)
            reports: list[dict[str, Any]] = []
            picked: list[str] = []
            dst_status = ray.get(dst.status.remote(), timeout=30) if self.llumlet.reads_destination else None
            num_in: int | None = None  # after a migration: others coming in at dst (keep migrating?)
            while True:
                marks["dst_read"] = time.monotonic()

                def pick(d: InstanceStatus | None = dst_status, n: int | None = num_in) -> list[str]:
                    now = time.time()
                    if n is not None and d is not None and not self.llumlet.should_keep_migrating(now, d, n):
                        return []
                    return self.llumlet.select_requests_to_migrate(now, 1, d)

                if cfg.merge_boundaries:  # keep?, pick and start at one source boundary
                    got = migrate_next(pick, self.server, remote, sender, cfg, marks=marks)
                    picked = [] if got is None else [got.request_id]
                else:  # each at a boundary of its own
                    picked = self.server.call(pick)
                    got = migrate(picked[0], self.server, remote, sender, cfg, marks=marks) if picked else None
                if got is None:
                    break
                rep, marks = got, {"order_received": time.monotonic()}  # the next one's wait begins
                reports.append(dataclasses.asdict(rep))
                with contextlib.suppress(Exception):  # now, not at the round's end (seconds later in a drain);
                    self._llumsched.migration_reported.remote(reports[-1])  # the round's return is the record
                self._drop_if_broken(rep, dst_instance_id)
                if not rep.committed:
                    break
                dst_status, num_in = ray.get([dst.status.remote(), dst.mig_num_reservations.remote()], timeout=30)
            return reports
        except Exception as e:  # noqa: BLE001 - a failed round is reported, never fatal
            for old in self._senders.values():
                with contextlib.suppress(Exception):
                    old.close()
            self._senders.clear()
            return [*reports, {"committed": False, "abort_reason": f"{type(e).__name__}: {e}",
                               "request_id": picked[0] if picked else None,
                               "src_instance_id": self.llm.engine.instance_id, "dst_instance_id": dst_instance_id}]
        finally:
            self._migrating.release()


class _RemoteDestination:
    """The Destination protocol over Ray calls to another instance actor."""

    def __init__(self, instance_id: str, actor: Any) -> None:
        self.instance_id = instance_id
        self._actor = actor

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        blocks: list[int] | None = ray.get(self._actor.mig_try_reserve.remote(request_id, num_blocks), timeout=30)
        return blocks

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        got: tuple[int, list[int]] | None = ray.get(self._actor.mig_try_reserve_with_cache.remote(request_id, keys),
                                                    timeout=30)
        return got

    def release(self, request_id: str) -> int:
        return int(ray.get(self._actor.mig_release.remote(request_id), timeout=30))

    def install(self, snapshot: Any) -> float:
        return float(ray.get(self._actor.mig_install.remote(snapshot), timeout=30))

    def first_step(self, request_id: str, timeout_s: float) -> tuple[float, float] | None:
        got: tuple[float, float] | None = ray.get(self._actor.mig_first_step.remote(request_id, timeout_s),
                                                  timeout=timeout_s + 30)
        return got


# threaded; gateways' membership watches wait in their own group, never taking the
# threads that dispatch, status pushes and hand-offs use
@ray.remote(max_concurrency=8, concurrency_groups={"watch": 64})  # type: ignore[call-overload]
class LlumSchedActor:
    def __init__(self, scheduling: dict[str, Any] | None, cms_url: str | None = None, seed: int = 0,
                 reschedule_interval_s: float = 0.5, instance_spec: dict[str, Any] | None = None,
                 name: str = LLUMSCHED_NAME) -> None:
        from llumnix.cluster.meta_store import RedisMetaStore, StoreWriter, make_meta_store
        from llumnix.cluster.pd import PDBook

        configure_logging()  # $LLUMNIX_LOG_LEVEL, from the serve process
        cfg = SchedulingConfig.from_dict(scheduling)
        self.gs = GlobalScheduler(cfg, seed=seed)
        self.pd = PDBook(cfg.pd, cfg.freeness)
        """PD roles, hand-off destinations and counts (``cluster/pd.py``)."""
        self._cms_url = cms_url
        store = make_meta_store(cms_url)
        # In memory the scheduler's own statuses are the store: nothing to copy. A shared
        # store is read by a sync thread and written off the lock (a hung Redis must not
        # stall dispatch); the instances write their own statuses to it.
        self._cms: RedisMetaStore | None = store if isinstance(store, RedisMetaStore) else None
        self._cms_writer: StoreWriter | None = None if self._cms is None else StoreWriter(self._cms)
        self.num_cms_syncs = 0
        self._lock = threading.Lock()
        self._members_cv = threading.Condition(self._lock)
        self._members_key: tuple[tuple[str, bool, str], ...] = ()
        self._members_version = (time.time_ns(), 0)
        """Changes with the members, their terminating flags and roles (its first part
        differs between restarts): what a gateway's ``watch_members`` waits on."""
        self.num_dispatched = 0
        self.handles: dict[str, Any] = {}
        self._in_flight: dict[str, Any] = {}  # source instance -> ObjectRef of its migrate_out
        self.migrations = MigrationHistory()
        self._interval = reschedule_interval_s
        self.health_timeout_s = 2.0
        self._name = name
        self._spec = instance_spec
        """How to start an instance (model, engine, token...): scale-out needs it."""
        self.lifecycle = Lifecycles()
        """Every instance's state (starting, serving, terminating, retired, failed): a gone
        one's late push revives nothing, and a scale-in victim is stopped once drained."""
        self._relearn: set[str] = set()  # terminating instances first heard of after a restart
        self.scaling_events: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._started_at = time.time()
        self._restarted = _was_restarted()
        self._target = int((instance_spec or {}).get("num_instances", 0))
        """The configured instance count: lost instances are replaced up to it."""
        self._armed = False
        self._replace_lost_instances = bool((instance_spec or {}).get("replace_lost", False))
        self._lost: deque[float] = deque()  # when each not yet replaced instance was lost
        self._replacing: dict[str, float] = {}  # new instance id -> when the one it replaces was lost
        self._next_replace = 0.0
        self.replace_backoff_s = 5.0
        self.num_replaced = 0
        gap = cfg.rescheduling.trigger_gap_s if cfg.rescheduling.enabled else None
        self._timer = PassTimer(reschedule_interval_s, gap)
        """When rescheduling passes run: triggered ones, and the periodic round (``policy/trigger.py``)."""
        self._wake = threading.Event()
        self.reactions = Reactions(cfg.rescheduling, cfg.freeness)
        self.reaction = ReactionHistogram()
        """From the step that made an instance a source to the first migration out of it."""
        self.num_passes = 0
        token = (instance_spec or {}).get("token")
        # Two statuses a round and, triggered, at once each status whose marks changed
        # (the one that makes a source): every status would cost per request.
        self.feed = None if not token else StatusFeed(token, self._on_fed_statuses, reschedule_interval_s / 2,
                                                      urgent_marks=gap is not None)
        """Lines to the instances' channels, where this actor reads their statuses
        (``status_feed``); None without the cluster's token (statuses come by push)."""
        self.num_resumed_from_cms = self._resume_from_cms()
        threading.Thread(target=self._reschedule_loop, daemon=True, name="rescheduler").start()
        if self._cms is not None:
            threading.Thread(target=self._cms_sync_loop, daemon=True, name="cms-sync").start()

    def _relearnt(self, instance_id: str, status: InstanceStatus) -> None:
        """First heard of after a restart of this actor (caller holds the lock)."""
        if status.is_terminating:  # a scale-in victim, or an admin drain? asked next round
            self.lifecycle.move(instance_id, InstanceState.TERMINATING, time.time(), "drain")
            self._relearn.add(instance_id)
        else:
            self.lifecycle.move(instance_id, InstanceState.SERVING, time.time())

    def _scaling_in(self) -> dict[str, float]:
        """Scale-in victims (stopped once drained) and since when."""
        return {iid: e.since for iid in self.lifecycle.ids(InstanceState.TERMINATING)
                if (e := self.lifecycle.get(iid)) is not None and e.reason == SCALE_IN}

    def cms_url(self) -> str | None:
        """Where the cluster's meta store is (None: in this actor's memory)."""
        return self._cms_url

    def register(self, status: InstanceStatus, handle: Any = None, role: str | None = None) -> None:
        """A started instance; ``role``: its PD role (None: LlumSched's rule, ``PDBook.add``)."""
        with self._lock:
            self.lifecycle.restart(status.instance_id, time.time())
            self.gs.add_instance(status)
            role = self._learn_role(status.instance_id, role)
            if handle is not None:
                self.handles[status.instance_id] = handle
            self._note_members()
        if handle is not None:
            self._feed_from(status.instance_id, handle)
        if handle is not None and self.pd.config.is_on:
            ray.get(handle.set_role.remote(role), timeout=30)

    def _learn_role(self, instance_id: str, reported: str | None) -> str:
        """The instance's PD role (the one it reports, after a restart of this actor), in
        the book and the dispatch view (caller holds the lock)."""
        role = self.pd.add(instance_id, time.time(), reported)
        self.gs.set_role(instance_id, role)
        return role

    def _resume_from_cms(self) -> int:
        """A (re)started LlumSched over a shared store takes its members and their latest
        statuses from it: it schedules at once, without waiting for every instance's next
        push. Members whose actor is gone are left to the health check's usual path."""
        if self._cms is None or self._cms_writer is None:
            return 0
        try:
            members, statuses = self._cms.members(), self._cms.all_statuses()
        except Exception as e:  # noqa: BLE001 - unreachable: relearn from the pushes instead
            log.warning("meta store %s unreachable at start (%s); instances are learnt from their pushes",
                        self._cms.url, type(e).__name__)
            return 0
        found = 0
        for iid, record in members.items():
            status = statuses.get(iid)
            if status is None:
                continue
            try:
                handle = ray.get_actor(record["actor_name"])
            except Exception:  # noqa: BLE001 - its actor is gone: a dead member
                self._cms_writer.remove_member(iid)
                continue
            self.gs.add_instance(status)
            self.handles[iid] = handle
            self._relearnt(iid, status)
            self._feed_from(iid, handle)
            found += 1
        if found:
            log.warning("resumed %d instance(s) from the meta store %s", found, self._cms.url)
        return found

    def _cms_sync_loop(self) -> None:
        """The view follows the shared store once per rescheduling round: statuses the
        instances wrote there that no push brought (the pushes over Ray carry the same
        statuses as they happen, and the events; the newest of either wins). Only newer
        ones take the lock, so at 1,024 instances a sync does not hold up dispatch."""
        assert self._cms is not None
        while True:
            time.sleep(self._interval)
            try:
                statuses = self._cms.all_statuses()
            except Exception:  # noqa: BLE001 - the writers log the outage; the pushes go on
                continue
            seen = self.gs.statuses
            newer = [s for iid, s in statuses.items()
                     if iid in self.handles and (old := seen.get(iid)) is not None and s.timestamp > old.timestamp]
            if newer:
                with self._lock:
                    for status in newer:
                        self.gs.update_status(status)
            self.num_cms_syncs += 1

    def remove_instance(self, instance_id: str, reason: str = "dead") -> bool:
        """Forget an instance (dead, or stopped by scale-in): no dispatch, no migration."""
        with self._lock:
            known = instance_id in self.handles or instance_id in self.gs.statuses
            now = time.time()
            if reason != SCALED_IN or not self.lifecycle.move(instance_id, InstanceState.RETIRED, now, reason):
                self.lifecycle.move(instance_id, InstanceState.FAILED, now, reason)
            self.gs.remove_instance(instance_id)
            self.reactions.remove(instance_id)
            self.pd.remove(instance_id)
            self.handles.pop(instance_id, None)
            self._in_flight.pop(instance_id, None)
            if self.feed is not None:
                self.feed.drop(instance_id)
            if self._cms_writer is not None:
                self._cms_writer.remove(instance_id)
                self._cms_writer.remove_member(instance_id)
            self._note_members()
            if known and reason != SCALED_IN:
                self._lost.append(now)
        if known:
            log.warning("instance %s removed (%s)", instance_id, reason)
        return known

    def gateway_setup(self) -> dict[str, Any]:
        """What a gateway needs to dispatch by itself over its request channels: the
        scheduling config (the same policy as here) and the cluster's token."""
        with self._lock:
            roles = dict(self.pd.roles)
        return {"scheduling": self.gs.config, "token": (self._spec or {}).get("token"), "roles": roles}

    def model_source(self) -> str | None:
        """The model the instances load ('smollm2', a path): where a gateway that joins
        later finds the tokenizer."""
        return None if self._spec is None else str(self._spec["model"])

    def members(self, known: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Every live instance, whether it is terminating, its PD role, and its actor
        handle unless the caller names it in ``known`` (a gateway needs the handles of
        new instances only; each costs it a deserialization)."""
        with self._lock:
            return self._members(set(known or ()))

    def _members(self, skip: set[str]) -> dict[str, dict[str, Any]]:
        return {iid: {"handle": None if iid in skip else h, "is_terminating": self._is_terminating(iid),
                      "role": self.pd.role_of(iid)} for iid, h in self.handles.items()}

    def _is_terminating(self, iid: str) -> bool:
        status = self.gs.statuses.get(iid)
        return bool(status is not None and status.is_terminating)

    @ray.method(concurrency_group="watch")
    def watch_members(self, known: list[str], seen: tuple[int, int] | None,
                      timeout_s: float) -> tuple[tuple[int, int], dict[str, dict[str, Any]]]:
        """The members (as ``members``) once they differ from version ``seen``, or after
        ``timeout_s``: a gateway learns a new instance, a drain or a role change as it
        happens, with one call a half-minute while nothing changes (a poll each second
        cost the gateway and this actor a Ray call each, most of their idle burn)."""
        deadline = time.monotonic() + timeout_s
        with self._members_cv:
            while self._members_version == seen and (left := deadline - time.monotonic()) > 0:
                self._members_cv.wait(left)
            return self._members_version, self._members(set(known))

    def _note_members(self) -> None:
        """Wake the membership watches if the members, a terminating flag or a role
        changed since the last note (caller holds the lock). Called where members come
        and go, and by every rescheduling round (flags and roles arrive with statuses
        and PD rounds)."""
        key = tuple(sorted((iid, self._is_terminating(iid), self.pd.role_of(iid)) for iid in self.handles))
        if key != self._members_key:
            self._members_key = key
            self._members_version = (self._members_version[0], self._members_version[1] + 1)
            self._members_cv.notify_all()

    def drain(self, instance_id: str) -> dict[str, Any]:
        """Mark an instance terminating: its fake request of infinite usage makes it a
        migration source until it is empty, and dispatch skips it."""
        handle = self._handle_for_admin(instance_id)
        ray.get(handle.set_terminating.remote(True), timeout=10)
        with self._lock:
            self.lifecycle.move(instance_id, InstanceState.TERMINATING, time.time(), "drain")
            self.gs.mark_terminating(instance_id)
        log.info("instance %s draining (admin): no new requests, its requests migrate out", instance_id)
        return {"instance_id": instance_id, "draining": True}

    def _handle_for_admin(self, instance_id: str) -> Any:
        """The instance's actor, or a one-line error the gateway answers with a 503: an
        instance a gateway lists but LlumSched does not know yet (LlumSched restarted and
        relearns instances from their next status push)."""
        handle = self.handles.get(instance_id)
        if handle is None:
            raise LlumnixError(f"LlumSched does not know instance {instance_id!r} (yet: after a restart it "
                               "learns each instance from its next status push); try again in a few seconds")
        return handle

    def undrain(self, instance_id: str) -> dict[str, Any]:
        """Undo a drain (or a scale-in still under way): the instance takes requests again."""
        handle = self._handle_for_admin(instance_id)
        ray.get(handle.set_terminating.remote(False), timeout=10)
        with self._lock:
            self.lifecycle.move(instance_id, InstanceState.SERVING, time.time())
            self.gs.unmark_terminating(instance_id)
        log.info("instance %s undrained (admin): takes requests again", instance_id)
        return {"instance_id": instance_id, "draining": False}

    def capacity(self) -> dict[str, Any]:
        """What /health compares with: the instance count to keep, and the instances
        serving (schedulable, not terminating) or being started in place of lost ones."""
        with self._lock:
            # a replacement counts once its replacement is booked (so /health's "ok" and
            # /admin/cluster's "replaced" event never disagree), until then as replacing
            serving = sorted(iid for iid in self.lifecycle.ids(InstanceState.SERVING)
                             if iid in self.handles and iid not in self._replacing
                             and (s := self.gs.statuses.get(iid)) is not None
                             and s.is_schedulable and not s.is_terminating)
            return {"target": self._capacity_target(), "serving": serving, "replacing": sorted(self._replacing)}

    def _capacity_target(self) -> int:
        scaling = self.gs.config.scaling
        return scaling.min_instances if scaling.enabled else self._target

    def _replace_lost(self) -> None:
        """Start an instance in place of each lost one, up to the configured count. Armed
        once the cluster was whole (or, after a restart of this actor, once it has heard
        from instances for a while), so a cluster still loading its models is left alone
        (a fresh start waits for all of them, however slow the loads)."""
        if not self._replace_lost_instances:
            return
        now = time.time()
        with self._lock:
            target = self._capacity_target()
            have = len(self.handles)
            if not self._armed:
                self._armed = have >= target > 0 or (self._restarted and have > 0 and now - self._started_at > 30.0)
            missing = target - have - len(self._replacing)
            if not self._armed or missing <= 0 or now < self._next_replace:
                return
            iid = self._new_instance_id()
            self._replacing[iid] = self._lost.popleft() if self._lost else now
        threading.Thread(target=self._replace, args=(iid,), daemon=True, name="replace").start()

    def _replace(self, iid: str) -> None:
        try:
            self._launch(iid)
        except Exception as e:  # noqa: BLE001 - tried again after the backoff
            log.warning("replacing a lost instance with %s failed: %s", iid, e)
            self.scaling_events.append({"time": time.time(), "kind": "replace-failed", "instance_id": iid,
                                        "reason": str(e)})
            with self._lock:
                self._lost.appendleft(self._replacing.pop(iid))
                self._next_replace = time.time() + self.replace_backoff_s
                self.lifecycle.move(iid, InstanceState.FAILED, time.time(), str(e))
            return
        with self._lock:
            now = time.time()
            seconds = now - self._replacing[iid]
            self.scaling_events.append({"time": now, "kind": "replaced", "instance_id": iid,
                                        "seconds_to_serve": seconds})
            self.num_replaced += 1
            del self._replacing[iid]  # last: capacity() counts it as serving from here
        log.warning("instance %s replaces a lost instance; serving %.1f s after the loss", iid, seconds)

    def _health_check(self) -> None:
        """Pull, as a fallback to the pushes: an instance silent for too long is asked
        directly; if it does not answer in time it is marked unschedulable, and if its
        actor is gone it is removed."""
        now = time.time()
        with self._lock:
            silent = [(iid, self.handles.get(iid)) for iid, s in self.gs.statuses.items()
                      if now - s.timestamp > self.health_timeout_s]
        for iid, handle in silent:
            ok = False
            if handle is not None:
                try:
                    ok = bool(ray.get(handle.health.remote(), timeout=self.health_timeout_s))
                except ray.exceptions.RayActorError:
                    self.remove_instance(iid, "its actor died")
                    continue
                except Exception:  # noqa: BLE001 - no answer is the answer
                    ok = False
            with self._lock:
                s = self.gs.statuses.get(iid)
                if s is not None and s.is_schedulable != ok:
                    log.warning("instance %s is %s", iid, "healthy again" if ok else "unresponsive")
                    self.gs.set_schedulable(iid, ok)

    def _reschedule_loop(self) -> None:
        """The periodic round (health, replacement, PD, rescheduling, scaling) every
        ``reschedule_interval_s``, and between rounds the rescheduling passes that statuses
        trigger (``_on_status``), at least ``trigger_gap_s`` apart."""
        last_health = 0.0
        with self._lock:
            self._timer.start(time.time())
        while True:
            what = self._next_due()
            try:
                if what == "pass":
                    self._reschedule_round()
                    continue
                if time.time() - last_health > self.health_timeout_s:
                    last_health = time.time()
                    self._health_check()
                self._replace_lost()
                self._pd_round()
                self._reschedule_round()
                if self.gs.config.scaling.enabled:
                    self._autoscale()
                elif self._scaling_in() or self._relearn:
                    self._stop_drained()
                with self._lock:
                    self._note_members()
            except Exception:  # noqa: BLE001 - one bad round must not end rescheduling
                log.exception("rescheduling %s failed", what)

    def _next_due(self) -> str:
        """Sleep until a triggered pass or the periodic round is due; which one."""
        timer = self._timer
        while True:
            with self._lock:
                now = time.time()
                what = timer.due(now)
                if what is not None:
                    timer.ran(what, now)  # a trigger during the pass asks for another
                    return what
                wait = timer.wait_s(now)
            self._wake.wait(wait)  # a trigger lost between wait and clear is still in the timer
            self._wake.clear()

    def _reschedule_round(self) -> None:
        with self._lock:
            self.num_passes += 1
            self._reap_finished()
            pairs = [(o.src_instance_id, o.dst_instance_id) for o in self.gs.reschedule(time.time())]
            for src_id, dst_id in pairs_to_start(pairs, self._in_flight, self.handles):
                self._in_flight[src_id] = self.handles[src_id].migrate_out.remote(dst_id, self.handles[dst_id])
                reaction = self.reactions.on_order(src_id, dst_id, time.time())
                if reaction is not None:
                    self.reaction.observe(reaction)

    def _on_status(self, instance_id: str) -> None:
        """After a status of ``instance_id`` was taken (caller holds the lock): wake the
        rescheduler if it makes a source, a blocked queue or a destination one waits for."""
        if self.gs.roles.get(instance_id, "mixed") not in DECODES:
            self.reactions.remove(instance_id)  # PD: rescheduling pairs only within the decode pool
            return
        status = self.gs.statuses.get(instance_id)
        if status is not None and self.reactions.on_status(status):
            self._timer.on_trigger()
            self._wake.set()

    # -- auto-scaling ----------------------------------------------------------------
    def _autoscale(self) -> None:
        """Sample the average freeness, act on the pure decision, and stop drained
        victims. Scale-out starts an instance actor that migration then fills; scale-in
        marks the victim terminating, so ordinary migration drains it, and stops it
        only once it is empty."""
        now = time.time()
        num_running = 0
        with self._lock:
            act = scaling_round(self.gs, now)
            if act.kind == "in" and act.instance_id in self.handles:
                self.gs.mark_terminating(act.instance_id)
                self.lifecycle.move(act.instance_id, InstanceState.TERMINATING, now, SCALE_IN)
                num_running = self.gs.statuses[act.instance_id].num_running
        if act.kind != "none":
            self.scaling_events.append({"time": now, "kind": act.kind, "instance_id": act.instance_id,
                                        "reason": act.reason, "num_running": num_running})
            log.warning("auto-scaling: %s %s (%s)", act.kind, act.instance_id or "", act.reason)
        if act.kind == "out":
            threading.Thread(target=self._start_instance, daemon=True, name="scale-out").start()
        elif act.kind == "in" and act.instance_id in self.handles:
            with contextlib.suppress(Exception):  # its next report carries the flag anyway
                ray.get(self.handles[act.instance_id].set_terminating.remote(True, True), timeout=10)
        self._stop_drained()

    def _relearn_victims(self) -> None:
        """After a restart: a terminating instance that scale-in marked is still to be
        stopped once empty (the instance remembers; an admin drain is left running)."""
        with self._lock:
            ask = [(iid, self.handles.get(iid)) for iid in self._relearn]
            self._relearn.clear()
        for iid, handle in ask:
            try:
                victim = handle is not None and bool(ray.get(handle.is_scaling_in.remote(), timeout=2))
            except Exception:  # noqa: BLE001 - not answering: asked again after its next push
                with self._lock:
                    self._relearn.add(iid)
                continue
            if victim:
                with self._lock:
                    if iid in self.handles:
                        self.lifecycle.move(iid, InstanceState.TERMINATING, time.time(), SCALE_IN)
                log.warning("instance %s is still being scaled in; stopped once empty", iid)

    def _stop_drained(self) -> None:
        if self._relearn:
            self._relearn_victims()
        with self._lock:
            ready = [(iid, self.handles.get(iid)) for iid in victims_to_stop(
                self._scaling_in(), self.gs.statuses, self._in_flight, time.time(), settle_s=1.0)]
        for iid, handle in ready:
            try:
                # The instance itself decides at a step boundary, so nothing that
                # arrived since its last report is lost; it refuses new work from then on.
                if handle is None or not ray.get(handle.close_if_idle.remote(), timeout=10):
                    continue
            except ray.exceptions.RayActorError:
                pass  # already gone: nothing to stop
            self.remove_instance(iid, SCALED_IN)
            self.scaling_events.append({"time": time.time(), "kind": "stopped", "instance_id": iid})
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.get(handle.shutdown.remote(), timeout=10)
                ray.kill(handle)

    def _new_instance_id(self) -> str:
        """The next ``instance-N`` no instance has had (called under the lock)."""
        used = [int(i.rsplit("-", 1)[1]) for i in (*self.handles, *self.lifecycle.all_ids(), *self._replacing)
                if i.rsplit("-", 1)[-1].isdigit()]
        iid = f"instance-{max(used, default=-1) + 1}"
        self.lifecycle.move(iid, InstanceState.STARTING, time.time())
        return iid

    def _start_instance(self) -> None:
        with self._lock:
            iid = self._new_instance_id()
        try:
            self._launch(iid)
        except Exception as e:  # noqa: BLE001 - the scheduler may try again after its cooldown
            with self._lock:
                self.lifecycle.move(iid, InstanceState.FAILED, time.time(), str(e))
            self._scale_out_failed(iid, str(e))
            return
        self.scaling_events.append({"time": time.time(), "kind": "started", "instance_id": iid})

    def _launch(self, iid: str) -> None:
        """Start instance ``iid`` and register it once it serves; raises if it cannot."""
        spec = self._spec
        if spec is None:
            raise LlumnixError("no instance spec")
        gpus = float(spec.get("num_gpus", 0))
        free = float(ray.available_resources().get("GPU", 0)) if gpus else 0.0  # type: ignore[no-untyped-call]
        if gpus > free + 1e-9:
            # Ray would keep the actor pending until start_timeout_s; refuse now and let
            # the caller try again later (a GPU may be free by then).
            raise LlumnixError(f"it needs {gpus:g} GPU and {free:g} are free")
        handle = None
        try:
            # Detached, so it outlives a restart of this actor (its owner).
            handle = InstanceActor.options(name=f"{self._name}-{iid}", lifetime="detached",  # type: ignore[attr-defined]
                                           num_cpus=0, num_gpus=spec.get("num_gpus", 0),
                                           resources=dict(spec.get("resources") or {})).remote(
                iid, spec["model"], dict(spec["engine"]), spec["scheduling"], self._name,
                spec["threads"], spec["token"], dict(spec["migration"]))
            ray.get(handle.ready.remote(), timeout=float(spec.get("start_timeout_s", 300)))
            status = ray.get(handle.status.remote(), timeout=30)
            self.register(status, handle)
        except Exception:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
            raise

    def _scale_out_failed(self, iid: str, why: str) -> None:
        log.warning("auto-scaling: starting %s failed: %s", iid, why)
        self.scaling_events.append({"time": time.time(), "kind": "start-failed", "instance_id": iid, "reason": why})
        with self._lock:
            self.gs.on_scale_out_failed()

    def migration_reported(self, report: dict[str, Any]) -> None:
        """One migration of a round still under way, as it ends (the round's return, which
        the history counts once, comes later)."""
        with self._lock:
            self.migrations.add([report], time.time())

    def _reap_finished(self) -> None:
        done = [k for k, ref in self._in_flight.items() if ray.wait([ref], timeout=0)[0]]
        for k in done:
            try:
                reports = ray.get(self._in_flight.pop(k))
            except Exception as e:  # noqa: BLE001 - a dead source: recorded as a failed round
                reports = [{"committed": False, "abort_reason": repr(e), "src_instance_id": k}]
            self.migrations.add(reports, time.time())

    def update_status(self, status: InstanceStatus, handle: Any = None, role: str | None = None) -> None:
        if handle is None and status.instance_id not in self.gs.statuses:
            handle = self._named_instance(status.instance_id)  # pushes carry the handle only now and then
        with self._lock:
            if self.lifecycle.is_gone(status.instance_id):
                return  # a late push of a dead or stopped instance
            if status.instance_id not in self.gs.statuses:
                if handle is None:
                    return
                self.gs.add_instance(status)  # first push after a restart of this actor
                self.handles[status.instance_id] = handle
                self._relearnt(status.instance_id, status)
                self._feed_from(status.instance_id, handle)
                if role is not None and self.pd.config.is_on:  # a role it was given before
                    self._learn_role(status.instance_id, role)
            self.gs.update_status(status)
            self._on_status(status.instance_id)
            self.pd.on_status(status.instance_id)
            fix = self.pd.reconcile(status.instance_id, role, time.time())
            target = self.handles.get(status.instance_id) if fix is not None else None
        if target is not None:
            with contextlib.suppress(Exception):  # the next push says whether it took it
                target.set_role.remote(fix)

    def _on_fed_statuses(self, instance_id: str, statuses: list[InstanceStatus]) -> None:
        """Statuses read on the line to ``instance_id``'s channel (the feed's thread): as a
        push's, for an instance this actor knows (a push or a registration brings new
        ones, with their handles)."""
        with self._lock:
            if self.lifecycle.is_gone(instance_id) or instance_id not in self.gs.statuses:
                return
            for status in statuses:
                self.gs.update_status(status, refresh=False)  # views rebuilt when next read
                self._on_status(instance_id)
            self.pd.on_status(instance_id)

    def _feed_from(self, instance_id: str, handle: Any) -> None:
        """Open the feed's line to a newly known instance (its channel's address asked off
        the caller's path; an instance that cannot say keeps pushing over Ray)."""
        feed = self.feed
        if feed is None:
            return

        def resolve() -> None:
            try:
                host, port = ray.get(handle.channel_address.remote(), timeout=30)
            except Exception as e:  # noqa: BLE001 - dead, or an older instance: statuses come by push
                log.info("status feed: no channel address for %s (%s)", instance_id, type(e).__name__)
                return
            if not self.lifecycle.is_gone(instance_id):
                feed.watch(instance_id, (str(host), int(port)))

        threading.Thread(target=resolve, daemon=True, name="feed-resolve").start()

    def _named_instance(self, instance_id: str) -> Any:
        """The actor of an instance this LlumSched does not know yet (after a restart), by
        the name the launcher gave it; None if there is none (or it is gone)."""
        if self.lifecycle.is_gone(instance_id):
            return None
        try:
            return ray.get_actor(f"{self._name}-{instance_id}")
        except Exception:  # noqa: BLE001 - not a named instance of this cluster: its next handle
            return None

    # -- PD (cluster/pd.py) ----------------------------------------------------------
    def pd_destination(self, src_id: str, request_id: str, num_blocks: int) -> tuple[str, Any] | None:
        """Where a prefill instance hands ``request_id`` (holding ``num_blocks``) off: a
        decode instance and its handle, or None while the decode pool has no room."""
        with self._lock:
            dst = self.pd.pick(self.gs.statuses.values(), src_id, num_blocks)
            return None if dst is None or dst not in self.handles else (dst, self.handles[dst])

    def pd_handoff_done(self, src_id: str, report: dict[str, Any]) -> None:
        with self._lock:
            self.pd.on_handoff({**report, "src_instance_id": src_id})  # the dashboard lists it by both ends

    def _pd_round(self) -> None:
        """Adaptive PD: this round's role changes (several lends at once under a burst,
        ``max_lends_per_round``), each told to its instance at once (gateways learn them
        with their next membership refresh)."""
        if self.pd.config.mode != "adaptive":
            return
        now = time.time()
        told = []
        with self._lock:
            for change in self.pd.decide_all(dict(self.gs.statuses), now):
                if change.instance_id not in self.handles:
                    continue
                self.pd.apply(change, now)
                self.gs.set_role(change.instance_id, change.role)
                told.append((change, self.handles[change.instance_id]))
        for change, handle in told:
            log.warning("PD: %s -> %s (%s)", change.instance_id, change.role, change.reason)
            with contextlib.suppress(Exception):  # its next push carries the role it took
                ray.get(handle.set_role.remote(change.role), timeout=10)

    def dispatch(self, req: DispatchRequest) -> str | None:
        with self._lock:
            iid = self.gs.dispatch(req, time.time())
            self.num_dispatched += iid is not None
            return iid

    def submit(self, request: GenerateRequest) -> tuple[str, list[Any]] | None:
        """Dispatch and forward in one hop, so a gateway waits for one call instead of two:
        the chosen instance id and ``[ref]``, the ObjectRef of that instance's
        ``add_request`` (in a list, so Ray hands over the reference, not its value), which
        the gateway checks off its critical path. ``[]`` when the instance's handle is
        unknown here (the gateway adds the request itself); None when nothing can take it."""
        iid = self.dispatch(DispatchRequest(request.request_id, len(request.prompt_token_ids),
                                            request.priority, request.arrival_time,
                                            request.prompt_token_ids))
        if iid is None:
            return None
        handle = self.handles.get(iid)
        return iid, ([] if handle is None else [handle.add_request.remote(request)])

    def _lifecycle_of(self, instance_id: str) -> dict[str, Any]:
        """An instance's lifecycle state and why it is there, as ``/admin/cluster`` lists them."""
        e = self.lifecycle.get(instance_id)
        if e is None:
            return {"lifecycle": None, "lifecycle_reason": None}
        return {"lifecycle": e.state.name.lower(), "lifecycle_reason": e.reason}

    def cluster_info(self) -> dict[str, Any]:
        from llumnix.cluster.meta_store import status_summary

        with self._lock:
            fcfg, now = self.gs.config.freeness, time.time()
            index = self.gs.prefix_index
            return {"dispatch_policy": self.gs.config.dispatch.policy,
                    "started_at": self._started_at, "pid": os.getpid(),
                    "num_resumed_from_cms": self.num_resumed_from_cms,
                    "prefix_affinity": index is not None,
                    "num_dispatched": self.num_dispatched,
                    "migrations": self.migrations.summary(self._in_flight),
                    "scaling": {"enabled": self.gs.config.scaling.enabled,
                                "num_starting": self.gs.num_starting,
                                "draining": sorted(self._scaling_in()),
                                "events": list(self.scaling_events)[-50:]},
                    "capacity": {"target": self._capacity_target(), "num_replaced": self.num_replaced,
                                 "replacing": sorted(self._replacing)},
                    "pd": self.pd.info(),
                    "rescheduling": {"num_passes": self.num_passes, "num_triggers": self.reactions.num_triggers,
                                     "trigger_gap_s": self._timer.min_gap_s,
                                     "reaction": self.reaction.summary()},
                    "status_feed": None if self.feed is None else {
                        "live": sorted(i for i in self.gs.statuses if self.feed.is_live(i)),
                        "num_frames": self.feed.num_frames},
                    "instances": [{**status_summary(s, fcfg, now), "role": self.pd.role_of(s.instance_id),
                                   **self._lifecycle_of(s.instance_id),
                                   # prompt blocks LlumSched remembers sending there (prefix affinity)
                                   "prefix_blocks_sent": None if index is None else index.size(s.instance_id),
                                   # keys forgotten so far because the instance reported them evicted
                                   "prefix_blocks_forgotten": (None if index is None
                                                               else index.num_forgotten.get(s.instance_id, 0))}
                                  for s in self.gs.statuses.values()]}
