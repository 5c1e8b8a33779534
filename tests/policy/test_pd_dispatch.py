"""GlobalScheduler with PD roles: dispatch only to prefill-taking instances (with the
incremental index, the full pipeline and prefix affinity alike), rescheduling only within
the decode pool."""
from __future__ import annotations

from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig
from tests.policy.snapshots import inst, run


def _req(i: int, tokens: list[int] | None = None) -> DispatchRequest:
    return DispatchRequest(f"r{i}", 32 if tokens is None else len(tokens), 0, 0.0, tokens)


def _gs(policy: str = "llumnix", **dispatch_params) -> GlobalScheduler:
    cfg = SchedulingConfig.from_dict({"dispatch": {"policy": policy, "params": dispatch_params,
                                                   "pending_grace_s": 0.0}})
    gs = GlobalScheduler(cfg)
    # the decode instance is the freest: without roles it would take every request
    gs.add_instance(inst("p", running=[run("a", 40)]))
    gs.add_instance(inst("d"))
    return gs


def test_new_requests_go_to_the_prefill_pool_only():
    for policy, params in (("llumnix", {}), ("round-robin", {}), ("llumnix", {"prefix": True}),
                           ("least-requests", {}), ("llm-d", {})):
        gs = _gs(policy, **params)
        assert gs.dispatch(_req(0, list(range(32))), 0.0) == "d"  # co-located: the freest
        gs.set_role("p", "prefill")
        gs.set_role("d", "decode")
        picks = {gs.dispatch(_req(i, list(range(32))), 0.0) for i in range(1, 6)}
        assert picks == {"p"}, (policy, params)
        gs.set_role("d", "mixed")  # lent: takes prefills again
        assert gs.dispatch(_req(9), 0.0) == "d"


def test_no_prefill_taker_means_no_dispatch():
    gs = _gs()
    gs.set_role("p", "decode")
    gs.set_role("d", "decode")
    assert gs.dispatch(_req(0), 0.0) is None


def test_rescheduling_pairs_only_within_the_decode_pool():
    cfg = SchedulingConfig.from_dict({"rescheduling": {"enabled": True}})
    gs = GlobalScheduler(cfg)
    gs.add_instance(inst("p", running=[run(f"a{i}", 12) for i in range(8)]))  # overloaded
    gs.add_instance(inst("d1"))
    gs.add_instance(inst("d2", running=[run(f"b{i}", 12) for i in range(7)]))
    assert any(o.src_instance_id == "p" for o in gs.reschedule(0.0))
    gs.set_role("p", "prefill")
    gs.set_role("d1", "decode")
    gs.set_role("d2", "decode")
    orders = gs.reschedule(0.0)
    assert orders and all("p" not in (o.src_instance_id, o.dst_instance_id) for o in orders)
