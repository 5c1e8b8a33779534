"""One owner for the cluster view (issue 44): in the control plane's packages (cluster/ and
policy/, and the simulator's PD and policy bridge), every collection an object keeps as an attribute (``self.x = {}``, ``set()``,
``deque()``, a ``dict[...]`` annotation, a dataclass field) is listed below with why it
may exist, and only ``ClusterView`` keeps one whose name says lifecycle, role or load.

What this proves: no new per-instance collection appears in those packages without a
reviewer reading its line here, and the names that announce a record of lifecycle, role
or load live in ``ClusterView`` alone. What it cannot prove: that a listed collection
does not hold such a record under another name; the reasons below are the review."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("src/llumnix/cluster", "src/llumnix/policy")
SIM_FILES = ("src/llumnix/sim/pd_flow.py", "src/llumnix/sim/policy_bridge.py")
"""The simulator's PD and policy bridge drive the same ClusterView."""
CONTAINERS = {"dict", "set", "defaultdict", "OrderedDict", "Counter", "deque"}
ANNOTATED = ("dict[", "set[", "MutableMapping[", "Mapping[", "OrderedDict[", "defaultdict[", "deque[")
OWNER = ("cluster_view", "ClusterView")

ALLOWED: dict[tuple[str, str, str], str] = {
    # the owner and the books it is made of
    ("cluster_view", "ClusterView", "statuses"): "the latest status per instance",
    ("cluster_view", "ClusterView", "promised"): "PD hand-off blocks promised since a report",
    ("cluster_view", "ClusterView", "_roles"): "PD roles",
    ("cluster_view", "ClusterView", "_role_since"): "when each role was taken",
    ("cluster_view", "ClusterView", "_removed"): "removed ids whose late reports are ignored",
    ("lifecycle", "Lifecycles", "_entries"): "the lifecycle machine ClusterView owns (its .lifecycle)",
    ("pending", "PendingDispatches", "_by_instance"): "the pending book ClusterView owns (its .pending)",
    # handles, connections, threads and queues keyed by instance (not its state)
    ("llumsched_state", "SchedState", "handles"): "actor handles",
    ("llumsched_state", "SchedState", "in_flight"): "ObjectRefs of migration rounds under way",
    ("gateway_client", "ClusterBackend", "instances"): "actor handles",
    ("gateway_client", "ClusterBackend", "links"): "open request channels",
    ("gateway_client", "ClusterBackend", "pollers"): "tasks reading each channel",
    ("gateway_client", "ClusterBackend", "dead"): "actor ids never to poll again (handles, not instances)",
    ("gateway_client", "ClusterBackend", "tasks"): "background tasks",
    ("gateway_client", "ClusterBackend", "streams"): "client streams by request",
    ("gateway_client", "ClusterBackend", "unconfirmed"): "requests sent but not confirmed, by request",
    ("failover", "Failover", "reaping"): "request ids being stopped",
    ("output_stream", "OutputStream", "held"): "one request's outputs by token index",
    ("channel", "ChannelServer", "_clients"): "connections by client",
    ("channel", "ChannelServer", "_conns"): "connections",
    ("status_feed", "StatusFeed", "_lines"): "LlumSched's connections to the channels",
    ("status_feed", "StatusFeed", "_live"): "which of those connections are up",
    ("migration_source", "MigrationSource", "_senders"): "KV transport connections by destination",
    ("handoff", "HandoffWorker", "_in_flight"): "hand-off threads by request",
    ("instance", "InstanceServer", "_final_only"): "one instance's requests held to the end",
    ("instance", "InstanceServer", "_held"): "one instance's outputs held for a client",
    ("instance", "InstanceServer", "_last_read"): "one instance's outbox reads by client",
    ("instance", "InstanceServer", "_outboxes"): "one instance's outboxes by client",
    ("instance", "InstanceServer", "statuses"): "one instance's own recent statuses (its receiver queue)",
    ("instance", "InstanceServer", "step_log"): "one instance's step times",
    ("llumlet", "Llumlet", "migrating_out"): "one instance's requests migrating out",
    # the shared meta store is a store, not a view: it is written from the reports
    ("meta_store", "MemoryMetaStore", "_members"): "the in-memory store's membership records",
    ("meta_store", "MemoryMetaStore", "_statuses"): "the in-memory store's status records",
    ("meta_store", "StoreWriter", "_members"): "writes to the store not yet flushed",
    ("meta_store", "StoreWriter", "_pending"): "writes to the store not yet flushed",
    ("meta_store", "StoreWriter", "_pending_members"): "writes to the store not yet flushed",
    # policy state derived from the view, not a copy of it
    ("global_scheduler", "GlobalScheduler", "_views"): "cache: each status with its pending requests",
    ("global_scheduler", "GlobalScheduler", "_stale_views"): "cache invalidation of _views",
    ("global_scheduler", "GlobalScheduler", "_stale_keys"): "cache invalidation of the dispatch index",
    ("global_scheduler", "GlobalScheduler", "sent"): "round-robin's count of dispatches",
    ("dispatch_index", "DispatchIndex", "_keys"): "cache: each view's dispatch key",
    ("prefix_affinity", "PrefixIndex", "_holders"): "prompt blocks sent where (prefix affinity)",
    ("prefix_affinity", "PrefixIndex", "_sent"): "prompt blocks sent where (prefix affinity)",
    ("prefix_affinity", "PrefixIndex", "num_forgotten"): "a counter for /admin/cluster",
    ("trigger", "Reactions", "marks"): "each status's rescheduling marks, kept to see them change",
    ("trigger", "Reactions", "_source_since"): "reaction-time clocks",
    ("trigger", "Reactions", "_destination_since"): "reaction-time clocks",
    ("trigger", "Reactions", "_wanting"): "sources waiting for a destination",
    ("replacement", "Replacement", "replacing"): "launches under way: when the instance each replaces was lost",
    ("replacement", "Replacement", "_relearn"): "after a restart: drained instances to ask whether scale-in marked them",
    ("replacement", "Replacement", "_lost"): "times of losses not yet replaced (not keyed by instance)",
    ("replacement", "Replacement", "scaling_events"): "history for /admin/cluster",
    ("history", "MigrationHistory", "_key_set"): "migration reports seen",
    ("history", "MigrationHistory", "_keys"): "migration reports seen",
    ("history", "MigrationHistory", "aborted_by_reason"): "counts",
    ("history", "MigrationHistory", "reports"): "recent reports",
    ("history", "ReactionHistogram", "recent"): "recent reaction times",
    ("pd", "PDBook", "abort_reasons"): "counts",
    ("pd", "PDBook", "changes"): "history of role changes",
    ("pd", "PDBook", "counts"): "counts",
    ("pd", "PDBook", "downtimes_s"): "hand-off stalls",
    ("pd", "PDBook", "recent"): "recent hand-off reports",
    ("pd_flow", "PDFlow", "counts"): "the simulator's PD counts",
    ("policy_bridge", "PolicyBridge", "_named"): "the request each rescue order names, by (source, destination)",
    ("policy_bridge", "PolicyBridge", "_rescuing"): "the (source, destination) of rescues under way, whose chains "
                                                    "end with the request each names",
    ("predictor", "OutputLengths", "_seen"): "recent output lengths, not per instance",
    ("slo_dispatch", "ShedBook", "num_seen"): "requests seen per SLO class",
    ("slo_dispatch", "ShedBook", "num_shed"): "requests shed per SLO class",
    ("slo_predict", "SLOPredictor", "_memo"): "a cache of each status object's derived load, replaced with the object",
    ("slo_predict", "SLOPredictor", "ttft_log"): "the TTFT predicted per request, for its error",
    ("slo_predict", "SLOPredictor", "_models"): "each instance's step-time model, fitted on its step reports",
    ("slo_predict", "SLOPredictor", "step_log"): "predicted and measured step times, for the error (not per instance)",
    ("llumlet", "Llumlet", "_steps"): "one instance's steps since its last push",
    ("pd_flow", "PDFlow", "recent"): "the last hand-offs, as LlumSched lists them for the dashboard",
    ("fair_share", "FairShare", "_queues"): "requests waiting per client (the gateway's fair share), not instances",
    ("fair_share", "FairShare", "_serving"): "choices in service per client",
    ("fair_share", "FairShare", "counters"): "each client's virtual token counter",
    ("pipeline", "DispatchContext", "memo"): "cache: metrics per status object",
    ("pipeline", "DispatchContext", "sent"): "GlobalScheduler.sent, lent to the plugins",
    ("pipeline", "DispatchContext", "prefix_hits"): "one dispatch's prefix matches",
    ("launcher", "Cluster", "instances"): "actor handles of a started cluster",
    ("launcher", "Cluster", "info"): "the first instance's model facts",
}
VIEW_WORDS = re.compile(r"role|lifecycle|status|terminat|removed|pending|promised|load|schedulable|state")
"""Names that announce a record of an instance's lifecycle, role or load."""
NOT_A_VIEW = {("instance", "InstanceServer", "statuses"), ("meta_store", "MemoryMetaStore", "_statuses"),
              ("meta_store", "StoreWriter", "_pending"), ("meta_store", "StoreWriter", "_pending_members"),
              ("lifecycle", "Lifecycles", "_entries"), ("pending", "PendingDispatches", "_by_instance")}
