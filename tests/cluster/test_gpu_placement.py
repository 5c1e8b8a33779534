"""How many GPUs Ray reserves for an instance actor, and the serve flag that sets it."""
from __future__ import annotations

import argparse

import pytest

from llumnix.cluster.launcher import instance_gpus
from llumnix.cluster.serve import add_serve_args, build_config
from llumnix.core.errors import LlumnixError


@pytest.mark.parametrize("engine,given,expected", [
    ({}, None, 0.0),                      # the default device is the CPU
    ({"device": "cpu"}, None, 0.0),
    ({"device": "cuda"}, None, 1.0),      # one GPU each, pinned by Ray
    ({"device": "cuda:0"}, None, 1.0),
    ({"device": "cuda"}, 0.5, 0.5),       # two instances per GPU
    ({"device": "cpu"}, 1, 1.0),          # an explicit value wins
])
def test_instance_gpus(engine, given, expected):
    assert instance_gpus(engine, given) == expected


def test_negative_gpus_is_an_error():
    with pytest.raises(LlumnixError, match="gpus_per_instance"):
        instance_gpus({"device": "cuda"}, -1)


def _config(*argv: str):
    p = argparse.ArgumentParser()
    add_serve_args(p)
    return build_config(p.parse_args(list(argv)))


def test_serve_flag_sets_the_gpu_share():
    cfg = _config("--device", "cuda", "--gpus-per-instance", "0.5")
    assert cfg.engine["device"] == "cuda" and cfg.gpus_per_instance == 0.5
    assert instance_gpus(cfg.engine, cfg.gpus_per_instance) == 0.5
    assert _config("--device", "cuda").gpus_per_instance is None  # the launcher picks 1


def test_serve_flag_rejects_a_negative_share():
    with pytest.raises(LlumnixError, match="--gpus-per-instance"):
        _config("--gpus-per-instance", "-1")


def test_gpu_capacity_check():
    from llumnix.cluster.launcher import check_gpu_capacity

    check_gpu_capacity(2, 0.0, 0.0)      # CPU instances need none
    check_gpu_capacity(4, 0.5, 2.0)      # two per GPU, exactly enough
    check_gpu_capacity(3, 1.0, 8.0)
    with pytest.raises(LlumnixError, match="need 2 GPU.*has 0"):
        check_gpu_capacity(2, 1.0, 0.0)  # would stay pending forever: refuse at once
    with pytest.raises(LlumnixError, match="need 1.5 GPU"):
        check_gpu_capacity(3, 0.5, 1.0)
