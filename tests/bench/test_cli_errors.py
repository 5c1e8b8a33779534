"""`llumnix bench` refuses bad arguments in one line before measuring or writing anything."""
from __future__ import annotations

import pytest

from llumnix.cli import main


@pytest.mark.parametrize("argv,message", [
    (["engine", "--model", "/no/such/model"], "model '/no/such/model' is neither 'smollm2'"),
    (["migration", "--transport", "pigeon"], "--transport: unknown KV transport 'pigeon'"),
    (["fidelity", "--sim-only", "--loads", "light,nope"], "--loads: unknown 'nope' (known: light, medium"),
    (["fidelity", "--sim-only", "--systems", "vllm"], "--systems: unknown 'vllm' (known: infaas++, llumnix)"),
])
def test_bad_bench_arguments_are_one_line_errors(capsys, tmp_path, argv, message):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llumnix bench: error: ") and message in err[0], err
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written
