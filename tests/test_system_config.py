"""One system config (llumnix.config): the file `llumnix serve --config` reads is a system
the simulator runs, with the same engine and scheduling values; errors name their path."""
from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from llumnix.cli import main
from llumnix.config import CHUNKED_BUDGET, SystemConfig, SystemConfigError
from llumnix.config.sections import TRANSPORTS
from llumnix.sim.config import ConfigError, parse_config

DEFAULT = Path(__file__).parents[1] / "benchmarks" / "configs" / "llumnix-default.yaml"


def _serve(*argv: str):
    from llumnix.cluster.serve import add_serve_args, build_config

    p = argparse.ArgumentParser()
    add_serve_args(p)
    return build_config(p.parse_args(list(argv)))


def _experiment(system: dict, **cluster) -> dict:
    return {"latency_model": "a10-llama7b", "plots": False,
            "cluster": {"num_instances": 4, "num_blocks": 400, "max_model_len": 4096, **cluster},
            "systems": {"served": system},
            "traces": [{"name": "S-S", "kind": "S-S", "num_requests": 40, "rates": [4.0], "prefix_groups": 4,
                        "prefix_tokens": 64}]}


def test_the_default_file_is_what_serve_runs_without_flags():
    assert _serve("--config", str(DEFAULT)) == _serve()


def test_one_system_file_is_served_and_simulated_with_the_same_values():
    from llumnix.sim.policy_bridge import scheduling_config
    from llumnix.sim.runner import plan, run_one

    doc = yaml.safe_load(DEFAULT.read_text())
    served = _serve("--config", str(DEFAULT))  # the ClusterConfig Ray would start from; no Ray here
    cfg = parse_config(_experiment(doc))
    (run,) = plan(cfg)
    sim_sched = scheduling_config(run.system)
    # the one difference: the simulator delivers a dispatch at once (no grace for it in flight)
    assert sim_sched.dispatch.pending_grace_s == 0.0
    assert served.scheduling == dataclasses.replace(
        sim_sched, dispatch=dataclasses.replace(sim_sched.dispatch, pending_grace_s=1.0))
    assert sim_sched.dispatch.params == {"prefix": True, "prefix_slack_ratio": 2.0}
    assert sim_sched.rescheduling.selection == "freed" and sim_sched.dispatch.prefix_evictions
    engine = run.cluster.engine_config
    assert (engine.scheduler.max_num_seqs, engine.scheduler.max_num_batched_tokens, engine.scheduler.chunked_prefill,
            engine.cache.block_size, engine.cache.enable_prefix_caching) == (
        served.engine["max_num_seqs"], served.engine["max_num_batched_tokens"], served.engine["chunked_prefill"],
        served.engine["block_size"], served.engine["enable_prefix_caching"]) == (64, 256, True, 16, True)
    assert run.cluster.num_instances == served.instances == 2
    assert (run.cluster.migration.max_stages, run.cluster.migration.last_stage_max_blocks) == (
        served.migration.max_stages, served.migration.last_stage_max_blocks)
    assert run.cluster.num_blocks == 400  # the KV pool's size stays the experiment's
    record = run_one(run)
    assert record["num_finished"] == 40 and record["num_instances"] == 2


def test_a_served_system_in_an_experiment_brings_serve_defaults_and_overrides_merge():
    cfg = parse_config({**_experiment({"engine": {"device": "cuda"}}),
                        "traces": [{"name": "S-S", "kind": "S-S", "rates": [1.0], "prefix_groups": 2,
                                    "prefix_tokens": 16, "systems": {"served": {
                            "scheduling": {"rescheduling": {"out_threshold": 10, "in_threshold": 10}}}}}]})
    base = cfg.systems[0]
    assert cfg.cluster_for(base).max_num_batched_tokens == CHUNKED_BUDGET["cuda"]
    assert cfg.cluster_for(base).num_instances == 4  # no deployment.instances: the cluster's size
    over = cfg.system_for(base, cfg.traces[0])
    assert over.system is not None and over.system.scheduling.rescheduling.out_threshold == 10
    assert over.system.engine.device == "cuda"  # merged key by key, not replaced


