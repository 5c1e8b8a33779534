"""Our simulator and Vidur side by side on a like trace (issue 49): wall and CPU time.

    .venv/bin/python benchmarks/sim/vidur_side_by_side.py --vidur-python /tmp/vidur-venv/bin/python

Vidur (``pip install vidur==0.0.26``, into a venv of its own: it pulls in streamlit, wandb,
sklearn) is run in that venv's Python; nothing here imports it in ours. Both simulate the
same requests: ``speed.yaml``'s trace (M-M at 7.6 req/s, 10,000 requests; ``--num-requests``
for fewer) written as a CSV for Vidur's trace-replay generator, on 16 instances of 862
blocks of 16 tokens (Vidur: 32x the blocks, ``--vidur-blocks``: with 1x-8x, its vLLM scheduler's
preemption fails an assertion in 0.0.26, so Vidur runs without memory pressure), vLLM-style scheduling (a prefill step or a decode
step) with 12,800 batched tokens and 256 sequences at most.

Vidur's step times come from regression models it trains on profiles it downloads from
HuggingFace; this machine cannot reach the hub, so Vidur runs with a stand-in predictor that
prices a batch with our ``a10-llama7b-serving`` model (the same parametric prefill and decode
terms, as one per-layer cost). The stand-in is a closed form, as cheap as or cheaper than
the lookups Vidur's trained predictors make, so Vidur's time is its event loop, schedulers
and metrics, not its predictor. The dispatch differs by design (Vidur has no migration):
Vidur uses its least-outstanding-requests dispatch; ours runs two ways, ``speed.yaml`` as
committed (Llumnix dispatch and migration: more work per request) and with round-robin
dispatch and no migration.

Runs alternate (Vidur, ours, ours round-robin) ``--rounds`` times, each a fresh process
timed from outside (wall, and the child's CPU from ``resource``) and from inside (the
simulation loop alone). Output: JSON outside the checkout (``--out``), a table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NUM_INSTANCES = 16
NUM_BLOCKS = 862
BLOCK_SIZE = 16
MAX_BATCHED_TOKENS = 12800
MAX_NUM_SEQS = 256


# -- Vidur's side (runs in Vidur's venv; imports nothing of ours) ----------------------
def run_vidur(csv_path: str, params: dict[str, float], out_dir: str) -> dict[str, Any]:
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        LinearRegressionExecutionTimePredictorConfig,
        LORGlobalSchedulerConfig,
        MetricsConfig,
        ReplicaConfig,
        SimulationConfig,
        TraceRequestGeneratorConfig,
        VllmSchedulerConfig,
    )
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry
    from vidur.execution_time_predictor.base_execution_time_predictor import BaseExecutionTimePredictor
    from vidur.simulator import Simulator
    from vidur.types import ExecutionTimePredictorType
    from vidur.utils.random import set_seeds

    class StandIn(BaseExecutionTimePredictor):  # type: ignore[misc]
        """Our parametric step model as one per-layer cost (ms); every other term 0."""

        def _step_ms(self, batch: Any) -> float:
            p = params
            q, kv = batch.num_q_tokens, batch.num_kv_tokens
            if any(n > 1 for n in q):
                lens = [a + b for a, b in zip(q, kv, strict=True)]
                t = p["p0"] + p["p1"] * sum(lens) + p["p2"] * sum(n * n for n in lens)
            else:
                t = p["d0"] + p["d1"] * len(q) + p["d2"] * (sum(kv) + len(q))
            return (t + p["overhead"]) * 1e3 / self._num_layers_per_pipeline_stage

        def _get_mlp_layer_up_proj_execution_time(self, batch: Any) -> float:
            return self._step_ms(batch)

        def _zero(self, batch: Any) -> float:
            return 0.0

        _get_attention_layer_pre_proj_execution_time = _zero
        _get_attention_layer_post_proj_execution_time = _zero
        _get_attention_rope_execution_time = _zero
        _get_attention_kv_cache_save_execution_time = _zero
        _get_attention_decode_execution_time = _zero
        _get_attention_prefill_execution_time = _zero
        _get_mlp_layer_down_proj_execution_time = _zero
        _get_mlp_layer_act_execution_time = _zero
        _get_tensor_parallel_communication_time = _zero
        _get_pipeline_parallel_communication_time = _zero
        _get_mlp_norm_layer_act_execution_time = _zero
        _get_attn_norm_layer_act_execution_time = _zero
        _get_add_layer_act_execution_time = _zero
        _get_kv_parallel_communication_time = _zero

    # Vidur sizes a replica's batch as (KV tokens its memory planner finds) // (the longest
    # request); ours is capped at MAX_NUM_SEQS and by the blocks. The planner is told the
    # KV that gives MAX_NUM_SEQS, and the blocks are set below.
    from vidur.utils.memory_planner import MemoryPlanner
    MemoryPlanner.get_max_kv_cache_size_in_tokens = lambda self: MAX_NUM_SEQS * int(params["max_tokens"])
    key = ExecutionTimePredictorType.LINEAR_REGRESSION
    ExecutionTimePredictorRegistry.unregister(key)
    ExecutionTimePredictorRegistry.register(key, StandIn)
    max_tokens = int(params["max_tokens"])
    config = SimulationConfig(
        seed=0, log_level="warning",
        cluster_config=ClusterConfig(
            num_replicas=NUM_INSTANCES,
            replica_config=ReplicaConfig(model_name="meta-llama/Llama-2-7b-hf", num_pipeline_stages=1,
                                         tensor_parallel_size=1, device="a100",
                                         network_device="a100_pairwise_nvlink"),
            cache_config=CacheConfig(block_size=BLOCK_SIZE, num_blocks=int(params["num_blocks"])),
            global_scheduler_config=LORGlobalSchedulerConfig(),
            replica_scheduler_config=VllmSchedulerConfig(batch_size_cap=MAX_NUM_SEQS,
                                                         max_tokens_in_batch=MAX_BATCHED_TOKENS)),
        request_generator_config=TraceRequestGeneratorConfig(
            trace_file=csv_path, date="trace", prefill_scale_factor=1.0, decode_scale_factor=1.0,
            time_scale_factor=1.0, max_tokens=max_tokens),
        execution_time_predictor_config=LinearRegressionExecutionTimePredictorConfig(),
        metrics_config=MetricsConfig(write_metrics=True, enable_chrome_trace=False, store_plots=False,
                                     output_dir=out_dir))
    set_seeds(0)
    sim = Simulator(config)
    num_events = 0
    add = sim._add_event

    def counted(event: Any) -> None:
        nonlocal num_events
        num_events += 1
        add(event)

    sim._add_event = counted
    initial = len(sim._event_queue)  # the arrivals
    start, cpu = time.perf_counter(), time.process_time()
    sim.run()
    return {"loop_wall_s": time.perf_counter() - start, "loop_cpu_s": time.process_time() - cpu,
            "num_events": initial + num_events - len(sim._event_queue)}


# -- our side -------------------------------------------------------------------------
def write_trace_csv(path: Path, num_requests: int) -> dict[str, float]:
    """speed.yaml's trace as Vidur's trace-replay CSV; returns the latency parameters."""
    sys.path.insert(0, str(ROOT / "src"))
    from llumnix.sim.config import load_config
    from llumnix.sim.latency import ParametricLatencyModel, get_latency_model
    from llumnix.sim.runner import plan
    from llumnix.sim.workloads import make_trace

    spec = plan(load_config(str(HERE / "speed.yaml")))[0]
    trace = make_trace(spec.trace, spec.rate, spec.seed)
    n = min(num_requests, len(trace))
    rows = ["Date,Time,PromptTokenCount,CompletionTokenCount"]
    for i in range(n):
        rows.append(f"trace,{float(trace.arrival_times[i])!r},{int(trace.prompt_lens[i])},"
                    f"{int(trace.output_lens[i])}")
    path.write_text("\n".join(rows) + "\n")
    m = get_latency_model(spec.latency_model)
    assert isinstance(m, ParametricLatencyModel)
    return {"p0": m.prefill_fixed_s, "p1": m.prefill_per_token_s, "p2": m.prefill_per_token2_s,
            "d0": m.decode_fixed_s, "d1": m.decode_per_seq_s, "d2": m.decode_per_context_token_s,
            "overhead": m.step_overhead_s,
            "max_tokens": max(int(trace.prompt_lens[i]) + int(trace.output_lens[i]) for i in range(n))}


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; its wall time, its CPU time (user + system, from rusage) and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"vidur_side_by_side: {cmd[0]} failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "stdout": done.stdout, "load_avg_1m": os.getloadavg()[0]}


def _ours(src: Path, config: str, num_requests: int, extra: list[str], work: Path) -> dict[str, Any]:
    out = work / "ours"
    cmd = [sys.executable, "-m", "llumnix.cli", "simulate", str(HERE / config), "--out", str(out),
           "--set", f"num_requests={num_requests}", *extra]
    r = _timed(cmd, dict(os.environ, PYTHONPATH=str(src)))
    sim = json.loads((out / "metrics.json").read_text())["records"][0]["sim"]
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "loop_wall_s": sim["wall_s"],
            "loop_cpu_s": sim["cpu_s"], "num_events": sim["num_events"], "load_avg_1m": r["load_avg_1m"]}


def _vidur(vidur_python: str, csv: Path, params: dict[str, float], work: Path) -> dict[str, Any]:
    cmd = [vidur_python, __file__, "--as-vidur", str(csv), json.dumps(params), str(work / "vidur")]
    r = _timed(cmd, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    inner = json.loads(r["stdout"].strip().splitlines()[-1])
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "loop_wall_s": inner["loop_wall_s"],
            "loop_cpu_s": inner["loop_cpu_s"], "num_events": inner["num_events"], "load_avg_1m": r["load_avg_1m"]}


SYSTEMS = {
    "vidur": None,
    "ours (speed.yaml: llumnix + migration)": [],
    "ours (round-robin, no migration)": ["--set", "systems.llumnix.dispatch=round-robin",
                                         "--set", "systems.llumnix.migration=false"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur-python", required=True, help="the Python of a venv with vidur==0.0.26")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="our source tree to time")
    ap.add_argument("--vidur-blocks", type=int, default=32 * NUM_BLOCKS,
                    help="Vidur's blocks per replica (default 32x ours: with 1x-8x its vLLM scheduler's "
                         "preemption fails an assertion on this trace, request.py:300 in 0.0.26)")
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "vidur_side_by_side.json")
    args = ap.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    with tempfile.TemporaryDirectory(prefix="vidur-sbs-") as tmp:
        work = Path(tmp)
        csv = work / "trace.csv"
        params = write_trace_csv(csv, args.num_requests)
        params["num_blocks"] = args.vidur_blocks
        for i in range(args.rounds):
            for name, extra in SYSTEMS.items():
                r = (_vidur(args.vidur_python, csv, params, work) if extra is None
                     else _ours(args.src, "speed.yaml", args.num_requests, extra, work))
                results[name].append(r)
                print(f"round {i + 1} {name}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, loop wall "
                      f"{r['loop_wall_s']:.1f} s, loop CPU {r['loop_cpu_s']:.1f} s, {r['num_events']:,} events, "
                      f"load {r['load_avg_1m']:.1f}",
                      flush=True)
    summary = {name: {k: median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "loop_wall_s", "loop_cpu_s")}
               for name, rs in results.items()}
    v = summary["vidur"]
    for name, s in summary.items():
        print(f"{name}: median wall {s['wall_s']:.1f} s, CPU {s['cpu_s']:.1f} s, loop CPU {s['loop_cpu_s']:.1f} s"
              + ("" if name == "vidur" else f"; Vidur / ours: CPU {v['cpu_s'] / s['cpu_s']:.1f}x, "
                 f"loop CPU {v['loop_cpu_s'] / s['loop_cpu_s']:.1f}x"))
    args.out.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "cores": os.cpu_count(),
                    "load_avg_1m": os.getloadavg()[0]},
        "settings": {"num_requests": args.num_requests, "rounds": args.rounds, "trace": "speed.yaml M-M 7.6",
                     "instances": NUM_INSTANCES, "num_blocks": NUM_BLOCKS, "vidur_blocks": args.vidur_blocks,
                     "vidur": "0.0.26, stand-in predictor"},
        "runs": results, "medians": summary}, indent=1) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--as-vidur":
        print(json.dumps(run_vidur(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4])))
        sys.exit(0)
    sys.exit(main())
