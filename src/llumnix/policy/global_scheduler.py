"""LlumSched's logic: dispatch (scheduler role), migration pairing and scaling
(rescheduler role) over the latest statuses. Plain object: the runtime and the
simulator call it; it reads no clock and does no I/O (``now`` comes in)."""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, MutableMapping

from llumnix.core.status import InstanceStatus
from llumnix.policy.cluster_view import ClusterView, Role
from llumnix.policy.config import SchedulingConfig
from llumnix.policy.dispatch import make_pipeline, prefix_options
from llumnix.policy.dispatch_index import FALLBACK, DispatchIndex
from llumnix.policy.dispatch_queue import DispatchQueue, DispatchRequest
from llumnix.policy.freeness import average_normal_freeness
from llumnix.policy.pairing import MigrationOrder, pair_migrations
from llumnix.policy.pending import PendingDispatches
from llumnix.policy.pipeline import DispatchContext
from llumnix.policy.prefix_affinity import PrefixIndex, affinity_choice, block_keys
from llumnix.policy.scaling import ScaleAction, scaling_decision
from llumnix.policy.slo_dispatch import ShedBook, SLODispatch
from llumnix.policy.slo_predict import SLOPredictor
from llumnix.policy.slo_rescue import rescue_orders

__all__ = ["DispatchQueue", "DispatchRequest", "GlobalScheduler"]


