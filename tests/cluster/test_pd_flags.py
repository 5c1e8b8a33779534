"""`llumnix serve`'s PD flags onto the system config, and the one-line refusals (no Ray)."""
from __future__ import annotations

import argparse

import pytest

from llumnix.cluster.launcher import check_pd
from llumnix.cluster.serve import add_serve_args, build_config
from llumnix.core.errors import LlumnixError


def _config(*argv: str):
    p = argparse.ArgumentParser()
    add_serve_args(p)
    return build_config(p.parse_args(list(argv)))


def _pd(cfg):
    return cfg.scheduling.pd  # the typed config, built once by serve's composition


def test_prefill_instances_alone_means_static_pd():
    cfg = _config("--instances", "3", "--prefill-instances", "2")
    assert (_pd(cfg).mode, _pd(cfg).prefill_instances) == ("static", 2)
    check_pd(cfg)
    assert _pd(_config("--pd", "adaptive", "--prefill-instances", "1")).mode == "adaptive"
    assert _pd(_config()).mode == "off"


@pytest.mark.parametrize(("argv", "says"), [
    (("--instances", "2", "--prefill-instances", "2"), "scheduling.pd.prefill_instances: must be between 1 and 1"),
    (("--pd", "static", "--scaling", "2:4"), "PD with auto-scaling is not supported"),
])
def test_a_deployment_pd_cannot_run_is_one_line_before_ray_starts(argv, says):
    with pytest.raises(LlumnixError) as e:
        check_pd(_config(*argv))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_bad_mode_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        _config("--pd", "both")
    assert "invalid choice" in capsys.readouterr().err
