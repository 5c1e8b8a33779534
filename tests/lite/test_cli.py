"""`python -m llumnix.lite` (what `llumnix serve --engine-url` runs): bad input is one line."""
from __future__ import annotations

import pytest

from llumnix.lite.serve import main


@pytest.mark.parametrize(("args", "needle"), [
    (["--engine-url", "ftp://nowhere"], "--engine-url: must be http(s)://host:port"),
    (["--engine-url", "http://127.0.0.1:9", "--dispatch", "bogus"], "unknown dispatch policy 'bogus'"),
])
def test_bad_flags_are_one_line(args, needle, capsys):
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_a_config_file_with_bad_pools_names_the_path(tmp_path, capsys):
    cfg = tmp_path / "lite.yaml"
    cfg.write_text("pools:\n  - name: a\n    endpoints: [{url: 'http://h:1', weight: 2}]\n")
    assert main(["--config", str(cfg)]) == 2
    out = capsys.readouterr().out
    assert "pools[0].endpoints[0].weight: unknown key" in out and len(out.strip().splitlines()) == 1
