"""`llumnix serve` takes a `vllm serve` command line unchanged: each vLLM flag lands in the
system config (or the gateway's) with the value it was given; a flag we cannot honour is
one line; our own old spellings keep working."""
from __future__ import annotations

import pytest

from llumnix.cli import build_parser, main
from llumnix.cluster.serve import build_system, gateway_fields

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def system(*argv: str):
    return build_system(parse(*argv))


def test_a_vllm_command_line_is_parsed_into_the_config_unchanged(tmp_path, monkeypatch):
    for env in ("LLUMNIX_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(env, raising=False)
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    args = parse("smollm2", "--served-model-name", "my-model", "--max-model-len", "1024", "--dtype", "bfloat16",
                 "--seed", "7", "--chat-template", str(template), "--enforce-eager",
                 "--gpu-memory-utilization", "0.8", "--max-num-seqs", "32", "--max-num-batched-tokens", "512",
                 "--enable-prefix-caching", "--enable-chunked-prefill", "--api-key", "sk-test",
                 "--disable-log-requests", "--uvicorn-log-level", "info", "--host", "0.0.0.0", "--port", "8123",
                 "--tensor-parallel-size", "1", "--trust-remote-code")
    sys_cfg, cluster = build_system(args)
    e = sys_cfg.engine
    assert sys_cfg.model == cluster.model == "smollm2"
    assert (e.max_model_len, e.dtype, e.seed, e.cuda_graphs, e.gpu_memory_utilization) == (1024, "bfloat16", 7,
                                                                                            False, 0.8)
    assert (e.max_num_seqs, e.max_num_batched_tokens, e.enable_prefix_caching, e.chunked_prefill) == (32, 512,
                                                                                                     True, True)
    assert (sys_cfg.deployment.served_model_name, sys_cfg.deployment.chat_template) == ("my-model", TEMPLATE)
    # what each instance's LLM is built with
    assert {k: cluster.engine[k] for k in ("max_model_len", "dtype", "seed", "cuda_graphs",
                                            "gpu_memory_utilization", "max_num_batched_tokens")} == {
        "max_model_len": 1024, "dtype": "bfloat16", "seed": 7, "cuda_graphs": False,
        "gpu_memory_utilization": 0.8, "max_num_batched_tokens": 512}
    assert gateway_fields(args) == {"api_key": "sk-test", "admin_key": args.admin_key,
                                    "max_request_bytes": "auto", "log_requests": False,
                                    "log_stats": True, "log_stats_interval_s": 10.0,
                                    "http_read_timeout_s": 30.0, "private_docs_and_metrics": False,
                                    "fair_share": None}
    assert (args.host, args.port, args.uvicorn_log_level) == ("0.0.0.0", 8123, "info")


def test_the_negative_forms_and_our_old_spellings_set_the_same_fields():
    def flags(*argv: str):
        e = system(*argv)[0].engine
        return e.enable_prefix_caching, e.chunked_prefill

    assert flags() == (True, True)
    assert flags("--no-enable-prefix-caching", "--no-enable-chunked-prefill") == (False, False)
    assert flags("--no-prefix-caching", "--no-chunked-prefill") == (False, False)
    assert system("--model", "smollm2")[0].model == system("smollm2")[0].model == "smollm2"
    assert system("smollm2", "--model", "smollm2")[0].model == "smollm2"
    assert system("--no-cuda-graphs")[0].engine.cuda_graphs is False
    assert system()[0].engine.cuda_graphs is None  # on with cuda, as before


@pytest.mark.parametrize("value,dtype", [("auto", "float32"), ("half", "float16"), ("float16", "float16"),
                                         ("bfloat16", "bfloat16"), ("float", "float32"), ("float32", "float32")])
def test_vllm_dtype_names(value, dtype):
    assert system("--dtype", value)[0].engine.dtype == dtype


@pytest.mark.parametrize("value,tokens", [("2048", 2048), ("4k", 4000), ("4K", 4096), ("1.5k", 1500)])
def test_max_model_len_takes_vllm_suffixes(value, tokens):
    assert system("--max-model-len", value)[0].engine.max_model_len == tokens


@pytest.mark.parametrize("argv,message", [
    (["-tp", "2"], "--tensor-parallel-size 2 is not supported: each instance runs on one device (serve more "
                   "instances with --instances N)"),
    (["--tensor-parallel-size", "4"], "--tensor-parallel-size 4 is not supported"),
    (["-pp", "2"], "--pipeline-parallel-size 2 is not supported"),
    (["smollm2", "--model", "other"], "two models given: 'smollm2' and --model 'other'"),
    (["--served-model-name", "a", "b"], "--served-model-name takes one name here, not 2 (a b)"),
    (["--chat-template", "no-such-file.jinja"], "--chat-template: 'no-such-file.jinja' is neither a file nor"),
    (["--enforce-eager", "--cuda-graphs"], "--enforce-eager and --cuda-graphs contradict each other"),
    (["--served-model-name", " "], "--served-model-name must not be empty"),
])
def test_what_we_cannot_honour_is_one_line_before_anything_starts(capsys, monkeypatch, argv, message):
    import llumnix.cluster.launcher as launcher

    monkeypatch.setattr(launcher, "start_cluster", lambda *_a, **_k: pytest.fail("Ray started"))
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llumnix serve: error: ") and message in lines[0], lines


@pytest.mark.parametrize("argv,message", [
    (["--gpu-memory-utilization", "1.5"], "argument --gpu-memory-utilization: must be in (0, 1], got 1.5"),
    (["--max-model-len", "lots"], "argument --max-model-len: 'lots' is not a token count"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (["--uvicorn-log-level", "loud"], "argument --uvicorn-log-level: invalid choice: 'loud'"),
])
def test_bad_values_are_argparse_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_api_key_comes_from_the_environment_so_it_need_not_show_in_ps(monkeypatch):
    monkeypatch.delenv("LLUMNIX_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert parse().api_key == "from-vllm"
    monkeypatch.setenv("LLUMNIX_API_KEY", "from-llumnix")
    assert parse().api_key == "from-llumnix"  # ours first
    assert parse("--api-key", "flag").api_key == "flag"
    gateway = build_parser().parse_args(["gateway", "--ray-address", "10.0.0.1:6379"])
    assert gateway.api_key == "from-llumnix"


def test_an_inline_chat_template_is_used_as_is_and_a_broken_one_fails_at_start(capsys, monkeypatch, tmp_path):
    assert system("--chat-template", TEMPLATE)[0].deployment.chat_template == TEMPLATE
    from llumnix.model import load_tokenizer

    tok = load_tokenizer("smollm2", chat_template=TEMPLATE)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<user>hi<assistant>"
    import llumnix.cluster.launcher as launcher

    monkeypatch.setattr(launcher, "start_cluster", lambda *_a, **_k: pytest.fail("Ray started"))
    assert main(["serve", "--port", "0", "--chat-template", "{% for m in messages %}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["llumnix serve: error: --chat-template is not valid Jinja: line 1: Unexpected end of template. "
                   "Jinja was looking for the following tags: 'endfor' or 'else'. The innermost block that needs to "
                   "be closed is 'for'."], err
    cfg = tmp_path / "system.yaml"
    cfg.write_text("deployment: {chat_template: '{{ oops'}\n")
    assert main(["serve", "--config", str(cfg)]) == 2
    assert capsys.readouterr().err.strip().startswith("llumnix serve: error: deployment.chat_template: is not "
                                                      "valid Jinja: line 1: ")