def test_a_served_system_with_prefix_caching_needs_a_trace_with_prefixes():
    doc = {**_experiment({"engine": {}}), "traces": [{"name": "plain", "kind": "S-S", "rates": [1.0]}]}
    with pytest.raises(ConfigError, match=r"^systems\.served\.engine\.enable_prefix_caching: on .* trace plain "
                                          r"has no prefix_groups"):
        parse_config(doc)
    parse_config({**doc, "systems": {"served": {"engine": {"enable_prefix_caching": False}}}})


def test_the_old_experiment_spelling_is_unchanged():
    from llumnix.sim.policy_bridge import scheduling_config

    cfg = parse_config(_experiment({"dispatch": "llumnix", "migration": True, "migrate_out_threshold": 10}))
    (system,) = cfg.systems
    assert system.system is None and cfg.cluster_for(system) is cfg.cluster
    sched = scheduling_config(system)
    assert (sched.rescheduling.out_threshold, sched.rescheduling.selection, sched.dispatch.params) == (10, "paper", {})


@pytest.mark.parametrize("doc,message", [
    ({"engine": {"max_num_seq": 8}}, "engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),
    ({"engine": {"device": "tpu"}}, "engine.device: must be cpu, cuda or cuda:N, not 'tpu'"),
    ({"engine": {"chunked_prefill": "yes"}}, "engine.chunked_prefill: must be true or false, not 'yes'"),
    ({"engine": {"cuda_graphs": True}}, "engine.cuda_graphs: needs device cuda"),
    ({"scheduling": {"dispatch": {"params": {"prefix_slack": -1}}}},
     "scheduling.dispatch.params.prefix_slack: must be an integer >= 0, got -1"),
    ({"scheduling": {"dispatch": {"staleness_s": 0}}}, "scheduling.dispatch.staleness_s: must be > 0"),
    ({"scheduling": {"dispatch": {"policy": "round-robin", "params": {"prefix": True}}}},
     "scheduling.dispatch.params.prefix: needs the llumnix dispatch policy, not 'round-robin'"),
    ({"scheduling": {"rescheduling": {"bogus": 1}}}, "scheduling.rescheduling.bogus: unknown key"),
    ({"scheduling": {"freeness": 3}}, "scheduling.freeness: must be a mapping, not 3"),
    ({"migration": {"max_stages": 0}}, "migration.max_stages: must be >= 1, got 0"),
    ({"migration": {"transport_options": {"bulk_nic": 1}}},
     "migration.transport_options.bulk_nic: unknown key (did you mean bulk_nice?)"),
    ({"deployment": {"reschedule_interval_s": 0}}, "deployment.reschedule_interval_s: must be > 0, got 0"),
    ({"deployment": {"instances": 9}, "scheduling": {"scaling": {"enabled": True, "max_instances": 4}}},
     "deployment.instances: 9 is outside the auto-scaling range 1:4 (scheduling.scaling)"),
    ({"engine": {}, "modle": "x"}, "modle: unknown key (known: model, engine, scheduling, migration, deployment)"),
])
def test_an_unknown_key_or_a_bad_value_is_one_line_naming_its_path(doc, message):
    with pytest.raises(SystemConfigError) as e:
        SystemConfig.from_dict(doc)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:  # in an experiment: below the system's name
        parse_config(_experiment(doc))
    assert str(e.value).startswith(f"systems.served.{message}")


def test_serve_config_with_a_bad_key_exits_with_that_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {max_num_seq: 8}\n")
    assert main(["serve", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "llumnix serve: error: engine.max_num_seq: unknown key (did you mean max_num_seqs?)"]


def test_mixing_the_two_experiment_spellings_names_the_new_key():
    with pytest.raises(ConfigError, match=r"systems\.served\.migrate_out_threshold: .* write "
                                          r"scheduling\.rescheduling\.out_threshold"):
        parse_config(_experiment({"engine": {}, "migrate_out_threshold": 3}))


def test_the_tree_names_what_the_runtime_takes():
    from llumnix.llm import LLM
    from llumnix.migration.transport import TRANSPORTS as RUNTIME_TRANSPORTS

    assert set(SystemConfig().engine.llm_kwargs()) <= set(inspect.signature(LLM.__init__).parameters)
    assert TRANSPORTS == RUNTIME_TRANSPORTS
