from __future__ import annotations

import textwrap

import pytest

from llumnix.sim.config import ConfigError, apply_override, load_config, parse_config

BASE = {
    "systems": {"rr": {"dispatch": "round-robin"}},
    "traces": [{"name": "M-M", "kind": "M-M", "rates": [1.0, 2.0]}],
}


def _cfg(**changes):
    doc = {**BASE, **changes}
    return parse_config(doc)


@pytest.mark.parametrize("doc,field", [
    ({"traces": [{"name": "M-M", "kind": "M-M", "rates": [-1.0]}]}, "traces.M-M.rates"),
    ({"traces": [{"name": "X", "kind": "sharegpt", "rates": [1], "path": "/no/such/file.json"}]}, "traces.X.path"),
    ({"traces": [{"name": "Q", "kind": "Q-Q", "rates": [1]}]}, "traces.Q"),
    ({"systems": {"s": {"dispatch": "no-such-policy"}}}, "systems.s.dispatch"),
    ({"systems": {"s": {"dispatch": "round-robin", "migration": "yes"}}}, "systems.s.migration"),
    ({"systems": {"s": {"engine": {"max_num_seq": 1}}}}, "systems.s.engine.max_num_seq"),
    ({"systems": {"s": {"scheduling": {"dispatch": {"policy": "nope"}}}}}, "systems.s.scheduling.dispatch.policy"),
    ({"cluster": {"num_instance": 4}}, "cluster.num_instance"),
    ({"cluster": {"num_instances": 0}}, "num_instances"),
    ({"cluster": {"chunked_prefill": True, "max_num_seqs": 64, "max_num_batched_tokens": 32}},
     "max_num_batched_tokens"),
    ({"seeds": 0}, "seeds"),
    ({"traces": [{"name": "M-M", "kind": "M-M", "rates": [1.0], "seeds": 0}]}, "traces.M-M.seeds"),
    ({"latency_model": "no-such-model"}, "latency_model"),
    ({"step_overhead_s": -0.001}, "step_overhead_s"),
    ({"step_overhead_s": "5ms"}, "step_overhead_s"),
    ({"seq_overhead_s": -0.0001}, "seq_overhead_s"),
    ({"bogus": 1}, "bogus"),
    ({"traces": [{"name": "P", "kind": "S-S", "rates": [1], "prefix_groups": 4}]}, "traces.P"),
    ({"traces": [{"name": "P", "kind": "S-S", "rates": [1], "prefix_groups": -1, "prefix_tokens": 8}]},
     "traces.P.prefix_groups"),
    ({"traces": [{"name": "P", "kind": "S-S", "rates": [1], "prefix_groups": 2, "prefix_tokens": "x"}]},
     "traces.P.prefix_tokens"),
])
def test_bad_configs_raise_one_line_errors_naming_the_field(doc, field):
    with pytest.raises(ConfigError) as e:
        _cfg(**doc)
    msg = str(e.value)
    assert field in msg and "\n" not in msg


def test_overrides_reach_nested_keys_lists_and_named_traces(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_text(textwrap.dedent("""
        name: t
        systems: {rr: {dispatch: round-robin}}
        traces:
          - {name: M-M, kind: M-M, rates: [1.0]}
          - {name: S-S, kind: S-S, rates: [2.0]}
    """))
    cfg = load_config(p, ["cluster.num_instances=4", "traces.S-S.rates=[3, 4]", "traces.0.num_requests=50",
                          "cluster.migration.max_stages=2", "include_traces=[S-S, M-M]"])
    assert cfg.cluster.num_instances == 4 and cfg.cluster.migration.max_stages == 2
    assert cfg.traces[1].rates == (3.0, 4.0) and cfg.traces[0].spec.num_requests == 50
    with pytest.raises(ConfigError, match="no list item named"):
        load_config(p, ["traces.L-L.rates=[1]"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_override({}, "nonsense")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_per_trace_system_overrides():
    cfg = _cfg(systems={"ll": {"dispatch": "round-robin", "migration": True}},
               traces=[{"name": "M-M", "kind": "M-M", "rates": [1], "systems": {"ll": {"migration": False}}}])
    s = cfg.system_for(cfg.systems[0], cfg.traces[0])
    assert cfg.systems[0].enable_migration and not s.enable_migration


def test_a_trace_can_have_its_own_number_of_seeds():
    from llumnix.sim.runner import plan

    cfg = _cfg(seeds=2, traces=[{"name": "M-M", "kind": "M-M", "rates": [1.0], "seeds": 4},
                                {"name": "S-S", "kind": "S-S", "rates": [1.0]}])
    runs = plan(cfg)
    assert sorted(r.seed for r in runs if r.trace.name == "M-M") == [0, 1, 2, 3]
    assert sorted(r.seed for r in runs if r.trace.name == "S-S") == [0, 1]
    assert sorted({r.seed for r in plan(cfg, seeds=1)}) == [0]  # --seeds overrides every trace


def test_step_overhead_reaches_every_run_and_replaces_the_models():
    from llumnix.sim.runner import plan

    assert all(r.step_overhead_s is None for r in plan(_cfg()))
    cfg = _cfg(step_overhead_s=0.008)
    assert cfg.step_overhead_s == 0.008
    assert {r.step_overhead_s for r in plan(cfg)} == {0.008}
    assert all(r.seq_overhead_s is None for r in plan(cfg))
    cfg = _cfg(seq_overhead_s=0.0002)
    assert {(r.step_overhead_s, r.seq_overhead_s) for r in plan(cfg)} == {(None, 0.0002)}
