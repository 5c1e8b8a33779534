"""vLLM's flags `llumnix serve` does not honour: each refused in one line naming it and a
flag we have (that exists), or ignored with a line; an unknown flag names the nearest one;
the flags we honour from vLLM (--block-size, --num-gpu-blocks-override) set the config."""
from __future__ import annotations

import argparse
import json
import logging
import os

import pytest

from llumnix.cli import _subcommands, build_parser, main
from llumnix.cluster.serve import build_system, try_command
from llumnix.cluster.vllm_flags import _SWITCHES, IGNORED, REFUSED, check_vllm_flags
from llumnix.logging_setup import configure_logging, migration_line


def serve_flags() -> set[str]:
    p = _subcommands(build_parser())["serve"]
    return {o for a in p._actions if a.help is not argparse.SUPPRESS for o in a.option_strings}


def refuse(capsys, monkeypatch, *argv: str) -> str:
    import llumnix.cluster.launcher as launcher

    monkeypatch.setattr(launcher, "start_cluster", lambda *_a, **_k: pytest.fail("Ray started"))
    assert main(["serve", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llumnix serve: error: ") and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("flags", list(REFUSED))
def test_each_refused_vllm_flag_is_one_line_naming_it_and_a_flag_we_have(capsys, monkeypatch, flags):
    argv = [flags[0]] if flags[-1] in _SWITCHES else [flags[0], "x"]
    line = refuse(capsys, monkeypatch, *argv)
    assert f"{flags[-1]}" in line and "is not supported" in line
    nearest = line.split("nearest: ")[1].split()[0].strip("`")
    assert nearest in serve_flags() or nearest == "llumnix", (nearest, line)


def test_the_value_that_means_our_behaviour_is_accepted():
    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "auto", "--tokenizer-mode", "auto", "-dp", "1",
                                      "--preemption-mode", "recompute"])
    assert check_vllm_flags(args) == []
    build_system(args)  # no error


@pytest.mark.parametrize("flag", list(IGNORED))
def test_ignored_flags_are_accepted_with_a_line_that_says_so(flag):
    argv = [flag, "4"] if IGNORED[flag][1] else [flag]
    notes = check_vllm_flags(build_parser().parse_args(["serve", *argv]))
    assert notes == [f"{flag} ignored: {IGNORED[flag][0]}"]


@pytest.mark.parametrize("argv,message", [
    (["--frobnicate", "3"], "--frobnicate is not a flag of this command (--help lists every flag)"),
    (["--max-num-sequences", "3"], "--max-num-sequences is not a flag of this command; nearest: --max-num-seqs (--help lists every flag)"),
    (["--kv-cache-size=3"], "--kv-cache-size is not a flag of this command; nearest: --kv-cache-mib (--help lists every flag)"),
])
def test_an_unknown_flag_is_one_line_with_the_nearest_flag(capsys, monkeypatch, argv, message):
    assert refuse(capsys, monkeypatch, *argv) == f"llumnix serve: error: {message}"


def test_an_unknown_flag_of_another_command_too(capsys):
    assert main(["simulate", "x.yaml", "--seedss", "3"]) == 2
    assert capsys.readouterr().err.strip() == ("llumnix simulate: error: --seedss is not a flag of this command; "
                                               "nearest: --seeds (--help lists every flag)")


def test_block_size_and_num_gpu_blocks_override_set_the_engine():
    system, _ = build_system(build_parser().parse_args(["serve", "--block-size", "32",
                                                        "--num-gpu-blocks-override", "100"]))
    assert system.engine.block_size == 32 and system.engine.num_blocks == 100


def test_log_flags_reach_the_gateway_config():
    from llumnix.cluster.serve_args import gateway_fields

    args = build_parser().parse_args(["serve", "--disable-log-stats", "--log-stats-interval", "0.5",
                                      "--log-level", "debug"])
    fields = gateway_fields(args)
    assert (fields["log_stats"], fields["log_stats_interval_s"], args.log_level) == (False, 0.5, "debug")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--log-stats-interval", "0"])


def test_fair_share_reaches_the_gateway_config():
    from llumnix.cluster.serve_args import gateway_fields

    assert gateway_fields(build_parser().parse_args(["serve", "--fair-share", "8"]))["fair_share"] == 8
    for bad in ("0", "-1", "many"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--fair-share", bad])


def test_the_try_line_carries_the_api_key_header(monkeypatch):
    monkeypatch.delenv("LLUMNIX_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert "Authorization" not in try_command("http://h:1", "m", None)
    assert " -H 'Authorization: Bearer s3 cret' " in try_command("http://h:1", "m", "s3 cret")
    monkeypatch.setenv("LLUMNIX_API_KEY", "from-env")  # not printed: the shell has it
    line = try_command("http://h:1", "m", "from-env")
    assert ' -H "Authorization: Bearer $LLUMNIX_API_KEY" ' in line and "from-env" not in line
    # greedy, so a new user's first answer is the model's best, not a sample at temperature 1
    body = json.loads(line.split(" -d '", 1)[1].rstrip("'"))
    assert body["temperature"] == 0 and body["model"] == "m"


def test_configure_logging_installs_one_handler_and_levels(monkeypatch):
    monkeypatch.delenv("LLUMNIX_LOG_LEVEL", raising=False)
    root = logging.getLogger()
    before = list(root.handlers)
    old_root, old_ours = root.level, logging.getLogger("llumnix").level
    try:
        assert configure_logging() == "info"
        assert configure_logging("debug") == "debug"  # a second call changes the level only
        assert os.environ["LLUMNIX_LOG_LEVEL"] == "debug"  # what the Ray processes started from here inherit
        added = [h for h in root.handlers if h not in before]
        assert len(added) <= 1 and len([h for h in root.handlers if getattr(h, "_llumnix_handler", False)]) == 1
        assert logging.getLogger("llumnix.x").getEffectiveLevel() == logging.DEBUG
        assert root.level == logging.WARNING  # other libraries' INFO stays out
        monkeypatch.setenv("LLUMNIX_LOG_LEVEL", "loud")
        assert configure_logging() == "info"  # a bad level from the environment: the default
    finally:
        for h in added:
            root.removeHandler(h)
        root.setLevel(old_root)
        logging.getLogger("llumnix").setLevel(old_ours)


def test_migration_lines():
    base = {"request_id": "r", "src_instance_id": "a", "dst_instance_id": "b"}
    assert migration_line({**base, "committed": True, "num_blocks": 9, "num_blocks_cached": 2, "num_stages": 3,
                           "duration": 0.25, "downtime": 0.0042}) == \
        "migration of r a -> b committed: 9 blocks (2 adopted) in 3 stages in 0.250 s, downtime 4.2 ms"
    assert migration_line({**base, "committed": True, "was_queued": True}, "PD hand-off") == \
        "PD hand-off of r a -> b committed: queued, moved as metadata (no downtime)"
    assert migration_line({**base, "committed": False, "abort_code": "dst_full"}) == \
        "migration of r a -> b aborted (dst_full)"
