"""Benchmarks, profiles and simulations write into the working directory (or --out), never
into the checkout's committed results by default; their plots draw no missing value as 0."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from llumnix.bench.machine import RESULTS_DIR
from llumnix.bench.migration_bench import _ms
from llumnix.bench.serve_bench import panel_values, plot_runs
from llumnix.cli import build_parser, main
from llumnix.gateway.inprocess import InProcessGateway
from tests.gateway.fake_backend import EngineBackend

REPO = Path(__file__).resolve().parents[2]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_command_defaults_to_a_results_folder_in_the_working_directory():
    parser = build_parser()
    for argv in (["bench", "engine"], ["bench", "migration"], ["bench", "serve"]):
        assert parser.parse_args(argv).out == RESULTS_DIR
    assert parser.parse_args(["profile"]).out == f"{RESULTS_DIR}/profile.json"
    assert not Path(RESULTS_DIR).is_absolute()  # relative: the working directory's
    assert f"/{RESULTS_DIR}/" in (REPO / ".gitignore").read_text()  # run from the checkout: still not a change


def test_bench_serve_writes_its_json_and_plot_in_the_working_directory(tmp_path, monkeypatch):
    committed = _snapshot(REPO / "benchmarks" / "results")
    monkeypatch.chdir(tmp_path)
    with InProcessGateway(EngineBackend()) as url:
        rc = main(["bench", "serve", "--url", url, "--num-requests", "4", "--rate", "50", "--lengths", "fixed",
                   "--input-len", "8", "--output-len", "6", "--max-input", "16", "--max-output", "8",
                   "--label", "here"])
    assert rc == 0
    out = tmp_path / RESULTS_DIR
    data = json.loads((out / "serve.json").read_text())
    assert data["runs"]["here"]["summary"]["num_ok"] == 4 and "machine" in data
    assert (out / "serve.png").stat().st_size > 0
    assert _snapshot(REPO / "benchmarks" / "results") == committed  # the committed serve.json untouched


def test_simulate_writes_in_the_working_directory_not_beside_its_config(tmp_path, monkeypatch):
    configs, work = tmp_path / "configs", tmp_path / "work"
    configs.mkdir()
    work.mkdir()
    cfg = configs / "exp.yaml"
    cfg.write_text("""
name: t
num_requests: 20
plots: false
cluster: {num_instances: 2}
systems:
  rr: {dispatch: round-robin}
traces:
  - {name: S-S, kind: S-S, rates: [2.0]}
""")
    monkeypatch.chdir(work)
    assert main(["simulate", str(cfg), "--seeds", "1"]) == 0
    records = json.loads((work / RESULTS_DIR / "simulate" / "t" / "metrics.json").read_text())["records"]
    assert len(records) == 1 and records[0]["num_finished"] == 20
    assert [p.name for p in configs.iterdir()] == ["exp.yaml"]  # nothing written beside the config
    explicit = tmp_path / "chosen"
    assert main(["simulate", str(cfg), "--seeds", "1", "--out", str(explicit)]) == 0
    assert (explicit / "metrics.json").exists()


def test_a_value_a_run_did_not_measure_is_not_plotted_as_zero(tmp_path):
    runs = {"new": {"summary": {"ttft_s": {"p99": 0.5}, "itl_s": {"p99": 0.02}, "tpot_s": {"p99": 0.03},
                                "e2e_s": {"mean": 2.0}}},
            "old": {"summary": {"ttft_s": {"p99": 0.4}, "tpot_s": {"p99": None}, "e2e_s": {"mean": 1.5}}}}
    assert panel_values(runs, ["new", "old"], "itl_s", "p99") == [20.0, None]  # the old run has no ITL
    assert panel_values(runs, ["new", "old"], "tpot_s", "p99") == [30.0, None]
    plot_runs({"runs": runs}, tmp_path / "serve.png")
    assert (tmp_path / "serve.png").stat().st_size > 0
    assert math.isnan(_ms(None)) and _ms(0.25) == 250.0  # migration plot: a gap in the line