"""Matches of VIEW_WORDS that are not a view: one instance's own statuses, the store's
records and unflushed writes, and the two books ClusterView is made of."""


def _is_container(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Dict | ast.Set | ast.DictComp | ast.SetComp):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) in CONTAINERS
    return False


def _is_annotated(ann: ast.expr) -> bool:
    return ast.unparse(ann).startswith(ANNOTATED)


def _is_frozen(cls: ast.ClassDef) -> bool:
    """A frozen dataclass: a value (a config, a snapshot passed to a pure function), not a record kept."""
    return any(isinstance(d, ast.Call) and any(k.arg == "frozen" and isinstance(k.value, ast.Constant)
                                               and k.value.value is True for k in d.keywords)
               for d in cls.decorator_list)


def collections_kept(source: str, module: str) -> set[tuple[str, str, str]]:
    """(module, class, attribute) of each collection a class keeps: assigned to ``self``
    in any method, or a dataclass-style field of the class body (frozen dataclasses left
    out: values, not records)."""
    found = set()
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and not _is_frozen(n)):
        for stmt in cls.body:  # fields: `name: dict[...] = field(default_factory=dict)`
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and _is_annotated(stmt.annotation):
                found.add((module, cls.name, stmt.target.id))
        for n in ast.walk(cls):
            if isinstance(n, ast.Assign):
                targets, value, ann = n.targets, n.value, None
            elif isinstance(n, ast.AnnAssign):
                targets, value, ann = [n.target], n.value, n.annotation
            else:
                continue
            for t in targets:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                        and (_is_container(value) or (ann is not None and _is_annotated(ann)))):
                    found.add((module, cls.name, t.attr))
    return found


