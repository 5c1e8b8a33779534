"""How far a latency model is from every published anchor (sim/calibration.py).

Prefill and decode rows ask the model directly. The migration rows are measured:
a two-instance simulation decodes the anchor's batch on the source and migrates
one request through the real protocol driver, so the downtime and the slowed-down
decode step include the stage structure, not just the formula.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from llumnix.core.clock import VirtualClock
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.core.sampling_params import SamplingParams
from llumnix.engine import EngineCore
from llumnix.migration.protocol import MigrationConfig
from llumnix.sim import calibration as cal
from llumnix.sim.events import Event, EventKind
from llumnix.sim.executor import SimExecutor
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import LatencyModel, fit_a10_llama7b
from llumnix.sim.loop import EventLoop
from llumnix.sim.migration import MigrationRun


@dataclass(frozen=True)
class AnchorError:
    quantity: str
    seq_len: int
    paper_ms: float
    model_ms: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.model_ms - self.paper_ms) / self.paper_ms


def _instance(name: str, model: LatencyModel, clock: VirtualClock, num_blocks: int) -> SimInstance:
    config = EngineConfig(cache=CacheConfig(block_size=cal.BLOCK_SIZE, num_blocks=num_blocks),
                          scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=16384),
                          max_model_len=16384)
    ex = SimExecutor(model)
    return SimInstance(name, EngineCore(config, ex, num_blocks, clock=clock, instance_id=name), ex)


def measure_migration(model: LatencyModel, seq_len: int, *, max_stages: int = 3) -> tuple[float, float]:
    """(downtime, the source's first decode step while the KV copy runs), seconds.

    The source holds 8192/seq_len sequences of seq_len prompt tokens, all decoding;
    one of them migrates to an empty instance two decode steps after the prefill."""
    loop = EventLoop()
    clock = loop.clock
    src = _instance("src", model, clock, 1200)
    dst = _instance("dst", model, clock, 1200)
    batch = max(1, cal.DECODE_CONTEXT_TOKENS // seq_len)
    for i in range(batch):
        src.engine.add_request(f"r{i}", [0] * seq_len, SamplingParams(max_tokens=1000, ignore_eos=True))
    done: list[MigrationRun] = []
    copy_steps: list[float] = []

    def on_step(ev):  # type: ignore[no-untyped-def]
        inst: SimInstance = ev.target
        _, events = inst.finish_step(clock.now())
        if inst is src and src.is_busy and src.executor.last_slowed and not copy_steps:
            copy_steps.append(src.executor.last_elapsed)  # the step that just started
        return events

    loop.on(EventKind.STEP_END, on_step)
    loop.on(EventKind.MIGRATION_STAGE, lambda ev: ev.target.on_stage_done(clock.now()))
    loop.push_all(src.wake(0.0))
    loop.run(max_events=3)  # prefill, then two decode steps
    def on_done(r: MigrationRun, now: float) -> list[Event]:
        done.append(r)
        return []

    run = MigrationRun(src, dst, "r0", MigrationConfig(max_stages=max_stages), model.migration, clock.now(),
                       on_done=on_done)
    loop.push_all(run.start(clock.now()))
    loop.run(stop=lambda: bool(done))
    report = run.protocol.report()
    if not report.committed or report.downtime is None:
        raise RuntimeError(f"calibration migration did not commit: {report.abort_reason}")
    return report.downtime, (copy_steps[0] if copy_steps else float("nan"))


def calibration_report(latency: LatencyModel | None = None) -> list[AnchorError]:
    model: LatencyModel = latency or fit_a10_llama7b()
    rows: list[AnchorError] = []
    for i, n in enumerate(cal.SEQ_LENS):
        rows.append(AnchorError("prefill", n, cal.PREFILL_MS[i], 1e3 * model.prefill_time([n])))
    for i, n in enumerate(cal.SEQ_LENS):
        b = cal.DECODE_CONTEXT_TOKENS // n
        rows.append(AnchorError("decode", n, cal.DECODE_MS[i],
                                1e3 * model.decode_time(b, cal.DECODE_CONTEXT_TOKENS)))
    for i, n in enumerate(cal.SEQ_LENS):
        downtime, step = measure_migration(model, n)
        rows.append(AnchorError("decode_while_migrating", n, cal.DECODE_MIGRATING_MS[i], 1e3 * step))
        rows.append(AnchorError("downtime", n, cal.DOWNTIME_MS[i], 1e3 * downtime))
    for i, n in enumerate(cal.SEQ_LENS):
        downtime, _ = measure_migration(model, n, max_stages=1)
        rows.append(AnchorError("blocking_copy", n, cal.BLOCKING_COPY_MS[i], 1e3 * downtime))
    order = ["prefill", "decode", "decode_while_migrating", "downtime", "blocking_copy"]
    return sorted(rows, key=lambda r: (order.index(r.quantity), r.seq_len))


def report_markdown(rows: list[AnchorError]) -> str:
    lines = ["| quantity | seq len | paper (ms) | model (ms) | error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.quantity} | {r.seq_len} | {r.paper_ms:.1f} | {r.model_ms:.1f} | {r.error_pct:+.1f}% |")
    worst = max(rows, key=lambda r: abs(r.error_pct))
    lines.append("")
    lines.append(f"Largest error: {worst.error_pct:+.1f}% ({worst.quantity}, {worst.seq_len} tokens).")
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | Path, model: LatencyModel | None = None) -> list[AnchorError]:
    rows = calibration_report(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(
        [{**asdict(r), "error_pct": round(r.error_pct, 3)} for r in rows], indent=1) + "\n")
    (out / "calibration.md").write_text(report_markdown(rows))
    return rows
