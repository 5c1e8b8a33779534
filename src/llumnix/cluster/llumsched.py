"""LlumSched's actor: the global scheduler's Ray face. It registers instances, takes
their statuses, dispatches for gateways that cannot, runs the periodic round (health,
replacement, PD, rescheduling, scaling) and answers the admin routes. Its parts:
``SchedState`` (what they share), ``Membership`` (the gateways' watch), ``Rescheduler``
(migration passes), ``Replacement`` (lost instances, auto-scaling)."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from typing import Any

import ray

from llumnix.cluster.cluster_pulse import ClusterPulse
from llumnix.cluster.cms_mirror import CmsMirror
from llumnix.cluster.instance_actor import LLUMSCHED_NAME
from llumnix.cluster.llumsched_state import SchedState
from llumnix.cluster.membership import Membership
from llumnix.cluster.replacement import SCALED_IN, Replacement
from llumnix.cluster.rescheduler import Rescheduler
from llumnix.cluster.status_feed import StatusFeed
from llumnix.core.errors import LlumnixError
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest
from llumnix.logging_setup import configure_logging
from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig
from llumnix.policy.lifecycle import InstanceState

__all__ = ["LLUMSCHED_NAME", "LlumSchedActor"]
log = logging.getLogger(__name__)


def _was_restarted() -> bool:
    """This actor is a restart (Ray reconstructed it after it died), not a fresh start."""
    if not ray.is_initialized():  # outside Ray (tests): asking would start a local Ray session
        return False
    try:
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id:
            warnings.simplefilter("ignore", DeprecationWarning)  # a warning in every quick start
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - outside an actor (tests): a fresh start
        return False


# threaded; gateways' membership watches wait in their own group, never taking the
# threads that dispatch, announcements and hand-offs use
@ray.remote(max_concurrency=8, concurrency_groups={"watch": 64})  # type: ignore[call-overload]
class LlumSchedActor:
    def __init__(self, scheduling: SchedulingConfig | None, cms_url: str | None = None, seed: int = 0,
                 reschedule_interval_s: float = 0.5, instance_spec: dict[str, Any] | None = None,
                 name: str = LLUMSCHED_NAME) -> None:
        from llumnix.cluster.pd import PDBook

        configure_logging()  # $LLUMNIX_LOG_LEVEL, from the serve process
        cfg = scheduling or SchedulingConfig()  # built and checked once, in the serve process
        gs = GlobalScheduler(cfg, seed=seed)
        self.state = st = SchedState(gs, PDBook(cfg.pd, cfg.freeness, gs.cluster))
        self.gs, self.pd, self.handles, self.lifecycle = st.gs, st.pd, st.handles, st.lifecycle
        self._lock = st.lock
        self.cms = CmsMirror(cms_url, st)
        self.membership = Membership(st)
        self.pulse = ClusterPulse()
        """Wakes the gateways' watches of ``cluster_info`` (``watch_cluster``) when it may have changed."""
        self.num_dispatched = 0
        self.health_timeout_s = 2.0
        self._name = name
        self._spec = instance_spec
        self.replacement = Replacement(st, instance_spec, name, _was_restarted(),
                                       register=lambda s, h: self.register(s, h), remove=self.remove_instance)
        self.rescheduler = Rescheduler(st, cfg, reschedule_interval_s)
        token = (instance_spec or {}).get("token")
        # Two statuses a round and, triggered, at once each status whose marks changed
        # (the one that makes a source): every status would cost per request.
        self.feed = None if not token else StatusFeed(token, self._on_fed_statuses, reschedule_interval_s / 2,
                                                      urgent_marks=self.rescheduler.is_triggered)
        """Lines to the instances' channels, the one road by which this actor reads their
        statuses (``status_feed``); None without the cluster's token (a benchmark's or a
        test's LlumSched that schedules nothing: it keeps the registration status)."""
        self.num_resumed_from_cms = self.cms.resume(self._relearn)
        self._closed = threading.Event()
        threading.Thread(target=self._reschedule_loop, daemon=True, name="rescheduler").start()

    def close(self) -> None:
        """Stop the periodic round (at its next wake-up) and the feed: for a LlumSched driven
        in process (tests, benchmarks); Ray's actor ends with its process."""
        self._closed.set()
        self.pulse.close()
        if self.feed is not None:
            self.feed.close()

    def cms_url(self) -> str | None:
        """Where the cluster's meta store is (None: in this actor's memory)."""
        return self.cms.url

    # -- membership -------------------------------------------------------------------
    def register(self, status: InstanceStatus, handle: Any = None, role: str | None = None) -> None:
        """A started instance; ``role``: its PD role (None: LlumSched's rule, ``PDBook.add``)."""
        with self._lock:
            self.lifecycle.restart(status.instance_id, time.time())
            self.gs.add_instance(status)
            role = self._learn_role(status.instance_id, role)
            if handle is not None:
                self.handles[status.instance_id] = handle
            self.membership.note()
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

    def _relearn(self, instance_id: str, status: InstanceStatus, handle: Any) -> None:
        """An instance first heard of after a restart of this actor (caller holds the lock)."""
        self.gs.add_instance(status)
        self.handles[instance_id] = handle
        self.replacement.relearnt(instance_id, status)
        self._feed_from(instance_id, handle)

    def remove_instance(self, instance_id: str, reason: str = "dead") -> bool:
        """Forget an instance (dead, or stopped by scale-in): no dispatch, no migration."""
        with self._lock:
            known = instance_id in self.handles or instance_id in self.gs.statuses
            now = time.time()
            if reason != SCALED_IN or not self.lifecycle.move(instance_id, InstanceState.RETIRED, now, reason):
                self.lifecycle.move(instance_id, InstanceState.FAILED, now, reason)
            self.gs.remove_instance(instance_id)
            self.rescheduler.remove(instance_id)
            self.pd.remove(instance_id)
            self.handles.pop(instance_id, None)
            if self.feed is not None:
                self.feed.drop(instance_id)
            self.cms.remove(instance_id)
            self.membership.note()
            if known and reason != SCALED_IN:
                self.replacement.on_lost(now)
        self.pulse.note()
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
            return self.membership.members(set(known or ()))

    @ray.method(concurrency_group="watch")
    def watch_members(self, known: list[str], seen: tuple[int, int] | None,
                      timeout_s: float) -> tuple[tuple[int, int], dict[str, dict[str, Any]]]:
        """The members (as ``members``) once they differ from version ``seen``, or after
        ``timeout_s``: a gateway learns a new instance, a drain or a role change as it
        happens, with one call a half-minute while nothing changes (a poll each second
        cost the gateway and this actor a Ray call each, most of their idle burn)."""
        return self.membership.watch(known, seen, timeout_s)

    @ray.method(concurrency_group="watch")
    def watch_cluster(self, seen: Any, timeout_s: float) -> tuple[tuple[int, int], dict[str, Any]]:
        """``cluster_info`` and its version once that differs from ``seen``, or after
        ``timeout_s``: the dashboard and ``llumnix top`` see a change as it happens, and an
        idle cluster costs one call per ``timeout_s`` (``cluster_pulse.py``)."""
        return self.pulse.watch(seen, timeout_s, self.cluster_info)

    # -- admin ------------------------------------------------------------------------
    def drain(self, instance_id: str) -> dict[str, Any]:
        """Mark an instance terminating: its fake request of infinite usage makes it a
        migration source until it is empty, and dispatch skips it."""
        handle = self._handle_for_admin(instance_id)
        ray.get(handle.set_terminating.remote(True), timeout=10)
        with self._lock:
            self.lifecycle.move(instance_id, InstanceState.TERMINATING, time.time(), "drain")
            self.gs.mark_terminating(instance_id)
        self.pulse.note()
        log.info("instance %s draining (admin): no new requests, its requests migrate out", instance_id)
        return {"instance_id": instance_id, "draining": True}

    def _handle_for_admin(self, instance_id: str) -> Any:
        """The instance's actor, or a one-line error the gateway answers with a 503: an
        instance a gateway lists but LlumSched does not know yet (LlumSched restarted and
        relearns instances from their next announcement)."""
        handle = self.handles.get(instance_id)
        if handle is None:
            raise LlumnixError(f"LlumSched does not know instance {instance_id!r} (yet: after a restart it "
                               "learns each instance from its next announcement); try again in a few seconds")
        return handle

    def undrain(self, instance_id: str) -> dict[str, Any]:
        """Undo a drain (or a scale-in still under way): the instance takes requests again."""
        handle = self._handle_for_admin(instance_id)
        ray.get(handle.set_terminating.remote(False), timeout=10)
        with self._lock:
            self.lifecycle.move(instance_id, InstanceState.SERVING, time.time())
            self.gs.unmark_terminating(instance_id)
        self.pulse.note()
        log.info("instance %s undrained (admin): takes requests again", instance_id)
        return {"instance_id": instance_id, "draining": False}

    def capacity(self) -> dict[str, Any]:
        """What /health compares with: the instance count to keep, and the instances
        serving (schedulable, not terminating) or being started in place of lost ones."""
        with self._lock:
            return self.replacement.capacity()

    def start_instance(self) -> None:
        """Start one more instance now, as a scale-out would (tests, operators)."""
        self.replacement.start_instance()

    # -- the periodic round ---------------------------------------------------------------
    def _health_check(self) -> None:
        """Pull, as a fallback to the feed: an instance silent for too long is asked
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
        trigger (``Rescheduler.on_status``), at least ``trigger_gap_s`` apart."""
        last_health = 0.0
        with self._lock:
            self.rescheduler.timer.start(time.time())
        while not self._closed.is_set():
            what = self.rescheduler.next_due()
            if self._closed.is_set():
                return
            try:
                if what == "pass":
                    self.rescheduler.run_pass()
                    self.pulse.note()  # migrations it started
                    continue
                if time.time() - last_health > self.health_timeout_s:
                    last_health = time.time()
                    self._health_check()
                self.replacement.replace_lost()
                self._pd_round()
                self.rescheduler.run_pass()
                if self.gs.config.scaling.enabled:
                    self.replacement.autoscale()
                elif self.replacement.has_victims():
                    self.replacement.stop_drained()
                with self._lock:
                    self.membership.note()
                self.pulse.note()
            except Exception:  # noqa: BLE001 - one bad round must not end rescheduling
                log.exception("rescheduling %s failed", what)

    def migration_reported(self, report: dict[str, Any]) -> None:
        """One migration of a round still under way, as it ends (the round's return, which
        the history counts once, comes later)."""
        with self._lock:
            self.rescheduler.on_report(report)
        self.pulse.note()

    # -- statuses: one road, the instances' channels (``status_feed``) ----------------------
    def announce(self, instance_id: str, handle: Any, role: str | None = None) -> None:
        """An instance's announcement (``announce.Announcer``, every two seconds): its
        actor handle and PD role, never a status. One this actor does not know (it was
        restarted) is relearnt: its current status asked once, as a registration does, and
        a line opened to its channel, where every later status comes from."""
        with self._lock:
            if self.lifecycle.is_gone(instance_id):
                return  # a late word of a dead or stopped instance
            known = instance_id in self.gs.statuses
            fix = self.pd.reconcile(instance_id, role, time.time()) if known else None
        if not known:
            self._relearn_announced(instance_id, handle, role)
        elif fix is not None:
            with contextlib.suppress(Exception):  # the next announcement says whether it took it
                handle.set_role.remote(fix)

    def _relearn_announced(self, instance_id: str, handle: Any, role: str | None) -> None:
        try:
            status = ray.get(handle.status.remote(), timeout=10)
        except Exception as e:  # noqa: BLE001 - dead or busy: its next announcement tries again
            log.info("could not relearn instance %s (%s)", instance_id, type(e).__name__)
            return
        with self._lock:
            if self.lifecycle.is_gone(instance_id) or instance_id in self.gs.statuses:
                return
            self._relearn(instance_id, status, handle)
            if role is not None and self.pd.config.is_on:  # a role it was given before
                self._learn_role(instance_id, role)
            self.membership.note()

    def _on_fed_statuses(self, instance_id: str, statuses: list[InstanceStatus]) -> None:
        """Statuses read on the line to ``instance_id``'s channel (the feed's thread), the
        only road a status takes into this actor's view after registration."""
        with self._lock:
            if self.lifecycle.is_gone(instance_id) or instance_id not in self.gs.statuses:
                return
            for status in statuses:
                self.gs.update_status(status, refresh=False)  # views rebuilt when next read
                self.rescheduler.on_status(instance_id)
            self.pd.on_status(instance_id)
        self.pulse.note()

    def _feed_from(self, instance_id: str, handle: Any) -> None:
        """Open the feed's line to a newly known instance (its channel's address asked off
        the caller's path)."""
        feed = self.feed
        if feed is None:
            return

        def resolve() -> None:
            try:
                host, port = ray.get(handle.channel_address.remote(), timeout=30)
            except Exception as e:  # noqa: BLE001 - dead: the health check removes it
                log.info("status feed: no channel address for %s (%s)", instance_id, type(e).__name__)
                return
            if not self.lifecycle.is_gone(instance_id):
                feed.watch(instance_id, (str(host), int(port)))

        threading.Thread(target=resolve, daemon=True, name="feed-resolve").start()

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
        self.pulse.note()

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
            with contextlib.suppress(Exception):  # its next announcement carries the role it took
                ray.get(handle.set_role.remote(change.role), timeout=10)

    # -- dispatch -----------------------------------------------------------------------
    def dispatch(self, req: DispatchRequest) -> str | None:
        with self._lock:
            iid = self.gs.dispatch(req, time.time())
            self.num_dispatched += iid is not None
            return iid

    def submit(self, request: GenerateRequest, arrival: float | None = None) -> tuple[str, list[Any]] | None:
        """Dispatch and forward in one hop, so a gateway waits for one call instead of two:
        the chosen instance id and ``[ref]``, the ObjectRef of that instance's
        ``add_request`` (in a list, so Ray hands over the reference, not its value), which
        the gateway checks off its critical path. ``[]`` when the instance's handle is
        unknown here (the gateway adds the request itself); None when nothing can take it.
        ``arrival``: the request's arrival on the wall clock (its own is the gateway's
        monotonic one)."""
        iid = self.dispatch(DispatchRequest(request.request_id, len(request.prompt_token_ids),
                                            request.priority, time.time() if arrival is None else arrival,
                                            request.prompt_token_ids, request.slo_class))
        if iid is None:
            return None
        handle = self.handles.get(iid)
        return iid, ([] if handle is None else [handle.add_request.remote(request)])

    def cluster_info(self) -> dict[str, Any]:
        from llumnix.cluster.meta_store import status_summary

        with self._lock:
            fcfg, now = self.gs.config.freeness, time.time()
            index = self.gs.prefix_index
            scaling, capacity = self.replacement.info()
            return {"dispatch_policy": self.gs.config.dispatch.policy,
                    "started_at": self.replacement.started_at, "pid": os.getpid(),
                    "num_resumed_from_cms": self.num_resumed_from_cms,
                    "prefix_affinity": index is not None,
                    "num_dispatched": self.num_dispatched,
                    "migrations": self.rescheduler.migrations.summary(self.state.in_flight),
                    "scaling": scaling, "capacity": capacity, "pd": self.pd.info(),
                    "rescheduling": self.rescheduler.info(),
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

    def _lifecycle_of(self, instance_id: str) -> dict[str, Any]:
        """An instance's lifecycle state and why it is there, as ``/admin/cluster`` lists them."""
        e = self.lifecycle.get(instance_id)
        if e is None:
            return {"lifecycle": None, "lifecycle_reason": None}
        return {"lifecycle": e.state.name.lower(), "lifecycle_reason": e.reason}
