"""``engine.pace`` (config/sections.py PaceConfig): checked once where the config is built,
one line naming its key; `--pace MODEL[:SCALE]` sets it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llumnix.config import SystemConfig, SystemConfigError
from llumnix.config.sections import PaceConfig

ROOT = Path(__file__).resolve().parents[2]


def test_off_by_default_and_passed_whole_to_every_engine():
    assert SystemConfig().engine.pace is None and SystemConfig().engine.llm_kwargs()["pace"] is None
    system = SystemConfig.from_dict({"engine": {"pace": {"model": "a10-llama7b-serving", "scale": 2}}})
    assert system.engine.pace == PaceConfig("a10-llama7b-serving", 2.0)
    assert system.to_cluster_config().engine["pace"] == {"model": "a10-llama7b-serving", "scale": 2.0}


@pytest.mark.parametrize("pace,message", [
    ({"model": "a100"}, "engine.pace.model: unknown latency model 'a100': not one of a10-llama7b, "
                        "a10-llama7b-serving, nor a profile JSON"),
    ({"model": "a10-llama7b", "scale": 0}, "engine.pace.scale: must be > 0, got 0"),
    ({"model": "a10-llama7b", "scale": "fast"}, "engine.pace.scale: must be a number, not 'fast'"),
    ({"modl": "a10-llama7b"}, "engine.pace.modl: unknown key (did you mean model?)"),
    ("a10-llama7b", "engine.pace: must be a mapping, not 'a10-llama7b'"),
])
def test_a_bad_pace_is_one_line_naming_its_key(pace, message):
    with pytest.raises(SystemConfigError) as e:
        SystemConfig.from_dict({"engine": {"pace": pace}})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_profile_json_is_a_pace_model(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    with pytest.raises(SystemConfigError, match=r"^engine\.pace\.model: unknown latency model"):
        SystemConfig.from_dict({"engine": {"pace": {"model": str(bad)}}})


def _serve_config(*argv: str):
    import argparse

    from llumnix.cluster.serve import build_system
    from llumnix.cluster.serve_args import add_serve_args

    p = argparse.ArgumentParser()
    add_serve_args(p)
    return build_system(p.parse_args(list(argv)))[0]


def test_the_pace_flag_sets_model_and_scale():
    assert _serve_config().engine.pace is None
    assert _serve_config("--pace", "a10-llama7b-serving").engine.pace == PaceConfig("a10-llama7b-serving", 1.0)
    assert _serve_config("--pace", "a10-llama7b:2.5").engine.pace == PaceConfig("a10-llama7b", 2.5)


@pytest.mark.parametrize("flag,message", [
    ("a100", "llumnix serve: error: --pace unknown latency model 'a100': not one of a10-llama7b, "
             "a10-llama7b-serving, nor a profile JSON (profile file 'a100' not found)"),
    ("a10-llama7b:0", "llumnix serve: error: --pace SCALE must be > 0, got 0"),
])
def test_a_bad_pace_flag_is_one_line_from_the_real_cli(flag, message):
    out = subprocess.run([sys.executable, "-m", "llumnix.cli", "serve", "--pace", flag], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [message], out.stderr
