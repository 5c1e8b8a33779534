"""`llumnix serve` refuses bad flags with one line before it starts Ray: nothing an
instance actor would only fail on later, in a traceback from inside Ray."""
from __future__ import annotations

import pytest

from llumnix.cli import main


@pytest.mark.parametrize("argv,message", [
    (["--port", "99999"], "argument --port: 99999 is not a port number (0-65535)"),
    (["--port", "http"], "argument --port: 'http' is not a port number"),
    (["--kv-cache-mib", "-5"], "argument --kv-cache-mib: must be >= 1, got -5"),
    (["--threads-per-instance", "0"], "argument --threads-per-instance: must be >= 1, got 0"),
    (["--max-num-seqs", "0"], "argument --max-num-seqs: must be >= 1, got 0"),
    (["--instances", "x"], "argument --instances: 'x' is not an integer"),
])
def test_bad_numbers_are_argparse_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"llumnix serve: error: {message}"


@pytest.mark.parametrize("argv,message", [
    (["--model", "/no/such/model.gguf"], "model '/no/such/model.gguf' is neither 'smollm2' nor an existing file"),
    (["--cms", "memcached://x"], "--cms must be 'memory' or a redis:// URL"),
    (["--cms", "redis://127.0.0.1:1"], "--cms: cannot reach redis://127.0.0.1:1"),
])
def test_unreachable_parts_fail_in_one_line_before_ray_starts(capsys, monkeypatch, argv, message):
    import llumnix.cluster.launcher as launcher

    def no_ray(*_a, **_k):
        raise AssertionError("Ray must not start for a config that cannot work")

    monkeypatch.setattr(launcher, "start_cluster", no_ray)
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llumnix serve: error: ") and message in err[0], err


