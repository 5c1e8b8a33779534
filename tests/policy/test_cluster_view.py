"""ClusterView: one record per instance (lifecycle, PD role, status, pending dispatches,
promised blocks), shared by the scheduler and the PD book, and nobody else's."""
from __future__ import annotations

import json

import pytest

from llumnix.cluster.pd import PDBook
from llumnix.policy import DispatchRequest, FreenessConfig, GlobalScheduler
from llumnix.policy.cluster_view import ClusterView, Role
from llumnix.policy.lifecycle import InstanceState
from llumnix.policy.pd import PDConfig
from tests.policy.snapshots import inst, run


def test_roles_are_an_enum_that_reads_as_its_name():
    assert Role("decode") is Role.DECODE and Role.DECODE == "decode"
    assert json.dumps({"i0": Role.PREFILL}) == '{"i0": "prefill"}'
    assert [r.takes_prefill for r in Role] == [True, False, True]
    assert [r.in_decode_pool for r in Role] == [False, True, True]
    with pytest.raises(ValueError):
        Role("both")


def test_set_role_counts_the_split_and_keeps_since_when_unchanged():
    view = ClusterView()
    assert not view.is_split and view.role_of("i0") is Role.MIXED
    assert view.set_role("i0", "mixed", 1.0) and not view.is_split
    assert view.set_role("i1", Role.DECODE, 2.0) and view.is_split
    assert not view.set_role("i1", "decode", 5.0) and view.role_since["i1"] == 2.0
    assert view.set_role("i1", "mixed", 6.0) and not view.is_split and view.role_since["i1"] == 6.0
    view.set_role("i2", "prefill", 7.0)
    assert view.ids_with(Role.PREFILL, Role.MIXED) == ["i0", "i1", "i2"] and view.is_split
    view.drop_role("i2")
    assert not view.is_split and "i2" not in view.roles
    assert view.takes_prefill("x") and view.in_decode_pool("x")  # an unknown instance is mixed


def test_admit_forget_and_late_reports_through_the_scheduler():
    gs = GlobalScheduler()
    view = gs.cluster
    gs.add_instance(inst("i0", ts=1.0))
    assert view.lifecycle.state("i0") == InstanceState.SERVING and "i0" in view.statuses
    gs.dispatch(DispatchRequest("r", 32, 0, 1.0), 1.0)
    assert view.pending.num_pending("i0") == 1
    view.promised["i0"] = 3
    gs.remove_instance("i0")
    assert "i0" not in view.statuses and view.pending.num_pending("i0") == 0 and "i0" not in view.promised
    assert view.is_removed("i0")
    gs.update_status(inst("i0", ts=2.0))  # a late report adds nothing
    assert "i0" not in view.statuses
    gs.add_instance(inst("i0", ts=3.0))  # an explicit add does
    assert not view.is_removed("i0") and view.lifecycle.state("i0") == InstanceState.SERVING


def test_terminating_is_the_lifecycle_state_and_survives_reports_until_undrained():
    gs = GlobalScheduler()
    gs.add_instance(inst("i0", ts=1.0))
    gs.cluster.lifecycle.move("i0", InstanceState.TERMINATING, 1.5, "drain")  # LlumSched's drain
    gs.mark_terminating("i0")
    assert gs.cluster.lifecycle.get("i0").reason == "drain"  # the caller's reason stays
    gs.update_status(inst("i0", ts=2.0, running=[run("a", 4)]))  # its report does not know yet
    assert gs.statuses["i0"].is_terminating
    gs.unmark_terminating("i0")
    assert gs.cluster.lifecycle.state("i0") == InstanceState.SERVING and not gs.statuses["i0"].is_terminating


def test_the_pd_book_and_the_scheduler_share_one_view():
    gs = GlobalScheduler()
    book = PDBook(PDConfig(mode="static", prefill_instances=1), FreenessConfig(headroom_tokens={}), gs.cluster)
    for i in ("p", "d"):
        gs.add_instance(inst(i, ts=1.0))
        gs.set_role(i, book.add(i, 1.0), 1.0)
    assert gs.roles == {"p": Role.PREFILL, "d": Role.DECODE} and gs.cluster.is_split
    assert gs.dispatch(DispatchRequest("r", 16, 0, 1.0), 1.0) == "p"  # the decode instance takes none
    assert book.pick(gs.statuses.values(), "p", 10) == "d" and gs.cluster.promised["d"] == 11
    book.on_status("d")
    assert "d" not in gs.cluster.promised
    gs.remove_instance("d")
    assert book.role_of("d") is Role.MIXED  # the book sees the removal: one record


def test_the_scheduler_refuses_a_store_beside_a_view():
    with pytest.raises(ValueError):
        GlobalScheduler(store={}, cluster=ClusterView())