class GlobalScheduler:
    """Decisions over a ``ClusterView`` (``cluster``: the latest status per instance, in a
    dict by default or any ``MutableMapping`` the caller provides as ``store``, written
    only through the methods below; the requests sent since each report; roles and
    lifecycles) and, per instance, the view dispatch sees: the status with the requests
    sent since it counted. Views change only when a report arrives or a request is
    dispatched, so they are kept up to date here rather than rebuilt per dispatch."""

    def __init__(self, config: SchedulingConfig | None = None, seed: int = 0,
                 store: MutableMapping[str, InstanceStatus] | None = None,
                 cluster: ClusterView | None = None) -> None:
        self.config = config or SchedulingConfig()
        self.pipeline = make_pipeline(self.config.dispatch.policy, self.config.dispatch.params)
        if cluster is not None and store is not None:
            raise ValueError("pass the statuses' store to the ClusterView, not beside it")
        self.cluster = ClusterView(statuses=store) if cluster is None else cluster
        """Membership and load: the one record of each instance (``policy/cluster_view.py``)."""
        self.sent: dict[str, int] = {}
        """Requests dispatched to each instance so far: round-robin's state."""
        self._views: dict[str, InstanceStatus] = {}
        self._stale_views: set[str] = set()
        """Instances whose status changed since their view was built (``update_status``
        with ``refresh=False``): rebuilt before the next decision reads them."""
        self._stale_keys: set[str] = set()
        """Instances whose view the rescheduler rebuilt (``view``) but whose dispatch key
        is not: recomputed before the next dispatch (a key is a function of the view)."""
        self._rng = random.Random(seed)
        self._freeness_samples: list[tuple[float, float]] = []
        self._last_scale: float | None = None
        self.num_starting = 0
        """Scale-outs ordered whose instance has not been added yet."""
        self._ctx = DispatchContext(now=0.0, freeness=self.config.freeness,
                                    staleness_s=self.config.dispatch.staleness_s,
                                    sent=self.sent, rng=self._rng)
        """One context for every dispatch: its memo keeps metrics per status object."""
        prefix = prefix_options(self.config.dispatch.policy, self.config.dispatch.params)
        matching = prefix is not None or any(s == "prefix-match" for s, _ in self.pipeline.scorers)
        self.prefix_index = PrefixIndex() if matching else None
        """Where each prompt prefix was sent (prefix affinity only)."""
        # With prefix affinity the index answers the policy's own max-score pick, and
        # ``_with_affinity`` applies the affinity rule to it (as the picker would).
        base = self.pipeline if prefix is None else dataclasses.replace(self.pipeline, picker="max-score")
        self._index = DispatchIndex(base) if DispatchIndex.supports(base) else None
        if prefix is not None:
            self._ctx.prefix_options = prefix
        self.slo = SLOPredictor(self.config.slo) if self.config.dispatch.policy == "slo" else None
        """The latency predictor of the ``slo`` policy (dispatch by predicted attainment, rescue)."""
        self.shed = ShedBook()
        """Requests the ``slo`` policy shed, per class (``RequestShedError``)."""

    @property
    def statuses(self) -> MutableMapping[str, InstanceStatus]:
        return self.cluster.statuses

    @property
    def pending(self) -> PendingDispatches:
        return self.cluster.pending

    @property
    def roles(self) -> Mapping[str, Role]:
        """PD roles (``policy/pd.py``): dispatch takes only prefill-taking instances,
        rescheduling pairs only within the decode pool (while the view ``is_split``)."""
        return self.cluster.roles

    # -- membership ------------------------------------------------------------
    def add_instance(self, status: InstanceStatus) -> None:
        """A new (or restarted) instance. A new one fulfils an outstanding scale-out, and
        the scaling window restarts: samples from before it joined describe another cluster."""
        if status.instance_id not in self.statuses and self.num_starting > 0:
            self.num_starting -= 1
            self._freeness_samples.clear()
        self.cluster.admit(status.instance_id, status.timestamp)
        self.sent.setdefault(status.instance_id, 0)
        self._set(self._marked(status))
        if self.slo is not None:
            self.slo.num_instances = len(self.statuses)

    def remove_instance(self, instance_id: str) -> None:
        """Gone: no dispatch, no migration, and its late reports add nothing (the caller
        moves its lifecycle to RETIRED or FAILED)."""
        self.cluster.forget(instance_id)
        self._views.pop(instance_id, None)
        self._stale_views.discard(instance_id)
        self._stale_keys.discard(instance_id)
        self._ctx.memo.pop(instance_id, None)
        if self._index is not None:
            self._index.remove(instance_id)
        if self.prefix_index is not None:
            self.prefix_index.remove(instance_id)
        self.sent.pop(instance_id, None)
        if self.slo is not None:
            self.slo.forget(instance_id)
            self.slo.num_instances = len(self.statuses)

    def mark_terminating(self, instance_id: str) -> None:
        """Scale-in: no more dispatches there, and it is a migration source until empty,
        even before its own reports say it is terminating."""
        s = self.statuses.get(instance_id)
        self.cluster.mark_terminating(instance_id, 0.0 if s is None else s.timestamp)
        if s is not None:
            self._set(self._marked(s))

    def unmark_terminating(self, instance_id: str) -> None:
        """Undo a drain: dispatch may choose the instance again once its own report says
        it is no longer terminating (or at once, when it never said so)."""
        s = self.statuses.get(instance_id)
        self.cluster.unmark_terminating(instance_id, 0.0 if s is None else s.timestamp)
        if s is not None and s.is_terminating:
            self._set(dataclasses.replace(s, is_terminating=False))

    def set_schedulable(self, instance_id: str, ok: bool) -> None:
        """The health check's verdict on a silent instance (until its next report)."""
        s = self.statuses.get(instance_id)
        if s is not None and s.is_schedulable != ok:
            self._set(dataclasses.replace(s, is_schedulable=ok))

    def set_role(self, instance_id: str, role: str, now: float = 0.0) -> None:
        """An instance's PD role (``policy/pd.py``; ``mixed``: every instance's without PD).
        Its dispatch key is rebuilt even when the view had the role already (``PDBook``
        writes the same view)."""
        self.cluster.set_role(instance_id, role, now)
        if instance_id in self.statuses:
            self._refresh(instance_id)

    def takes_prefill(self, instance_id: str) -> bool:
        return self.cluster.takes_prefill(instance_id)

    def update_status(self, status: InstanceStatus, refresh: bool = True) -> None:
        """Take a report. The first report of an unknown instance adds it, but a late
        report of a removed one does not bring it back (``add_instance`` does). With
        ``refresh`` False the instance's view is rebuilt only when a decision next reads
        it: a caller that gets a report per engine step (a gateway) builds one view per
        dispatch instead of one per report, and decides exactly the same."""
        cluster = self.cluster
        if cluster.is_removed(status.instance_id):
            return
        old = cluster.statuses.get(status.instance_id)
        if old is None:
            self.add_instance(status)
            return
        if status.timestamp < old.timestamp:
            return  # a late report never rolls the view back
        if status.evicted_prefix_keys and self.prefix_index is not None and self.config.dispatch.prefix_evictions:
            self.prefix_index.forget_evicted(status.instance_id, status.evicted_prefix_keys, old.timestamp)
        cluster.pending.on_status(status, self.config.dispatch.pending_grace_s)
        if self.slo is not None:
            self.slo.on_status(old, status)
        if refresh:
            self._set(self._marked(status))
        else:
            cluster.statuses[status.instance_id] = self._marked(status)
            self._stale_views.add(status.instance_id)

    def on_finished(self, instance_id: str, request_id: str) -> None:
        """A request dispatched here finished on ``instance_id`` before any report showed
        it running: it stops counting at once, not a grace period later (short requests
        between two reports would otherwise fill the view with requests long gone)."""
        if self.pending.forget(instance_id, request_id) and instance_id in self.statuses:
            self._stale_views.add(instance_id)

    def _set(self, status: InstanceStatus) -> None:
        self.cluster.statuses[status.instance_id] = status
        self._refresh(status.instance_id)

    def _refresh_stale(self, keys: bool = True) -> None:
        """Rebuild the stale views, and with ``keys`` the dispatch keys not rebuilt with them."""
        stale, self._stale_views = self._stale_views, set()
        statuses = self.cluster.statuses  # (not the ``statuses`` property per instance)
        for iid in stale:
            if iid in statuses:
                self._refresh(iid, keys)
        if keys and self._stale_keys:
            stale, self._stale_keys = self._stale_keys, set()
            for iid in stale:
                if iid in self._views:
                    self._refresh_key(iid)

    def _refresh(self, instance_id: str, key: bool = True) -> None:
        self._stale_views.discard(instance_id)
        cluster = self.cluster
        self._views[instance_id] = cluster.pending.apply(cluster.statuses[instance_id])
        if self._index is None:
            return
        if key:
            self._refresh_key(instance_id)
        else:
            self._stale_keys.add(instance_id)

    def _refresh_key(self, instance_id: str) -> None:
        assert self._index is not None
        self._stale_keys.discard(instance_id)
        view = self._views[instance_id]
        if self.takes_prefill(instance_id):
            self._index.update(view, self._ctx)
        else:  # a decode instance is never a dispatch candidate
            self._index.remove(instance_id)

    def _marked(self, status: InstanceStatus) -> InstanceStatus:
        if not status.is_terminating and self.cluster.is_marked_terminating(status.instance_id):
            return dataclasses.replace(status, is_terminating=True)
        return status

    # -- scheduler role ----------------------------------------------------------
    def view(self) -> list[InstanceStatus]:
        """Statuses as dispatch should see them: with requests sent since each report
        counted as running (see ``pending``), so a burst between two reports spreads out
        instead of landing on one instance."""
        if self._stale_views:
            self._refresh_stale(keys=False)  # rescheduling reads views, not dispatch keys
        return list(self._views.values())

    def dispatch(self, req: DispatchRequest, now: float) -> str | None:
        """The instance for ``req``, or None if no instance can take it now (all
        unschedulable or terminating): the caller keeps it in its DispatchQueue. The ``slo``
        policy raises ``RequestShedError`` for a request of a class that may shed when no
        instance meets its objectives."""
        if self._stale_views or self._stale_keys:
            self._refresh_stale()
        ctx = self._ctx
        ctx.now = now
        ctx.num_prompt_tokens = req.num_prompt_tokens
        keys = None
        if self.prefix_index is not None and req.prompt_token_ids and self._views:
            block_size = next(iter(self._views.values())).block_size
            keys = block_keys(req.prompt_token_ids, block_size)
            ctx.prefix_hits = {i: n for i, n in self.prefix_index.matches(keys).items()
                               if i in self._views and self.takes_prefill(i)}
        else:
            ctx.prefix_hits = None
        if self.slo is not None:
            cls = self.config.slo.resolve(req.slo_class, req.priority)
            ctx.slo = SLODispatch(self.slo, cls, req.priority, req.num_prompt_tokens)
        iid = FALLBACK if self._index is None else self._index.pick(self._views, ctx)
        if iid == FALLBACK:
            views = self.view()
            iid = self.pipeline.pick([v for v in views if self.takes_prefill(v.instance_id)]
                                     if self.cluster.is_split else views,
                                     ctx)
        elif iid is not None and ctx.prefix_hits:
            iid = self._with_affinity(iid, ctx)
        if iid is None:
            return None
        if ctx.slo is not None:  # a class that may shed is refused here rather than queued past its objective
            self.shed.check(ctx.slo, self._views[iid], now)
            slo = ctx.slo.predictor
            ttft = slo.ttft(slo.load(self._views[iid]), req.num_prompt_tokens, req.priority,
                            req.arrival_time + ctx.slo.slo_class.ttft_s, objective_s=ctx.slo.slo_class.ttft_s)
            slo.record_ttft(req.request_id, req.arrival_time, now - req.arrival_time + ttft)
        if keys and self.prefix_index is not None:
            self.prefix_index.record(iid, keys, self.cluster.statuses[iid].num_total_blocks, now)
        self.sent[iid] = self.sent.get(iid, 0) + 1
        if self.slo is not None:
            self.slo.on_dispatch(now, req.num_prompt_tokens)
        self.cluster.pending.add(iid, req, self.cluster.statuses[iid].block_size, now)
        self._refresh(iid)
        return iid

    def _with_affinity(self, freest: str, ctx: DispatchContext) -> str:
        """The ``prefix-affinity`` pick from the index's answer: only the instances with a
        match are looked at, so a dispatch stays O(matches) (the picker over the full
        pipeline decides the same; a test checks it)."""
        assert self._index is not None and ctx.prefix_hits
        index, views, passing = self._index, self._views, self._index.passing()
        matched = [(views[i], -passing[i][0]) for i in sorted(ctx.prefix_hits)
                   if i in passing and index.passes_dynamic(views[i], ctx)]
        return affinity_choice(views[freest], matched, ctx.prefix_hits, ctx.prefix_options).instance_id

    # -- rescheduler role ----------------------------------------------------------
    def reschedule(self, now: float) -> list[MigrationOrder]:
        """One migration round (empty when migration is disabled). Pending dispatches
        count, so an instance that just took a burst is not also sent migrations."""
        cfg = self.config
        if not cfg.rescheduling.enabled:
            return []
        views = self.view()
        if self.cluster.is_split:  # PD: prefill instances hand requests off instead (cluster/pd.py)
            views = [v for v in views if self.cluster.in_decode_pool(v.instance_id)]
        orders = pair_migrations(views, cfg.rescheduling, cfg.freeness)
        if self.slo is not None and cfg.slo.rescue:
            taken = {i for o in orders for i in (o.src_instance_id, o.dst_instance_id)}
            orders += rescue_orders(views, self.slo, now, cfg.rescheduling, taken)
        return orders

    def record_freeness(self, now: float) -> float:
        """Sample the average normal-priority freeness for auto-scaling (0.0 and no
        sample when no instance is active)."""
        avg = average_normal_freeness(list(self.statuses.values()), self.config.freeness,
                                      self.config.scaling.signal)
        if avg is None:
            return 0.0
        self._freeness_samples.append((now, avg))
        # Two windows of history: enough to tell that a full window has been observed.
        horizon = now - 2 * self.config.scaling.window_s
        while self._freeness_samples and self._freeness_samples[0][0] < horizon:
            self._freeness_samples.pop(0)
        return avg

    def scaling_decision(self, now: float) -> ScaleAction:
        """Decide over the recorded window; an action restarts the window and the cooldown.
        After ``out`` no further decision is made until the new instance is added (or the
        driver calls ``on_scale_out_failed``). A scale-in victim is not marked here: the
        driver marks it terminating (``mark_terminating`` or its llumlet's flag)."""
        act = scaling_decision(self._freeness_samples, list(self.statuses.values()),
                               self.config.scaling, now, self._last_scale, self.num_starting)
        if act.kind != "none":
            self._last_scale = now
            self._freeness_samples.clear()
        if act.kind == "out":
            self.num_starting += 1
        return act

    def on_scale_out_failed(self) -> None:
        """The instance a scale-out ordered will never come up."""
        self.num_starting = max(0, self.num_starting - 1)
