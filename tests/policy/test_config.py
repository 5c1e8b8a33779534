"""Configs build from YAML dicts; unknown keys, names and bad values name the field."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from llumnix.policy import (
    DispatchConfig,
    FreenessConfig,
    PolicyConfigError,
    ReschedulingConfig,
    ScalingConfig,
    SchedulingConfig,
)

YAML = """
freeness: {headroom_tokens: {high: 3200, normal: 0, "2": 6400}}
dispatch: {policy: llm-d, params: {queue_weight: 2}, staleness_s: 0.5}
rescheduling: {out_threshold: 10, in_threshold: 12, max_out: 2, selection: SR}
scaling: {enabled: true, scale_out_below: 5, scale_in_above: 50, max_instances: 4}
"""


def test_a_yaml_document_maps_onto_the_fields():
    cfg = SchedulingConfig.from_dict(yaml.safe_load(YAML))
    assert cfg.freeness.headroom_tokens == {1: 3200, 0: 0, 2: 6400}
    assert (cfg.dispatch.policy, cfg.dispatch.params, cfg.dispatch.staleness_s) == ("llm-d", {"queue_weight": 2}, 0.5)
    assert (cfg.rescheduling.out_threshold, cfg.rescheduling.in_threshold, cfg.rescheduling.max_out,
            cfg.rescheduling.selection) == (10, 12, 2, "SR")
    assert cfg.scaling.enabled and cfg.scaling.max_instances == 4


def test_defaults_are_the_papers():
    cfg = SchedulingConfig.from_dict(None)
    assert cfg.freeness.headroom_tokens == {1: 1600, 0: 0}
    assert cfg.dispatch.policy == "llumnix"
    assert (cfg.rescheduling.out_threshold, cfg.rescheduling.max_out, cfg.rescheduling.max_in,
            cfg.rescheduling.selection) == (3.0, 1, 1, "paper")
    assert (cfg.scaling.scale_out_below, cfg.scaling.scale_in_above) == (10.0, 60.0)


@pytest.mark.parametrize("doc,field", [
    ({"bogus": {}}, "bogus"),
    ({"rescheduling": {"bogus": 1}}, "rescheduling.bogus"),
    ({"dispatch": {"polcy": "llumnix"}}, "dispatch.polcy"),
    ({"scaling": {"window": 3}}, "scaling.window"),
    ({"freeness": {"headroom": {}}}, "freeness.headroom"),
    ({"dispatch": {"policy": "nope"}}, "dispatch.policy"),
    ({"dispatch": {"policy": "llm-d", "params": {"queue_wieght": 1}}}, "dispatch.params.queue_wieght"),
    ({"dispatch": {"staleness_s": 0}}, "dispatch.staleness_s"),
    ({"rescheduling": {"selection": "biggest"}}, "rescheduling.selection"),
    ({"rescheduling": {"out_threshold": 5, "in_threshold": 4}}, "rescheduling.in_threshold"),
    ({"rescheduling": {"max_in": 0}}, "rescheduling.max_in"),
    ({"scaling": {"cooldown_s": -1}}, "scaling.cooldown_s"),
    ({"dispatch": {"params": {"tie_break": "coin"}}}, "dispatch.params.tie_break"),
    ({"scaling": {"scale_out_below": 70}}, "scaling.scale_out_below"),
    ({"scaling": {"min_instances": 5, "max_instances": 4}}, "scaling.min_instances"),
    ({"scaling": {"signal": "median"}}, "scaling.signal"),
    ({"rescheduling": {"pairing": "best"}}, "rescheduling.pairing"),
    ({"rescheduling": {"queued_moves": "never"}}, "rescheduling.queued_moves"),
    ({"freeness": {"headroom_tokens": {"urgent": 10}}}, "freeness.headroom_tokens"),
    ({"freeness": {"headroom_tokens": {"high": -1}}}, "freeness.headroom_tokens"),
])
def test_bad_fields_and_names_raise_an_error_naming_the_field(doc, field):
    with pytest.raises(PolicyConfigError) as e:
        SchedulingConfig.from_dict(doc)
    assert e.value.param == field
    assert field.split(".")[-1] in str(e.value)


def test_not_a_mapping_is_an_error():
    with pytest.raises(PolicyConfigError, match="rescheduling must be a mapping"):
        SchedulingConfig.from_dict({"rescheduling": [1, 2]})


@pytest.mark.parametrize("cls", [FreenessConfig, DispatchConfig, ReschedulingConfig, ScalingConfig,
                                 SchedulingConfig])
def test_configs_are_frozen_and_every_field_is_documented(cls):
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {stmt.target.id for stmt, nxt in zip(body, body[1:], strict=False)
                  if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                  and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)}
    assert {f.name for f in dataclasses.fields(cls)} <= documented
    with pytest.raises(dataclasses.FrozenInstanceError):
        cls().x = 1  # type: ignore[misc]
