"""An order that names its request (a rescue's, policy/slo_rescue.py) on the serving
cluster's source: ``MigrationSource.migrate_out`` moves that request and only it, or, when
it cannot, ends the round with one report saying why; an order without a name selects and
chains as before. The driver and the destination are fakes: no Ray."""
from __future__ import annotations

from typing import Any

import pytest

from llumnix.cluster import migration_source
from llumnix.cluster.migration_source import MigrationSource
from llumnix.migration.protocol import MigrationConfig, MigrationReport
from llumnix.policy import Llumlet, SchedulingConfig
from llumnix.policy.rounds import keep_migrating, why_not_named
from tests.policy.snapshots import inst, run, wait
from tests.policy.test_replay import LiteralEngine


class Server:
    def call(self, fn: Any) -> Any:
        return fn()


def _source(status: Any, monkeypatch: pytest.MonkeyPatch, moved: list[str]) -> MigrationSource:
    cfg = SchedulingConfig()
    engine = LiteralEngine()
    engine.status = status
    ll = Llumlet(status.instance_id, engine, cfg.rescheduling, cfg.freeness)
    src = MigrationSource(Server(), ll, MigrationConfig(merge_boundaries=False), "tcp", None, b"", lambda r: None)
    monkeypatch.setattr(src, "_sender", lambda *a, **kw: object())

    def migrate(request_id: str, *a: Any, **kw: Any) -> MigrationReport:
        moved.append(request_id)
        ll.on_migration_started(request_id)  # as the driver; the literal snapshot keeps it: never picked again
        return MigrationReport(request_id, "a", "b", True, None, 1, 1, 0, 0.01, 0.1)

    monkeypatch.setattr("llumnix.migration.driver.migrate", migrate)
    # after a move the unnamed round reads the destination over Ray: here, a free one
    monkeypatch.setattr(migration_source.ray, "get", lambda refs, timeout=None: (inst("b", total=1000), 0))
    return src


class Dst:
    class _Call:
        def remote(self) -> None:
            return None

    status = mig_num_reservations = _Call()


# a: a source by Algorithm 1 (its queue's demand past its free blocks), three requests to give up
A = inst("a", total=100, running=[run("r0", 40, prio=1), run("r1", 40)], waiting=[wait("w0", 640)])


def test_why_not_named_moves_a_running_or_queued_request_not_one_gone_or_migrating() -> None:
    assert why_not_named(A, "r1") is None and why_not_named(A, "w0") is None
    assert "is not on a" in str(why_not_named(A, "gone"))
    assert "migrating" in str(why_not_named(A, "r1", {"r1"}))
    moving = inst("a", total=100, running=[run("r0", 40, migrating=True)])
    assert "migrating" in str(why_not_named(moving, "r0"))


def test_a_named_order_never_chains() -> None:
    cfg = SchedulingConfig()
    free = inst("b", total=1000)
    assert keep_migrating(A, free, 0, cfg.rescheduling, cfg.freeness)  # the freeness rule holds
    assert not keep_migrating(A, free, 0, cfg.rescheduling, cfg.freeness, named="r1")


def test_the_cluster_moves_the_named_request_and_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    moved: list[str] = []
    src = _source(A, monkeypatch, moved)
    assert src.llumlet.select_requests_to_migrate(0.0) != ["w0"]  # the selection would pick another
    reports = src.migrate_out("b", Dst(), None, "w0")
    assert moved == ["w0"] and [r["request_id"] for r in reports] == ["w0"]
    moved.clear()
    reports = src.migrate_out("b", Dst())  # no name: the selection's picks, chained while the rule holds
    assert len(moved) > 1 and moved[0] != "w0"


def test_a_named_request_gone_ends_the_order_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    moved: list[str] = []
    told: list[dict[str, Any]] = []
    src = _source(A, monkeypatch, moved)
    src._on_report = told.append
    reports = src.migrate_out("b", Dst(), None, "finished-one")
    assert moved == []
    assert told == reports and len(reports) == 1
    [rep] = reports
    assert rep["request_id"] == "finished-one" and not rep["committed"]
    assert rep["abort_code"] == "source_finished" and "is not on a" in rep["abort_reason"]
    assert rep["start_time"] is not None  # LlumSched counts it once (told now, returned with the round)


def test_llumsched_sends_the_name_with_the_order() -> None:
    import threading
    from types import SimpleNamespace

    from llumnix.cluster.rescheduler import Rescheduler
    from llumnix.policy.pairing import MigrationOrder

    sent: list[tuple[Any, ...]] = []

    class Handle:
        class migrate_out:  # noqa: N801 - a Ray actor method's shape
            @staticmethod
            def remote(*args: Any) -> str:
                sent.append(args)
                return "ref"

    orders = [MigrationOrder("a", "b", "q"), MigrationOrder("c", "d")]
    handles = {k: Handle() for k in "abcd"}
    gs = SimpleNamespace(reschedule=lambda now: orders)
    state = SimpleNamespace(lock=threading.Lock(), in_flight={}, handles=handles, gs=gs)
    Rescheduler(state, SchedulingConfig(), 1.0).run_pass()  # type: ignore[arg-type]
    assert sent == [("b", handles["b"], None, "q"), ("d", handles["d"], None, None)]
    assert state.in_flight == {"a": "ref", "c": "ref"}
