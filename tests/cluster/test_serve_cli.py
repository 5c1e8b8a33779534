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
    ("- 1\n", "must hold a mapping of ClusterConfig fields"),
    ("engine: 5\n", "engine must be a mapping, not 5"),
    ("engine: {device: tpu}\n", "--device must be cpu, cuda or cuda:N, not 'tpu'"),
])
def test_a_bad_config_file_is_one_line(capsys, tmp_path, text, message):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(text)
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


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
        return config(*argv).scheduling.get("dispatch", {}).get("params")

    # on with the prefix cache and the llumnix policy, its slack growing with load
    assert params() == {"prefix": True, "prefix_slack_ratio": 2.0}
    assert params("--no-prefix-affinity") == {"prefix": False}
    assert params("--no-prefix-caching") is None
    assert params("--dispatch", "infaas++") is None
    assert params("--no-prefix-caching", "--prefix-affinity") == {"prefix": True, "prefix_slack_ratio": 2.0}
    assert params("--prefix-slack", "16", "--prefix-slack-ratio", "0") == {
        "prefix": True, "prefix_slack": 16, "prefix_slack_ratio": 0.0}
    for argv, message in (
            (["--no-prefix-affinity", "--prefix-slack", "8"], "--prefix-slack needs prefix affinity"),
            (["--no-prefix-caching", "--prefix-slack-ratio", "1"], "--prefix-slack-ratio needs prefix affinity"),
            (["--prefix-slack", "-1"], "--prefix-slack must be >= 0, got -1"),
            (["--prefix-slack-ratio", "nan"], "--prefix-slack-ratio must be >= 0, got nan")):
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    # with the cache, the prefix index forgets what the engines report evicted (a config can say no)
    assert config().scheduling["dispatch"]["prefix_evictions"] is True
    assert "dispatch" not in config("--no-prefix-caching").scheduling
    assert config("--dispatch", "llm-d").scheduling["dispatch"] == {"policy": "llm-d", "prefix_evictions": True}
    # with the cache, a migration source gives up what frees it most per block moved
    assert config().scheduling["rescheduling"] == {"selection": "freed"}
    assert "rescheduling" not in config("--no-prefix-caching").scheduling
    assert config("--no-migration").scheduling["rescheduling"] == {"enabled": False, "selection": "freed"}
    assert main(["serve", "--dispatch", "round-robin", "--prefix-affinity"]) == 2
    assert capsys.readouterr().err.strip() == ("llumnix serve: error: --prefix-affinity needs the llumnix "
                                               "dispatch policy, not 'round-robin'")


def test_chunked_prefill_is_on_by_default_with_its_budget(capsys):
    import argparse

    from llumnix.cluster.serve import CHUNKED_BUDGET, add_serve_args, build_config

    def engine(*argv: str):
        p = argparse.ArgumentParser()
        add_serve_args(p)
        e = build_config(p.parse_args(list(argv))).engine
        return e["chunked_prefill"], e.get("max_num_batched_tokens")

    assert engine() == (True, CHUNKED_BUDGET["cpu"]) == (True, 256)
    assert engine("--device", "cuda:1") == (True, 2048)  # vLLM's usual budget on a GPU
    assert engine("--max-num-batched-tokens", "512") == (True, 512)
    assert engine("--no-chunked-prefill") == (False, None)
    assert engine("--no-chunked-prefill", "--max-num-batched-tokens", "8") == (False, 8)
    assert main(["serve", "--max-num-batched-tokens", "32", "--max-num-seqs", "64"]) == 2
    assert capsys.readouterr().err.strip() == ("llumnix serve: error: with chunked prefill --max-num-batched-tokens "
                                               "(32) must be at least --max-num-seqs (64)")


def test_cuda_graphs_flag(capsys):
    import argparse

    from llumnix.cluster.serve import add_serve_args, build_config

    def engine(*argv: str):
        p = argparse.ArgumentParser()
        add_serve_args(p)
        return build_config(p.parse_args(list(argv))).engine

    assert "cuda_graphs" not in engine("--device", "cuda")  # the engine's default: on with CUDA
    assert engine("--device", "cuda", "--no-cuda-graphs")["cuda_graphs"] is False
    assert engine("--device", "cuda:0", "--cuda-graphs")["cuda_graphs"] is True
    assert main(["serve", "--cuda-graphs"]) == 2
    assert capsys.readouterr().err.strip() == "llumnix serve: error: --cuda-graphs needs --device cuda"
    assert main(["generate", "--cuda-graphs", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == "llumnix generate: error: CUDA graphs need a CUDA device, not 'cpu'"


def test_admin_key_from_the_flag_or_the_environment_and_the_body_limit(monkeypatch):
    import argparse

    from llumnix.cluster.serve import add_serve_args

    monkeypatch.setenv("LLUMNIX_ADMIN_KEY", "from-env")
    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args([])
    assert args.admin_key == "from-env" and args.max_request_bytes == 8 << 20
    args = p.parse_args(["--admin-key", "flag", "--max-request-bytes", "1024"])
    assert args.admin_key == "flag" and args.max_request_bytes == 1024
