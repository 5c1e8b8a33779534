"""LlumSched's capacity: instances started in place of lost ones (up to the configured
count), auto-scaling (scale-out starts an instance actor; scale-in marks a victim
terminating so migration drains it, then stops it once empty), the victims a restarted
LlumSched relearns from their instances, and the ids new instances get."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import ray

from llumnix.cluster.history import HISTORY
from llumnix.cluster.instance_actor import InstanceActor
from llumnix.cluster.llumsched_state import SchedState
from llumnix.core.errors import LlumnixError
from llumnix.core.status import InstanceStatus
from llumnix.policy.lifecycle import InstanceState
from llumnix.policy.rounds import scaling_round, victims_to_stop

SCALED_IN = "scaled in"
"""``remove_instance``'s reason for a planned stop: the one loss that is not replaced."""
SCALE_IN = "scale-in"
"""The reason of a TERMINATING instance that is stopped once drained (an admin drain is not)."""
log = logging.getLogger(__name__)


class Replacement:
    def __init__(self, state: SchedState, spec: dict[str, Any] | None, name: str, restarted: bool,
                 register: Callable[[InstanceStatus, Any], None],
                 remove: Callable[[str, str], bool]) -> None:
        self._state = state
        self._spec = spec
        """How to start an instance (model, engine, token...): scale-out needs it."""
        self._name = name
        self._restarted = restarted
        self._register = register
        self._remove = remove
        self.started_at = time.time()
        self.scaling_events: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._target = int((spec or {}).get("num_instances", 0))
        """The configured instance count: lost instances are replaced up to it."""
        self._armed = False
        self._enabled = bool((spec or {}).get("replace_lost", False))
        self._lost: deque[float] = deque()  # when each not yet replaced instance was lost
        self.replacing: dict[str, float] = {}  # new instance id -> when the one it replaces was lost
        self._next_replace = 0.0
        self.replace_backoff_s = 5.0
        self.num_replaced = 0
        self._relearn: set[str] = set()  # terminating instances first heard of after a restart

    # -- the view (caller holds the lock) -------------------------------------------------
    def relearnt(self, instance_id: str, status: InstanceStatus) -> None:
        """First heard of after a restart of LlumSched."""
        lc = self._state.lifecycle
        if status.is_terminating:  # a scale-in victim, or an admin drain? asked next round
            lc.move(instance_id, InstanceState.TERMINATING, time.time(), "drain")
            self._relearn.add(instance_id)
        else:
            lc.move(instance_id, InstanceState.SERVING, time.time())

    def scaling_in(self) -> dict[str, float]:
        """Scale-in victims (stopped once drained) and since when."""
        lc = self._state.lifecycle
        return {iid: e.since for iid in lc.ids(InstanceState.TERMINATING)
                if (e := lc.get(iid)) is not None and e.reason == SCALE_IN}

    def on_lost(self, now: float) -> None:
        self._lost.append(now)

    def target(self) -> int:
        scaling = self._state.gs.config.scaling
        return scaling.min_instances if scaling.enabled else self._target

    def capacity(self) -> dict[str, Any]:
        """The instance count to keep, and the instances serving (schedulable, not
        terminating) or being started in place of lost ones."""
        st = self._state
        # a replacement counts once its replacement is booked (so /health's "ok" and
        # /admin/cluster's "replaced" event never disagree), until then as replacing
        serving = sorted(iid for iid in st.lifecycle.ids(InstanceState.SERVING)
                         if iid in st.handles and iid not in self.replacing
                         and (s := st.gs.statuses.get(iid)) is not None
                         and s.is_schedulable and not s.is_terminating)
        return {"target": self.target(), "serving": serving, "replacing": sorted(self.replacing)}

    def info(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``cluster_info``'s scaling and capacity sections."""
        gs = self._state.gs
        return ({"enabled": gs.config.scaling.enabled, "num_starting": gs.num_starting,
                 "draining": sorted(self.scaling_in()), "events": list(self.scaling_events)[-50:]},
                {"target": self.target(), "num_replaced": self.num_replaced, "replacing": sorted(self.replacing)})

    def new_instance_id(self) -> str:
        """The next ``instance-N`` no instance has had."""
        st = self._state
        used = [int(i.rsplit("-", 1)[1]) for i in (*st.handles, *st.lifecycle.all_ids(), *self.replacing)
                if i.rsplit("-", 1)[-1].isdigit()]
        iid = f"instance-{max(used, default=-1) + 1}"
        st.lifecycle.move(iid, InstanceState.STARTING, time.time())
        return iid

    # -- replacement of lost instances ------------------------------------------------------
    def replace_lost(self) -> None:
        """Start an instance in place of each lost one, up to the configured count. Armed
        once the cluster was whole (or, after a restart of LlumSched, once it has heard
        from instances for a while), so a cluster still loading its models is left alone
        (a fresh start waits for all of them, however slow the loads)."""
        if not self._enabled:
            return
        now = time.time()
        with self._state.lock:
            target = self.target()
            have = len(self._state.handles)
            if not self._armed:
                self._armed = have >= target > 0 or (self._restarted and have > 0 and now - self.started_at > 30.0)
            missing = target - have - len(self.replacing)
            if not self._armed or missing <= 0 or now < self._next_replace:
                return
            iid = self.new_instance_id()
            self.replacing[iid] = self._lost.popleft() if self._lost else now
        threading.Thread(target=self.replace, args=(iid,), daemon=True, name="replace").start()

    def replace(self, iid: str) -> None:
        try:
            self.launch(iid)
        except Exception as e:  # noqa: BLE001 - tried again after the backoff
            log.warning("replacing a lost instance with %s failed: %s", iid, e)
            self.scaling_events.append({"time": time.time(), "kind": "replace-failed", "instance_id": iid,
                                        "reason": str(e)})
            with self._state.lock:
                self._lost.appendleft(self.replacing.pop(iid))
                self._next_replace = time.time() + self.replace_backoff_s
                self._state.lifecycle.move(iid, InstanceState.FAILED, time.time(), str(e))
            return
        with self._state.lock:
            now = time.time()
            seconds = now - self.replacing[iid]
            self.scaling_events.append({"time": now, "kind": "replaced", "instance_id": iid,
                                        "seconds_to_serve": seconds})
            self.num_replaced += 1
            del self.replacing[iid]  # last: capacity() counts it as serving from here
        log.warning("instance %s replaces a lost instance; serving %.1f s after the loss", iid, seconds)

    # -- starting instances ---------------------------------------------------------------
    def start_instance(self) -> None:
        with self._state.lock:
            iid = self.new_instance_id()
        try:
            self.launch(iid)
        except Exception as e:  # noqa: BLE001 - the scheduler may try again after its cooldown
            with self._state.lock:
                self._state.lifecycle.move(iid, InstanceState.FAILED, time.time(), str(e))
            self._scale_out_failed(iid, str(e))
            return
        self.scaling_events.append({"time": time.time(), "kind": "started", "instance_id": iid})

    def launch(self, iid: str) -> None:
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
            # Detached, so it outlives a restart of LlumSched (its owner).
            handle = InstanceActor.options(name=f"{self._name}-{iid}", lifetime="detached",  # type: ignore[attr-defined]
                                           num_cpus=0, num_gpus=spec.get("num_gpus", 0),
                                           resources=dict(spec.get("resources") or {})).remote(
                iid, spec["model"], dict(spec["engine"]), spec["scheduling"], self._name,
                spec["threads"], spec["token"], spec["migration"])
            ray.get(handle.ready.remote(), timeout=float(spec.get("start_timeout_s", 300)))
            status = ray.get(handle.status.remote(), timeout=30)
            self._register(status, handle)
        except Exception:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
            raise

    def _scale_out_failed(self, iid: str, why: str) -> None:
        log.warning("auto-scaling: starting %s failed: %s", iid, why)
        self.scaling_events.append({"time": time.time(), "kind": "start-failed", "instance_id": iid, "reason": why})
        with self._state.lock:
            self._state.gs.on_scale_out_failed()

    # -- auto-scaling and stopping drained victims ------------------------------------------
    def autoscale(self) -> None:
        """Sample the average freeness, act on the pure decision, and stop drained
        victims. Scale-out starts an instance actor that migration then fills; scale-in
        marks the victim terminating, so ordinary migration drains it, and stops it
        only once it is empty."""
        st, now, num_running = self._state, time.time(), 0
        with st.lock:
            act = scaling_round(st.gs, now)
            if act.kind == "in" and act.instance_id in st.handles:
                st.gs.mark_terminating(act.instance_id)
                st.lifecycle.move(act.instance_id, InstanceState.TERMINATING, now, SCALE_IN)
                num_running = st.gs.statuses[act.instance_id].num_running
        if act.kind != "none":
            self.scaling_events.append({"time": now, "kind": act.kind, "instance_id": act.instance_id,
                                        "reason": act.reason, "num_running": num_running})
            log.warning("auto-scaling: %s %s (%s)", act.kind, act.instance_id or "", act.reason)
        if act.kind == "out":
            threading.Thread(target=self.start_instance, daemon=True, name="scale-out").start()
        elif act.kind == "in" and act.instance_id in st.handles:
            with contextlib.suppress(Exception):  # its next report carries the flag anyway
                ray.get(st.handles[act.instance_id].set_terminating.remote(True, True), timeout=10)
        self.stop_drained()

    def has_victims(self) -> bool:
        return bool(self.scaling_in() or self._relearn)

    def _relearn_victims(self) -> None:
        """After a restart: a terminating instance that scale-in marked is still to be
        stopped once empty (the instance remembers; an admin drain is left running)."""
        st = self._state
        with st.lock:
            ask = [(iid, st.handles.get(iid)) for iid in self._relearn]
            self._relearn.clear()
        for iid, handle in ask:
            try:
                victim = handle is not None and bool(ray.get(handle.is_scaling_in.remote(), timeout=2))
            except Exception:  # noqa: BLE001 - not answering: asked again next round
                with st.lock:
                    self._relearn.add(iid)
                continue
            if victim:
                with st.lock:
                    if iid in st.handles:
                        st.lifecycle.move(iid, InstanceState.TERMINATING, time.time(), SCALE_IN)
                log.warning("instance %s is still being scaled in; stopped once empty", iid)

    def stop_drained(self) -> None:
        if self._relearn:
            self._relearn_victims()
        st = self._state
        with st.lock:
            ready = [(iid, st.handles.get(iid)) for iid in victims_to_stop(
                self.scaling_in(), st.gs.statuses, st.in_flight, time.time(), settle_s=1.0)]
        for iid, handle in ready:
            try:
                # The instance itself decides at a step boundary, so nothing that
                # arrived since its last report is lost; it refuses new work from then on.
                if handle is None or not ray.get(handle.close_if_idle.remote(), timeout=10):
                    continue
            except ray.exceptions.RayActorError:
                pass  # already gone: nothing to stop
            self._remove(iid, SCALED_IN)
            self.scaling_events.append({"time": time.time(), "kind": "stopped", "instance_id": iid})
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.get(handle.shutdown.remote(), timeout=10)
                ray.kill(handle)
