"""The simulator's PolicyPort over the shared policy objects: one ``GlobalScheduler``
and one ``Llumlet`` per instance, exactly as the cluster runs them. Nothing here
decides; it only translates simulator calls into policy calls.

A system in an experiment config::

    llumnix:
      dispatch: llumnix            # a name from llumnix.policy.DISPATCH_POLICIES
      migration: true              # rescheduling rounds on
      migrate_out_threshold: 10    # shortcut: rescheduling.out_threshold (and in_threshold, if lower)
      rescheduling: {selection: paper, max_out: 1}   # any SchedulingConfig section
      freeness: {headroom_tokens: {high: 1600}}
      dispatch_params: {}          # DispatchConfig.params
      prefix_evictions: true       # DispatchConfig.prefix_evictions
      scaling: {enabled: true, scale_out_below: 10, scale_in_above: 60}
      slo: {rescue: false}         # SLO classes (policy/slo.py): the slo policy's, and every record's by_slo_class

or in `llumnix serve --config`'s spelling (``llumnix.config.SystemConfig``; ``sim/config.py``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llumnix.core.errors import InvalidRequestError
from llumnix.policy import (
    DispatchRequest,
    GlobalScheduler,
    Llumlet,
    ReschedulingConfig,
    SchedulingConfig,
)
from llumnix.policy.cluster_view import Role
from llumnix.policy.config import PolicyConfigError
from llumnix.policy.predictor import LatencyLike, StepTimeModel
from llumnix.policy.rounds import scaling_round
from llumnix.policy.trigger import Reactions

if TYPE_CHECKING:
    from llumnix.core.clock import Clock
    from llumnix.core.status import InstanceStatus
    from llumnix.engine import EngineCore
    from llumnix.sim.cluster import ClusterConfig
    from llumnix.sim.config import SystemSpec
    from llumnix.sim.instance import SimInstance

_SECTIONS = ("freeness", "rescheduling", "scaling", "pd", "slo")


def scheduling_config(spec: SystemSpec) -> SchedulingConfig:
    """SystemSpec -> SchedulingConfig; raises the policy's own PolicyConfigError. The
    simulator delivers a dispatched request at once: nothing is pending in flight."""
    if spec.system is not None:
        sched = spec.system.scheduling
        return _checked(dataclasses.replace(sched, dispatch=dataclasses.replace(sched.dispatch, pending_grace_s=0.0)))
    opts = dict(spec.options)
    unknown = sorted(set(opts) - {*_SECTIONS, "migrate_out_threshold", "dispatch_params", "staleness_s",
                                  "prefix_evictions"})
    if unknown:
        raise InvalidRequestError(f"unknown setting {unknown[0]!r}", unknown[0])
    resched = dict(opts.get("rescheduling") or {})
    resched["enabled"] = spec.enable_migration
    if "migrate_out_threshold" in opts:
        out = float(opts["migrate_out_threshold"])
        resched.setdefault("out_threshold", out)
        resched.setdefault("in_threshold", max(out, ReschedulingConfig().in_threshold))
    dispatch: dict[str, Any] = {"policy": spec.dispatch, "params": dict(opts.get("dispatch_params") or {}),
                                "pending_grace_s": 0.0}
    for key in ("staleness_s", "prefix_evictions"):
        if key in opts:
            dispatch[key] = opts[key]
    return _checked(SchedulingConfig.from_dict({"freeness": opts.get("freeness"), "dispatch": dispatch,
                                                "rescheduling": resched, "scaling": opts.get("scaling"),
                                                "pd": opts.get("pd"), "slo": opts.get("slo")}))


def _checked(sched: SchedulingConfig) -> SchedulingConfig:
    if sched.pd.is_on and sched.scaling.enabled:
        raise PolicyConfigError("pd.mode: PD with auto-scaling is not simulated (set scaling.enabled false)",
                                "pd.mode")
    return sched


def validate_system(spec: SystemSpec, where: str) -> None:
    from llumnix.sim.config import ConfigError

    try:
        scheduling_config(spec)
    except (InvalidRequestError, ValueError, TypeError) as e:
        param = getattr(e, "param", None)
        field = "dispatch" if param == "dispatch.policy" else (param or "")
        problem = str(e)
        if param and problem.startswith(f"{param}: "):  # bad_value's messages repeat the path
            problem = problem[len(param) + 2:]
        raise ConfigError(f"{where}.{field}: {problem}" if field else f"{where}: {problem}") from None


class PolicyBridge:
    """With PD on (``config.pd``), ``gs`` dispatches over the prefill pool (roles prefill
    and mixed) and ``gs_decode`` pairs migrations within the decode pool (decode and
    mixed): each sees only its pool's statuses (``policy/pd.py``). Roles (and PD's
    promised blocks) live in ``cluster``, the prefill pool's ``ClusterView``, as in
    LlumSched's one view."""

    def __init__(self, config: SchedulingConfig, clock: Clock | None = None, seed: int = 0,
                 scaling_interval_s: float = 1.0, rescheduler_apart: bool = False) -> None:
        self.config = config
        self.gs = GlobalScheduler(config, seed=seed)
        apart = config.pd.is_on or rescheduler_apart
        self.gs_decode = GlobalScheduler(config, seed=seed) if apart else self.gs
        """Pairs migrations: its own scheduler with PD (the decode pool), or with
        ``rescheduler_apart`` (the cluster's LlumSched apart from the gateway's dispatch:
        statuses reach it later, ``ClusterConfig.status_delay_s``)."""
        self.cluster = self.gs.cluster
        """Each instance's PD role (all mixed with PD off) and, with PD, the blocks promised
        to decode instances by hand-offs; the prefill pool's statuses."""
        self.clock = clock
        self.enable_migration = config.rescheduling.enabled
        self.reactions = Reactions(config.rescheduling, config.freeness)
        """Every status's rescheduling marks, as LlumSched keeps them: triggers, reaction times."""
        self.track_reactions = False
        self._named: dict[tuple[str, str], str] = {}
        """The request each order of the last round named (rescue), by (source, destination)."""
        self._rescuing: dict[tuple[str, str], str] = {}
        """(source, destination) of the rescues under way -> the request each names: it moves
        that one, and no chain follows it (``keep_migrating``)."""
        self.scaling_interval_s = scaling_interval_s if config.scaling.enabled else 0.0

    def bind(self, clock: Clock) -> None:
        self.clock = clock

    def seed_predictor(self, model: LatencyLike) -> None:
        """Seed the ``slo`` policy's step-time model from the latency model the simulator runs
        (as a cluster seeds it from its calibration profile); no-op for other policies."""
        for gs in {id(g): g for g in (self.gs, self.gs_decode)}.values():
            if gs.slo is not None:
                gs.slo.seed(StepTimeModel.from_latency(model))

    def _now(self) -> float:
        assert self.clock is not None, "bind the bridge to the simulator's clock first"
        return self.clock.now()

    # -- membership and status --------------------------------------------------------
    def make_llumlet(self, instance_id: str, engine: EngineCore) -> Llumlet:
        if self.gs.slo is not None:  # as the cluster's instance actor
            slo = self.config.slo
            engine.set_objectives(slo.objectives(), slo.engine_order, slo.classes_of())
        return Llumlet(instance_id, engine, self.config.rescheduling, self.config.freeness,
                       records_steps=self.gs.slo is not None)  # SimInstance hands it each step

    @property
    def roles(self) -> Mapping[str, Role]:
        return self.cluster.roles

    def _pools(self, role: Role) -> list[GlobalScheduler]:
        if self.gs_decode is self.gs:
            return [self.gs]
        return [gs for gs, takes in ((self.gs, role.takes_prefill), (self.gs_decode, role.in_decode_pool)) if takes]

    def add_instance(self, inst: SimInstance) -> None:
        iid, now = inst.instance_id, self._now()
        if iid not in self.cluster.roles:
            pd = self.config.pd
            num_prefill = len(self.cluster.ids_with(Role.PREFILL))
            self.cluster.set_role(iid, Role.MIXED if not pd.is_on else
                                  Role.PREFILL if num_prefill < pd.prefill_instances else Role.DECODE, now)
        status = inst.llumlet.report(now)
        for gs in self._pools(self.cluster.role_of(iid)):
            gs.add_instance(status)

    def remove_instance(self, inst: SimInstance) -> None:
        for gs in {id(g): g for g in (self.gs, self.gs_decode)}.values():
            gs.remove_instance(inst.instance_id)
        self.reactions.remove(inst.instance_id)
        self.cluster.drop_role(inst.instance_id)

    def report(self, inst: SimInstance) -> bool:
        return self._deliver(self.push(inst), True, True)

    def push(self, inst: SimInstance) -> InstanceStatus:
        status: InstanceStatus = inst.llumlet.push(self._now())
        return status

    def deliver(self, status: InstanceStatus, *, dispatch: bool = True, reschedule: bool = True) -> bool:
        """A status (``llumlet.push``'s) reaches dispatch and, apart or at once, the
        rescheduler (its pairing and trigger): True if it triggers a pass."""
        return self._deliver(status, dispatch, reschedule)

    def _deliver(self, status: InstanceStatus, dispatch: bool, reschedule: bool) -> bool:
        """``deliver`` with positional arguments (every report: CPython 3.11 runs a call to
        a function with keyword-only parameters in a C frame of its own)."""
        # refresh=False: the dispatch view is rebuilt when a decision next reads it, so a
        # report overwritten before any decision costs no view (the same decisions).
        if self.gs_decode is self.gs:  # one scheduler (no PD, rescheduler not apart): every report
            if dispatch or reschedule:
                self.gs.update_status(status, False)
        else:
            for gs in self._pools(self.cluster.role_of(status.instance_id)):
                if (dispatch and gs is self.gs) or (reschedule and gs is self.gs_decode):
                    gs.update_status(status, False)
        if not reschedule or not self.track_reactions:
            return False
        if not self.cluster.role_of(status.instance_id).in_decode_pool:
            # as LlumSched: rescheduling pairs only within the decode pool
            self.reactions.remove(status.instance_id)
            return False
        return self.reactions.on_status(status)

    def on_order(self, src_id: str, dst_id: str) -> float | None:
        return self.reactions.on_order(src_id, dst_id, self._now())

    def set_role(self, inst: SimInstance, role: str) -> None:
        """Move ``inst`` between the pools (PD role change)."""
        now = self._now()
        old = self.cluster.role_of(inst.instance_id)
        before, after = self._pools(old), self._pools(Role(role))
        for gs in before:
            if gs not in after:
                gs.remove_instance(inst.instance_id)  # (the prefill pool's also drops the role)
        self.cluster.set_role(inst.instance_id, role, now)
        status = inst.llumlet.report(now)
        for gs in after:
            if gs not in before:
                gs.add_instance(status)

    # -- dispatch ------------------------------------------------------------------
    def dispatch(self, request_id: str, num_prompt_tokens: int, arrival_time: float,
                 priority: int, prompt_token_ids: list[int] | None = None, slo_class: str | None = None) -> str | None:
        return self.gs.dispatch(DispatchRequest(request_id, num_prompt_tokens, priority, arrival_time,
                                                prompt_token_ids, slo_class), self._now())

    # -- migration -----------------------------------------------------------------
    def pair_migrations(self) -> list[tuple[str, str]]:
        orders = self.gs_decode.reschedule(self._now())
        # an order that names its request (rescue, policy/slo_rescue.py) moves that one only
        self._named = {(o.src_instance_id, o.dst_instance_id): o.request_id for o in orders if o.request_id}
        return [(o.src_instance_id, o.dst_instance_id) for o in orders]

    def select_request(self, src: SimInstance, dst: SimInstance) -> str | None:
        """An order's first move, as the cluster's source picks it (``Llumlet.select_for_order``):
        the request the order names, or none if it cannot move it, else the selection's."""
        now, pair = self._now(), (src.instance_id, dst.instance_id)
        named = self._named.pop(pair, None)
        self._rescuing.pop(pair, None)
        reads = named is None and src.llumlet.reads_destination
        picked, _ = src.llumlet.select_for_order(now, named, dst.llumlet.report(now) if reads else None)
        if named is not None and picked:
            self._rescuing[pair] = named
        return picked[0] if picked else None

    def on_migration_started(self, src: SimInstance, request_id: str) -> None:
        src.llumlet.on_migration_started(request_id)

    def on_migration_finished(self, src: SimInstance, request_id: str, committed: bool) -> None:
        src.llumlet.on_migration_finished(request_id, committed)

    def keep_migrating(self, src: SimInstance, dst: SimInstance) -> bool:
        """The cluster's rule (``Llumlet.should_keep_migrating``) on fresh statuses; a rescue
        (an order that named its request) moves that one only: the freeness pairing, which
        chose its own pairs this round, did not choose this one to keep going."""
        named, now = self._rescuing.pop((src.instance_id, dst.instance_id), None), self._now()
        return bool(src.llumlet.should_keep_migrating(now, dst.llumlet.report(now), len(dst.migrations_in), named))

    def is_drained(self, inst: SimInstance) -> bool:
        # A queued request migrating in holds no reservation, so no status shows it: the
        # cluster's instance refuses it once closed (the request stays at its source);
        # the simulator has no refusal path and waits for it instead.
        return bool(inst.llumlet.is_drained(self._now())) and not inst.migrations_in

    # -- scaling -------------------------------------------------------------------
    def scale(self, num_active: int) -> tuple[str, str | None]:
        """("out", None), ("in", victim id) or ("none", None). ``num_active``: instances
        up or starting and not terminating; the scheduler only sees those up, so a
        scale-out while others still start must not pass max_instances."""
        act = scaling_round(self.gs, self._now())  # as the cluster's round
        if act.kind == "out" and num_active >= self.config.scaling.max_instances:
            return "none", None
        return act.kind, act.instance_id

    def on_terminating(self, inst: SimInstance) -> None:
        inst.llumlet.is_terminating = True


def make_policy(spec: SystemSpec, cluster: ClusterConfig, seed: int = 0) -> PolicyBridge:
    config = scheduling_config(spec)
    if cluster.status_delay_s and config.pd.is_on:
        raise PolicyConfigError("cluster.status_delay_s: not simulated with PD (set pd.mode off, or the delay 0)",
                                "pd.mode")
    return PolicyBridge(config, seed=seed, scaling_interval_s=cluster.status_interval_s,
                        rescheduler_apart=cluster.status_delay_s > 0)
