"""SLO classes in the system config (policy/slo.py): defaults, validation, priorities."""
from __future__ import annotations

import dataclasses

import pytest

from llumnix.config import SystemConfig, SystemConfigError
from llumnix.core.request import Priority
from llumnix.policy import PolicyConfigError, SchedulingConfig
from llumnix.policy.slo import SLOClass, SLOConfig


def test_default_classes_are_interactive_and_batch() -> None:
    slo = SystemConfig().scheduling.slo
    assert slo.get("interactive") == SLOClass("interactive", 1.0, 0.1, 0.0, int(Priority.HIGH))
    assert slo.get("batch") == SLOClass("batch", 10.0, 0.3, 0.0, int(Priority.NORMAL))


def test_priorities_map_onto_classes() -> None:
    slo = SLOConfig()
    assert slo.resolve(None, int(Priority.HIGH)).name == "interactive"
    assert slo.resolve(None, int(Priority.NORMAL)).name == "batch"
    assert slo.resolve(None, 7).name == "batch"  # no class has priority 7: the default class
    assert slo.resolve("interactive", int(Priority.NORMAL)).name == "interactive"  # a named class wins


def test_unknown_class_names_slo_class() -> None:
    with pytest.raises(PolicyConfigError) as e:
        SLOConfig().get("gold")
    assert e.value.param == "slo_class" and "gold" in str(e.value) and "interactive" in str(e.value)


@pytest.mark.parametrize(("doc", "path", "problem"), [
    ({"classes": {"a": {"ttft_s": -1, "tpot_s": 1}}}, "scheduling.slo.classes.a.ttft_s", "must be a number > 0"),
    ({"classes": {"a": {"ttft_s": 1}}}, "scheduling.slo.classes.a.tpot_s", "is required"),
    ({"classes": {"a": {"ttft_s": 1, "tpot_s": 1, "shed_share": 1.5}}}, "scheduling.slo.classes.a.shed_share",
     "<= 1"),
    ({"classes": {"a": {"ttft_s": 1, "tpot_s": 1, "priority": "urgent"}}}, "scheduling.slo.classes.a.priority",
     "unknown priority"),
    ({"classes": {"a": {"ttft_s": 1, "tpot_s": 1, "tpot": 2}}}, "scheduling.slo.classes.a.tpot", "unknown field"),
    ({"classes": {}}, "scheduling.slo.classes", "non-empty"),
    ({"default_class": "gold"}, "scheduling.slo.default_class", "unknown class 'gold'"),
    ({"rescue": "yes"}, "scheduling.slo.rescue", "true or false"),
    ({"output_tokens": 0}, "scheduling.slo.output_tokens", ">= 1"),
    ({"engine_order": "lifo"}, "scheduling.slo.engine_order", "must be one of fcfs, overdue, deadline"),
    ({"bogus": 1}, "scheduling.slo.bogus", "unknown key"),
])
def test_bad_values_name_their_path(doc: dict, path: str, problem: str) -> None:
    with pytest.raises(SystemConfigError) as e:
        SystemConfig.from_dict({"scheduling": {"slo": doc}})
    assert e.value.path == path and problem in e.value.problem


def test_operator_classes_and_round_trip_through_asdict() -> None:
    doc = {"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05, "shed_share": 0.1, "priority": "high"},
                       "bulk": {"ttft_s": 30, "tpot_s": 1}}, "default_class": "bulk", "rescue": False}
    s = SystemConfig.from_dict({"scheduling": {"slo": doc}}).scheduling
    assert s.slo.get("chat") == SLOClass("chat", 0.5, 0.05, 0.1, int(Priority.HIGH))
    assert s.slo.for_priority(int(Priority.NORMAL)).name == "bulk" and s.slo.rescue is False
    # the cluster's config travels as asdict(); it must come back the same
    assert SchedulingConfig.from_dict(dataclasses.asdict(s)).slo == s.slo
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.slo.rescue = True  # type: ignore[misc]


def test_met_needs_both_objectives() -> None:
    c = SLOClass("x", 1.0, 0.1)
    assert c.is_met(0.9, 0.1) and c.is_met(1.0, None)
    assert not c.is_met(1.1, 0.05) and not c.is_met(0.5, 0.11) and not c.is_met(None, 0.05)