def test_an_unreadable_model_file_fails_before_ray_starts(capsys, monkeypatch, tmp_path):
    import llumnix.cluster.launcher as launcher

    monkeypatch.setattr(launcher, "start_cluster", lambda *_a, **_k: pytest.fail("Ray started"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    assert main(["serve", "--model", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"llumnix serve: error: {bad} is not a readable GGUF file: GGUF magic invalid"]


@pytest.mark.parametrize("text,message", [
    ("instances: [1\n", "is not valid YAML"),
    ("- 1\n", "must hold a mapping (model, engine, scheduling, migration, deployment)"),
    ("engine: 5\n", "error: engine: must be a mapping, not 5"),
    ("engine: {device: tpu}\n", "error: engine.device: must be cpu, cuda or cuda:N, not 'tpu'"),
    ("engine: {max_num_seq: 8}\n", "error: engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),
    ("engine: {max_num_seqs: many}\n", "error: engine.max_num_seqs: must be an integer, not 'many'"),
    ("scheduling: {dispatch: {prefix_slack: 1}}\n",
     "error: scheduling.dispatch.prefix_slack: unknown key (known: policy, params, staleness_s, "),
    ("scheduling: {dispatch: {params: {prefix_slack: -1}}}\n",
     "error: scheduling.dispatch.params.prefix_slack: must be an integer >= 0, got -1"),
    ("scheduling: {rescheduling: {selection: best}}\n",
     "error: scheduling.rescheduling.selection: unknown selection policy 'best'"),
    ("migration: {transport: udp}\n", "error: migration.transport: must be tcp, gloo or ray, not 'udp'"),
    ("deployment: {instances: 0}\n", "error: deployment.instances: must be >= 1, got 0"),
    ("instances: 2\ndeployment: {instances: 3}\n", "error: deployment.instances: given twice"),
    ("bogus: 1\n", "error: bogus: unknown key (known: model, engine, scheduling, migration, deployment)"),
])
def test_a_bad_config_file_is_one_line(capsys, tmp_path, text, message):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(text)
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def _build(*argv: str):
    import argparse

    from llumnix.cluster.serve import add_serve_args, build_config

    p = argparse.ArgumentParser()
    add_serve_args(p)
    return build_config(p.parse_args(list(argv)))


def test_a_config_file_is_the_system_tree_and_flags_override_it(tmp_path):
    cfg = tmp_path / "system.yaml"
    cfg.write_text("engine: {max_num_seqs: 32, enable_prefix_caching: false}\n"
                   "scheduling: {rescheduling: {out_threshold: 5, in_threshold: 8}}\n"
                   "migration: {transport: gloo, max_stages: 2}\n"
                   "deployment: {instances: 3, reschedule_interval_s: 0.25}\n")
    c = _build("--config", str(cfg))
    assert (c.instances, c.reschedule_interval_s, c.migration.transport, c.migration.max_stages) == (
        3, 0.25, "gloo", 2)
    assert (c.engine["max_num_seqs"], c.engine["enable_prefix_caching"]) == (32, False)
    assert c.scheduling.rescheduling.selection == "paper"  # no cache: the paper's order
    c = _build("--config", str(cfg), "--instances", "4", "--max-num-seqs", "16", "--migrate-out-threshold", "6",
               "--transport", "ray")
    assert (c.instances, c.engine["max_num_seqs"], c.migration.transport) == (4, 16, "ray")
    r = c.scheduling.rescheduling
    assert (r.out_threshold, r.in_threshold) == (6, 8)  # in_threshold only ever rises with the flag
    assert _build("--config", str(cfg), "--migrate-out-threshold", "9").scheduling.rescheduling.in_threshold == 9


def test_the_trigger_gap_flag_sets_the_scheduling_field_or_turns_triggers_off(capsys):
    assert _build().scheduling.rescheduling.trigger_gap_s == 0.03  # the default
    assert _build("--reschedule-trigger-gap", "0.05").scheduling.rescheduling.trigger_gap_s == 0.05
    assert _build("--reschedule-trigger-gap", "off").scheduling.rescheduling.trigger_gap_s is None
    with pytest.raises(SystemExit):
        _build("--reschedule-trigger-gap", "soon")
    assert "'soon' is neither seconds nor 'off'" in capsys.readouterr().err


def test_old_config_files_with_flat_cluster_fields_still_work(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("instances: 3\ncms: memory\nthreads_per_instance: 2\nreschedule_interval_s: 1.5\n"
                   "engine: {kv_cache_bytes: 1048576}\nscheduling: {dispatch: {policy: round-robin}}\n"
                   "migration: {transport: gloo}\n")
    c = _build("--config", str(cfg))
    assert (c.instances, c.cms, c.threads_per_instance, c.reschedule_interval_s) == (3, "memory", 2, 1.5)
    assert c.engine["kv_cache_bytes"] == 1 << 20 and c.scheduling.dispatch.policy == "round-robin"
    assert c.migration.transport == "gloo"


def test_scaling_starts_at_its_minimum_and_instances_must_fall_in_its_range(capsys):
    assert _build("--scaling", "3:5").instances == 3
    assert _build("--scaling", "1:5", "--instances", "4").instances == 4
    assert main(["serve", "--scaling", "1:2", "--instances", "3"]) == 2
    assert capsys.readouterr().err.strip() == ("llumnix serve: error: --instances 3 is outside the auto-scaling "
                                               "range 1:2 (scheduling.scaling)")
    assert main(["serve", "--scaling", "x"]) == 2
    assert "--scaling must be MIN:MAX (two integers), not 'x'" in capsys.readouterr().err


def test_an_unknown_device_is_one_line(capsys):
    assert main(["serve", "--device", "tpu"]) == 2
    assert capsys.readouterr().err.strip() == "llumnix serve: error: --device must be cpu, cuda or cuda:N, not 'tpu'"


def test_prefix_affinity_flag_sets_the_llumnix_dispatch_param(capsys):
    import argparse

    from llumnix.cluster.serve import add_serve_args, build_config

    def config(*argv: str):
        p = argparse.ArgumentParser()
        add_serve_args(p)
        return build_config(p.parse_args(list(argv)))

    def params(*argv: str):
        return config(*argv).scheduling.dispatch.params

    # on with the prefix cache and the llumnix policy, its slack growing with load
    assert params() == {"prefix": True, "prefix_slack_ratio": 2.0}
    assert params("--no-prefix-affinity") == {"prefix": False}
    assert params("--no-prefix-caching") == {}
    assert params("--dispatch", "infaas++") == {}
    assert params("--no-prefix-caching", "--prefix-affinity") == {"prefix": True, "prefix_slack_ratio": 2.0}
    assert params("--prefix-slack", "16", "--prefix-slack-ratio", "0") == {
        "prefix": True, "prefix_slack": 16, "prefix_slack_ratio": 0.0}
    for argv, message in (
            (["--no-prefix-affinity", "--prefix-slack", "8"], "--prefix-slack applies only with prefix: true"),
            (["--no-prefix-caching", "--prefix-slack-ratio", "1"],
             "--prefix-slack-ratio applies only with prefix: true"),
            (["--prefix-slack", "-1"], "--prefix-slack must be an integer >= 0, got -1"),
            (["--prefix-slack-ratio", "nan"], "--prefix-slack-ratio must be a number >= 0, got nan")):
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    # with the cache, the prefix index forgets what the engines report evicted (a config can say no)
    assert config().scheduling.dispatch.prefix_evictions is True
    assert config("--no-prefix-caching").scheduling.dispatch.prefix_evictions is False
    llm_d = config("--dispatch", "llm-d").scheduling.dispatch
    assert (llm_d.policy, llm_d.params, llm_d.prefix_evictions) == ("llm-d", {}, True)
    # with the cache, a migration source gives up what frees it most per block moved
    assert config().scheduling.rescheduling.selection == "freed"
    assert config("--no-prefix-caching").scheduling.rescheduling.selection == "paper"
    resched = config("--no-migration").scheduling.rescheduling
    assert (resched.enabled, resched.selection) == (False, "freed")
    assert main(["serve", "--dispatch", "round-robin", "--prefix-affinity"]) == 2
    assert capsys.readouterr().err.strip() == ("llumnix serve: error: --prefix-affinity needs the llumnix "
                                               "dispatch policy, not 'round-robin'")


def test_chunked_prefill_is_on_by_default_with_its_budget(capsys):
    import argparse

    from llumnix.cluster.serve import add_serve_args, build_config
    from llumnix.config import CHUNKED_BUDGET

    def engine(*argv: str):
        p = argparse.ArgumentParser()
        add_serve_args(p)
        e = build_config(p.parse_args(list(argv))).engine
        return e["chunked_prefill"], e["max_num_batched_tokens"]

    assert engine() == (True, CHUNKED_BUDGET["cpu"]) == (True, 256)
    assert engine("--device", "cuda:1") == (True, 2048)  # vLLM's usual budget on a GPU
    assert engine("--max-num-batched-tokens", "512") == (True, 512)
    assert engine("--no-chunked-prefill") == (False, 4096)  # the engine's: one whole prefill a step
    assert engine("--no-chunked-prefill", "--max-num-batched-tokens", "8") == (False, 8)
    assert main(["serve", "--max-num-batched-tokens", "32", "--max-num-seqs", "64"]) == 2
    assert capsys.readouterr().err.strip() == ("llumnix serve: error: --max-num-batched-tokens must be at least "
                                               "max_num_seqs (64) with chunked prefill, got 32")
    assert main(["serve", "--max-num-seqs", "512"]) == 2  # the default budget (256) is too small
    assert capsys.readouterr().err.strip() == ("llumnix serve: error: engine.max_num_batched_tokens: must be at "
                                               "least max_num_seqs (512) with chunked prefill, got 256")


def test_cuda_graphs_flag(capsys):
    import argparse

    from llumnix.cluster.serve import add_serve_args, build_config

    def engine(*argv: str):
        p = argparse.ArgumentParser()
        add_serve_args(p)
        return build_config(p.parse_args(list(argv))).engine

    assert engine("--device", "cuda")["cuda_graphs"] is None  # the engine's default: on with CUDA
    assert engine("--device", "cuda", "--no-cuda-graphs")["cuda_graphs"] is False
    assert engine("--device", "cuda:0", "--cuda-graphs")["cuda_graphs"] is True
    assert main(["serve", "--cuda-graphs"]) == 2
    assert capsys.readouterr().err.strip() == "llumnix serve: error: --cuda-graphs needs device cuda"
    assert main(["generate", "--cuda-graphs", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == "llumnix generate: error: CUDA graphs need a CUDA device, not 'cpu'"


def test_admin_key_from_the_flag_or_the_environment_and_the_body_limit(monkeypatch):
    import argparse

    from llumnix.cluster.serve import add_serve_args

    monkeypatch.setenv("LLUMNIX_ADMIN_KEY", "from-env")
    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args([])
    assert args.admin_key == "from-env" and args.max_request_bytes == "auto"
    args = p.parse_args(["--admin-key", "flag", "--max-request-bytes", "1024"])
    assert args.admin_key == "flag" and args.max_request_bytes == 1024


def test_the_weight_format_flag_sets_the_engine_field(capsys):
    assert _build().engine.get("weight_format", "fp32") == "fp32"
    assert _build("--weight-format", "int4").engine["weight_format"] == "int4"
    assert _build("--weight-format", "w8a8").engine["weight_format"] == "w8a8"
    with pytest.raises(SystemExit):
        _build("--weight-format", "q4")
    assert "invalid choice: 'q4'" in capsys.readouterr().err
