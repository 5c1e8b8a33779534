"""One snapshot sequence replayed through the simulator's round code and the cluster's,
asserting identical decisions (issue 29, item 3): which pairings start a migration chain,
whether each chain keeps going, scale-out and scale-in (and the victim), and when a
scale-in victim is drained.

Both sides run their real call sites over llumlets whose engines report the literal
snapshots below: the simulator's ``Simulator.on_reschedule`` / ``scaling.on_scaling`` and its
``PolicyBridge`` (a chain's first move is recorded instead of simulated), and the
cluster's ``LlumSchedActor`` round code, whose pure parts live in ``policy/rounds.py``
(``pairs_to_start``, ``scaling_round``, ``victims_to_stop``; Ray only carries them) with
its instances' ``Llumlet.should_keep_migrating`` (``InstanceActor.migrate_out``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llumnix.core.status import InstanceStatus
from llumnix.policy import GlobalScheduler, Llumlet, SchedulingConfig
from llumnix.policy.llumlet import flag_status
from llumnix.policy.rounds import pairs_to_start, scaling_round, victims_to_stop
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import SystemSpec
from llumnix.sim.events import Event, EventKind
from llumnix.sim.latency import fit_a10_llama7b
from llumnix.sim.policy_bridge import PolicyBridge, scheduling_config
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import Trace
from tests.policy.snapshots import inst, run, wait

IDS = ("instance-0", "instance-1", "instance-2", "instance-3")
SCHEDULING: dict[str, Any] = {
    "dispatch": {"policy": "llumnix"},
    "rescheduling": {"enabled": True, "out_threshold": 3.0, "in_threshold": 3.0},
    "scaling": {"enabled": True, "scale_out_below": 10.0, "scale_in_above": 40.0, "window_s": 1.0,
                "cooldown_s": 2.0, "min_instances": 1, "max_instances": 6},
}
SETTLE_S = 1.0  # the cluster's wait before stopping a victim (LlumSchedActor._stop_drained)


def loads(*per_instance: tuple[tuple[int, ...], tuple[int, ...]]) -> dict[str, InstanceStatus]:
    """Per instance, (blocks of each running request, tokens of each queued one)."""
    return {iid: inst(iid, running=[run(f"{iid}-r{k}", b) for k, b in enumerate(r)],
                      waiting=[wait(f"{iid}-w{k}", n) for k, n in enumerate(w)])
            for iid, (r, w) in zip(IDS, per_instance, strict=True)}


BUSY = ((30, 30, 30), (480,))  # over its blocks, a queue behind: a migration source
LIGHT = ((20,), ())
MID = ((25, 25), ())
IDLE = ((2,), ())
FULL = ((45, 45), (800,))
EMPTY: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

# (time, snapshots): overload and imbalance; a quiet cluster (scale-in: the victim, still
# holding a request, migrates it out, then drains); quiet again (a victim that is empty
# already stops at once); everyone overloaded (scale-out).
SEQUENCE = [
    (0.5, loads(BUSY, LIGHT, MID, IDLE)),
    (1.0, loads(BUSY, MID, MID, LIGHT)),
    (1.5, loads(BUSY, BUSY, LIGHT, IDLE)),
    (2.0, loads(MID, LIGHT, MID, LIGHT)),
    (2.5, loads(IDLE, IDLE, IDLE, IDLE)),
    (3.0, loads(IDLE, IDLE, IDLE, IDLE)),
    (3.5, loads(EMPTY, LIGHT, IDLE, IDLE)),
    (4.0, loads(EMPTY, IDLE, LIGHT, IDLE)),
    (4.5, loads(EMPTY, LIGHT, IDLE, EMPTY)),
    (5.0, loads(EMPTY, LIGHT, IDLE, EMPTY)),
    (5.5, loads(EMPTY, FULL, FULL, EMPTY)),
    (6.0, loads(EMPTY, FULL, FULL, EMPTY)),
    (6.5, loads(EMPTY, FULL, FULL, EMPTY)),
    (7.0, loads(EMPTY, FULL, FULL, EMPTY)),
    (7.5, loads(EMPTY, FULL, FULL, EMPTY)),
]


@dataclasses.dataclass
class Decisions:
    started: list[tuple[str, str, str | None]]
    """Pairings that started a chain this round, with the request the source picks first
    (None: the llumlet gives none to that destination)."""
    kept: list[bool]
    """Per chain the previous round started, its move done and this round's snapshots in:
    keep migrating?"""
    scaling: tuple[str, str | None]
    drained: list[str]


class LiteralEngine:
    """An engine reporting the snapshot the test sets (what a llumlet reads)."""

    def __init__(self) -> None:
        self.status: InstanceStatus | None = None

    def snapshot(self, migrating: Any, fields: dict[str, Any]) -> InstanceStatus:
        assert self.status is not None
        return flag_status(self.status, migrating, **fields)

    def shared_blocks(self, request_ids: Any) -> dict[str, int]:
        return {}

    def take_evicted_prefix_keys(self) -> list[bytes]:
        return []


class SimSide:
    def __init__(self, scheduling: dict[str, Any] = SCHEDULING) -> None:
        spec = SystemSpec("llumnix", scheduling.get("dispatch", {}).get("policy", "llumnix"), enable_migration=True,
                          options={k: v for k, v in scheduling.items() if k != "dispatch"})
        self.bridge = PolicyBridge(scheduling_config(spec), seed=0, scaling_interval_s=0.5)
        trace = Trace("one", 1.0, 0, np.array([1e9]), np.array([16]), np.array([1]), np.array([0]))
        self.sim = Simulator(ClusterConfig(num_instances=len(IDS)), fit_a10_llama7b(), self.bridge, trace)
        self.engines: dict[str, LiteralEngine] = {}
        for _ in IDS:
            i = self.sim.cluster.new_instance()
            self.engines[i.instance_id] = i.llumlet.engine = LiteralEngine()
        self.first_moves: list[tuple[str, str, str | None]] = []
        self.chains: list[tuple[str, str, str | None]] = []
        self.sim._migrate_next = self._first_move  # type: ignore[method-assign]

    def _first_move(self, src: Any, dst: Any, now: float) -> list[Event]:
        self.first_moves.append((src.instance_id, dst.instance_id, self.bridge.select_request(src, dst)))
        return []

    def round(self, t: float, snaps: dict[str, InstanceStatus], first: bool) -> Decisions:
        sim, instances = self.sim, self.sim.cluster.instances
        sim.clock.advance_to(t)
        for iid, s in snaps.items():
            if iid in instances:
                self.engines[iid].status = s
                (self.bridge.add_instance if first else self.bridge.report)(instances[iid])
        kept = [self.bridge.keep_migrating(instances[s], instances[d]) for s, d, _ in self.chains
                if s in instances and d in instances]  # as _on_migration_done
        self.first_moves = []
        sim.on_reschedule(Event(t, EventKind.RESCHEDULE))
        self.chains = self.first_moves
        before = set(instances)
        terminating = {i for i, x in instances.items() if x.is_terminating}
        sim.scaling.on_scaling(t)
        new, stopped_at_once = set(instances) - before, before - set(instances)  # an empty victim
        victims = {i for i, x in instances.items() if x.is_terminating} - terminating | stopped_at_once
        scaling = ("out", None) if new else ("in", victims.pop()) if victims else ("none", None)
        drained = sorted(stopped_at_once | {i for i in terminating if self.bridge.is_drained(instances[i])})
        for iid in set(drained) - stopped_at_once:  # what on_step_end does
            sim._retire(instances[iid])
        return Decisions(self.first_moves, kept, scaling, drained)


class ClusterSide:
    """LlumSchedActor's rounds and its instances' llumlets, without Ray."""

    def __init__(self, scheduling: dict[str, Any] = SCHEDULING) -> None:
        cfg = SchedulingConfig.from_dict(scheduling)
        self.gs = GlobalScheduler(cfg, seed=0)
        self.engines = {iid: LiteralEngine() for iid in IDS}
        self.llumlets = {iid: Llumlet(iid, self.engines[iid], cfg.rescheduling, cfg.freeness) for iid in IDS}
        self.handles: dict[str, object] = {}
        self.victims: dict[str, float] = {}
        self.chains: list[tuple[str, str, str | None]] = []
        self.named: dict[tuple[str, str], str | None] = {}
        """The request each order of the last round named (a rescue's), by (source, destination)."""

    def pick(self, src: str, dst: str, t: float) -> str | None:
        """The source's first pick, as ``InstanceActor.migrate_out`` asks its llumlet."""
        ll, named = self.llumlets[src], self.named[(src, dst)]
        reads = named is None and ll.reads_destination
        picked, _ = ll.select_for_order(t, named, self.llumlets[dst].report(t) if reads else None)
        return picked[0] if picked else None

    def round(self, t: float, snaps: dict[str, InstanceStatus], first: bool) -> Decisions:
        gs = self.gs
        for iid, s in snaps.items():
            if iid in self.llumlets:
                self.engines[iid].status = s
                status = self.llumlets[iid].push(t)
                if first:  # register()
                    gs.add_instance(status)
                    self.handles[iid] = object()
                else:  # update_status()
                    gs.update_status(status)
        kept = [self.llumlets[s].should_keep_migrating(t, self.llumlets[d].report(t), 0, self.named[(s, d)])
                for s, d, _ in self.chains if s in self.llumlets and d in self.llumlets]  # as migrate_out
        self.named = {(o.src_instance_id, o.dst_instance_id): o.request_id for o in gs.reschedule(t)}
        started = self.chains = [(s, d, self.pick(s, d, t)) for s, d in pairs_to_start(self.named, (), self.handles)]
        act = scaling_round(gs, t)
        if act.kind == "in" and act.instance_id in self.handles:
            gs.mark_terminating(act.instance_id)
            self.llumlets[act.instance_id].is_terminating = True  # set_terminating
            self.victims[act.instance_id] = t
        # The cluster waits SETTLE_S for a victim's flag to reach its instance, which the
        # simulator sets at once: here that wait has passed.
        drained = sorted(victims_to_stop(self.victims, gs.statuses, (), t + SETTLE_S + 1e-9, SETTLE_S))
        for iid in drained:
            gs.remove_instance(iid)
            del self.handles[iid], self.llumlets[iid], self.victims[iid]
        return Decisions(started, kept, (act.kind, act.instance_id), drained)


def test_the_simulator_and_the_cluster_decide_alike_on_one_snapshot_sequence():
    sim, cluster = SimSide(), ClusterSide()
    log = []
    for k, (t, snaps) in enumerate(SEQUENCE):
        got_sim, got_cluster = sim.round(t, snaps, k == 0), cluster.round(t, snaps, k == 0)
        assert got_sim == got_cluster, f"round at t={t}: simulator {got_sim} vs cluster {got_cluster}"
        log.append(got_sim)
    # The sequence exercises every decision, both ways.
    assert any(d.started for d in log) and not all(d.started for d in log)
    kept = [k for d in log for k in d.kept]
    assert True in kept and False in kept
    kinds = [d.scaling[0] for d in log]
    assert "in" in kinds and "out" in kinds
    drained = [iid for d in log for iid in d.drained]
    victims = [d.scaling[1] for d in log if d.scaling[0] == "in"]
    assert drained and set(drained) <= set(victims)
    # one victim drained in a later round than the one that chose it
    assert any(iid in log[k].drained for k in range(len(log)) for iid in victims[:1]
               if log[k].scaling != ("in", iid))


# Issue 45's re-moves: near instances (F = 6) the tipping source (F = 1) would leave at
# (24 - 19) / 5 = 1; an idle one; a blocked queue (F = 0) whose 4-block prompt keeps a
# near instance at (24 - 4) / 5 = 4.
TIP = ((19, 19, 19, 19, 19), ())
NEAR = ((19, 19, 19, 19), ())
JAM = ((24, 24, 24, 24), (64,))
EVEN_SEQUENCE = [
    (0.5, loads(TIP, NEAR, NEAR, NEAR)),
    (1.0, loads(TIP, NEAR, NEAR, IDLE)),
    (1.5, loads(JAM, NEAR, NEAR, NEAR)),
    (2.0, loads(JAM, NEAR, TIP, NEAR)),
]


def test_even_pairing_decides_alike_in_the_simulator_and_the_cluster():
    log: dict[str, list[Decisions]] = {}
    for pairing in ("paper", "even"):
        scheduling = {**SCHEDULING, "rescheduling": {**SCHEDULING["rescheduling"], "pairing": pairing},
                      "scaling": {"enabled": False}}
        sim, cluster = SimSide(scheduling), ClusterSide(scheduling)
        log[pairing] = []
        for k, (t, snaps) in enumerate(EVEN_SEQUENCE):
            got_sim, got_cluster = sim.round(t, snaps, k == 0), cluster.round(t, snaps, k == 0)
            assert got_sim == got_cluster, f"{pairing} at t={t}: simulator {got_sim} vs cluster {got_cluster}"
            log[pairing].append(got_sim)
    paper, even = ([d.started for d in log[p]] for p in ("paper", "even"))
    assert paper[0] == [("instance-0", "instance-1", "instance-0-r0")]
    assert even[0] == []  # near would end no freer than the source: the move back would follow
    assert even[1] == [("instance-0", "instance-3", "instance-0-r0")]  # idle stays far freer
    assert even[2] == paper[2] == [("instance-0", "instance-1", "instance-0-w0")]  # the jam is relieved
    assert ("instance-2", "instance-3", "instance-2-r0") in paper[3]
    assert even[3] == [("instance-0", "instance-1", "instance-0-w0")]  # the new tipping source waits


# Rescue by migration (policy/slo_rescue.py): instance-0's queued interactive request q
# would miss its 1 s TTFT behind p's 3,000-token prompt; the others are nearly idle.
RESCUE: dict[str, Any] = {
    "dispatch": {"policy": "slo"}, "slo": {"rescue": True}, "scaling": {"enabled": False},
    # no freeness pairs: every order is a rescue's
    "rescheduling": {"enabled": True, "out_threshold": -1e9, "in_threshold": -1e9},
}


def _rescue_snaps(queue: bool) -> dict[str, InstanceStatus]:
    def light(iid: str, n: int) -> InstanceStatus:
        waiting = [wait(f"{iid}-p", 3000, 1), wait(f"{iid}-q", 200, 1)] if queue and iid == IDS[0] else []
        return inst(iid, total=4000, running=[run(f"{iid}-r{k}", 7, 100) for k in range(n)], waiting=waiting)
    return {iid: light(iid, 2 if iid == IDS[0] else 1) for iid in IDS}


def test_a_rescue_order_moves_the_request_it_names_alike_in_the_simulator_and_the_cluster(monkeypatch):
    # the freeness rule would keep any chain going (keep_migrating's source and destination
    # tests; the pairing's own are not touched): a rescue's must end anyway
    monkeypatch.setattr("llumnix.policy.rounds.is_source", lambda *a: True)
    monkeypatch.setattr("llumnix.policy.rounds.is_destination", lambda *a: True)
    sim, cluster = SimSide(RESCUE), ClusterSide(RESCUE)
    log = []
    for k, (t, snaps) in enumerate([(0.0, _rescue_snaps(False)), (0.5, _rescue_snaps(True)),
                                    (0.6, _rescue_snaps(True))]):
        got_sim, got_cluster = sim.round(t, snaps, k == 0), cluster.round(t, snaps, k == 0)
        assert got_sim == got_cluster, f"round at t={t}: simulator {got_sim} vs cluster {got_cluster}"
        log.append(got_sim)
    [(src, dst, moved)] = log[1].started
    assert (src, moved) == ("instance-0", "instance-0-q") and dst != src
    # the source's own selection would have given up another request: the name decides
    picked, _ = cluster.llumlets[src].select_for_order(0.5, None, None)
    assert picked and picked != [moved]
    assert log[2].kept == [False]  # and no chain follows the named request
    # an order naming a request no longer there moves nothing, in either world
    instances = sim.sim.cluster.instances
    sim.bridge._named[(src, dst)] = "instance-0-gone"
    assert sim.bridge.select_request(instances[src], instances[dst]) is None
    picked, why = cluster.llumlets[src].select_for_order(0.6, "instance-0-gone")
    assert picked == [] and "is not on instance-0" in str(why)
