"""`llumnix bench` refuses bad arguments in one line before measuring or writing anything."""
from __future__ import annotations

import pytest

from llumnix.cli import main


@pytest.mark.parametrize("argv,message", [
    (["engine", "--model", "/no/such/model"], "model '/no/such/model' is neither 'smollm2'"),
    (["migration", "--transport", "pigeon"], "--transport: unknown KV transport 'pigeon'"),
])
def test_bad_bench_arguments_are_one_line_errors(capsys, tmp_path, argv, message):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llumnix bench: error: ") and message in err[0], err
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.mark.parametrize("argv", [
    ["profile", "--out", "{blocker}/profile.json"],
    ["simulate", "benchmarks/sim/smoke.yaml", "--out", "{blocker}/sim"],
    ["bench", "engine", "--out", "{blocker}/results"],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(capsys, tmp_path, argv):
    """`profile --out /proc/x.json` used to profile for two minutes and then fail to write."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    argv = [a.format(blocker=blocker) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"llumnix {argv[0]}: error: cannot write "), err
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_missing_output_directories_are_created(tmp_path):
    from llumnix.cli import check_writable

    check_writable(str(tmp_path / "new" / "deeper" / "profile.json"), is_dir=False)
    check_writable(str(tmp_path / "runs" / "sim"), is_dir=True)
    assert (tmp_path / "new" / "deeper").is_dir() and (tmp_path / "runs" / "sim").is_dir()
    assert not any((tmp_path / "new" / "deeper").iterdir())  # the probe left nothing behind