def _kept() -> set[tuple[str, str, str]]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).glob("*.py"))] + [ROOT / f for f in SIM_FILES]
    return {k for p in files for k in collections_kept(p.read_text(), p.stem)}


def test_the_scan_finds_each_form():
    src = ("from dataclasses import dataclass, field\n"
           "@dataclass\nclass S:\n    handles: dict[str, int] = field(default_factory=dict)\n    n: int = 0\n"
           "@dataclass(frozen=True)\nclass V:\n    roles: dict[str, str]\n"
           "class C:\n    def __init__(self):\n        self.a = {}\n        self.b: dict[str, int] = make()\n"
           "        self.c = set()\n        self.d = 0\n        self.e = {k: 1 for k in ()}\n")
    assert collections_kept(src, "m") == {("m", "S", "handles"), ("m", "C", "a"), ("m", "C", "b"), ("m", "C", "c"),
                                          ("m", "C", "e")}


def test_every_collection_in_the_control_plane_is_reviewed():
    kept = _kept()
    unreviewed = sorted(kept - set(ALLOWED))
    assert not unreviewed, ("a new collection keyed by something: if it records an instance's lifecycle, role "
                            f"or load, keep it in ClusterView; else list it in ALLOWED with why: {unreviewed}")
    stale = sorted(set(ALLOWED) - kept)
    assert not stale, f"ALLOWED names collections that are gone: {stale}"


def test_only_the_cluster_view_keeps_lifecycle_role_or_load():
    records = sorted(k for k in _kept() if VIEW_WORDS.search(k[2].lower()) and k[:2] != OWNER and k not in NOT_A_VIEW)
    assert not records, f"only ClusterView keeps these (policy/cluster_view.py): {records}"
