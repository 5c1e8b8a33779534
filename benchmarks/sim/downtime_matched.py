"""The migration downtime tail in both worlds, on one matched scenario (issue 49).

The scenario is `llumnix bench migration`'s with arrivals: two instances, 4 requests
decoding on each (64-token prompts), one target request (LENGTH tokens) migrated back and
forth over tcp, ``--gap`` seconds of ordinary steps before each migration, and new prompts
(``--arrivals RATE:PROMPT:OUTPUT``, Poisson at each instance, seeded) arriving all along, so
a destination may be running or have queued a prefill when a migration commits. Both
worlds run it with the paper's engine (prefill-only steps) and then with chunked prefill
(``--chunked N`` tokens a step, 256 by default; 0 skips it):

* real: `llumnix bench migration --transport tcp --arrivals ... --gap ... [--chunked-prefill N]`
  in a subprocess (two Ray actors, ``ray.init(num_cpus=2)``), its migration.json read back;
* sim: the same engines (`EngineCore`, the same limits and KV blocks) as `SimInstance`s
  driven through `MigrationRun` in virtual time, the same arrival streams (one seed), the
  same loop (gap, migrate, wait for the first step with it, 0.5 s, gap...).

The simulator's step time is fitted on the real (unchunked) run's own step log (``--latency
fit``, the default when a real run is there: prefill = a + b * tokens on its prefill steps,
decode = c + d * batch on its decode steps, plus the median gap between back-to-back steps;
the last stage's cost from the real pause-to-commit), or taken from a `llumnix profile` file
(``--latency PATH``; `benchmarks/fidelity/profile-smollm2-cpu.json`, the committed CPU
profile, is the default without a real run). The copy's bandwidth comes from that profile.
Each kind of real step (prefill, chunked prefill's mixed step, decode) is checked against the
price the simulator's executor gives its shape (``measured_over_priced``); the chunked
world's model is that fit rescaled on the chunked run's own mixed and decode steps
(``chunked_rescale``: the executor's mixed-step price is not calibrated).

Two simulated variants run, each ``--sim-runs`` times (the first on the real run's arrival
streams), pooled: ``sim``, the simulator as it is, and ``sim_boundaries``
(``BoundaryMigration``: the first stage and the top-up wait for step boundaries as the
real driver's calls do).

For every committed migration of a running request: the downtime (pause on the source to
the destination's first step with it), the part before the commit (the last stage) and the
wait after it, split (`llumnix.bench.downtime_split`) into the rest of the destination's
step in flight (``boundary``), later prefill steps without it, decode steps without it and
idle time; per world n, mean, P50, P90, P99, max; and sim / real at P50 and P99.

    nice -n 19 .venv/bin/python benchmarks/sim/downtime_matched.py                # both worlds (~8 min quiet, estimated)
    .venv/bin/python benchmarks/sim/downtime_matched.py --sim-only                 # profile model, no Ray
    .venv/bin/python benchmarks/sim/downtime_matched.py --real-from DIR            # sim against a saved real run

Writes ``downtime_matched.json`` under ``--out`` (default ./llumnix-results/downtime_matched/),
with the machine, the settings and the load average before and after each world.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from llumnix.bench.downtime_split import ratios, summarize_waits, wait_row
from llumnix.bench.machine import machine_info
from llumnix.bench.migration_bench import CO_RUNNING, Arrivals
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.core.sampling_params import SamplingParams
from llumnix.engine import EngineCore
from llumnix.migration.protocol import MigrationConfig, MigrationPhase, MigrationReport
from llumnix.sim.events import Event, EventKind
from llumnix.sim.executor import HostSteps, SimExecutor
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import NO_CONTENTION, LatencyModel, MigrationCost, ParametricLatencyModel
from llumnix.sim.loop import EventLoop
from llumnix.sim.migration import MigrationRun
from llumnix.sim.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "fidelity" / "profile-smollm2-cpu.json"
KV_BYTES = 2048 * 2**20
"""What `bench migration` gives each instance with arrivals (``Scenario.engine``)."""
MAX_MODEL_LEN = 8192
"""SmolLM2's context: the long-running requests stop there in both worlds."""
LONG_RUN_TOKENS = 20000
SETTLE_S = 0.55
"""After a first step on the destination, `bench migration` polls (50 ms), sleeps 0.5 s and
reads the step logs before the next gap."""


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


# -- the simulated world ---------------------------------------------------------------
class LoggedInstance(SimInstance):
    """A SimInstance that keeps every step's (start, end, prefill?)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.steps: list[tuple[float, float, bool]] = []

    def start_step(self, now: float) -> Event | None:
        ev = super().start_step(now)
        if ev is not None and self._batch is not None:
            self.steps.append((now, ev.time, self._batch.is_prefill))
        return ev


P = MigrationPhase


class BoundaryMigration(MigrationRun):
    """A migration whose stages wait for step boundaries as the real driver's calls do: the
    first stage's blocks read at the source's boundary, then reserved at the destination's
    (a call served on its step thread); after the copy, the check at the source's boundary
    and the top-up at the destination's; then the pause at the source's next one (the
    ``sim_boundaries`` variant; `MigrationRun` reserves at once and charges the waits in its
    stage overhead)."""

    def start(self, now: float) -> list[Event]:
        self._topped_up = False
        return self._at_boundary(self.src, now, lambda t: self._at_boundary(self.dst, t, super(BoundaryMigration,
                                                                                                self).start))

    def _advance(self, now: float) -> list[Event]:
        # after the copy, the real driver's check at a source boundary, then its top-up (a
        # reservation at the destination's), then the pause at the source's next boundary
        # (its usual path: 33 of 40 migrations of the development run; the rest pause at the check)
        if self.protocol.phase == P.PAUSE and not self._topped_up:
            self._topped_up = True
            advance = super()._advance
            return self._at_boundary(self.src, now, lambda t: self._at_boundary(self.dst, t, advance))
        return super()._advance(now)

    @staticmethod
    def _at_boundary(inst: SimInstance, now: float, then: Any) -> list[Event]:
        if inst.is_busy:
            inst.at_boundary.append(then)
            return []
        out: list[Event] = then(now)
        return out


class SimScenario:
    """The matched scenario in virtual time: two instances, the target migrated back and
    forth ``num_migrations`` times, arrivals on both."""

    def __init__(self, latency: LatencyModel, arrivals: Arrivals, *, length: int, gap_s: float,
                 num_migrations: int, chunked: int = 0, seed: int = 0, boundaries: bool = False) -> None:
        self.latency, self.arrivals, self.length, self.gap_s = latency, arrivals, length, gap_s
        self.run_class = BoundaryMigration if boundaries else MigrationRun
        self.num_migrations, self.seed = num_migrations, seed
        self.loop = EventLoop()
        blocks = KV_BYTES // latency.migration.bytes_per_block
        sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=chunked or 8192,
                                chunked_prefill=bool(chunked))
        cfg = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=blocks), scheduler=sched,
                           max_model_len=MAX_MODEL_LEN)
        host = HostSteps()
        self.inst: dict[str, LoggedInstance] = {}
        for name in ("src", "dst"):
            ex = SimExecutor(latency, host)
            self.inst[name] = LoggedInstance(name, EngineCore(cfg, ex, blocks, clock=self.loop.clock,
                                                               instance_id=name), ex)
        self.reports: list[MigrationReport] = []
        self.holder = "src"
        self._started = 0
        self.loop.on(EventKind.STEP_END, lambda ev: ev.target.finish_step(self.loop.clock.now())[1])
        self.loop.on(EventKind.MIGRATION_STAGE, lambda ev: ev.target.on_stage_done(self.loop.clock.now()))
        self.loop.on(EventKind.ARRIVAL, lambda ev: ev.target(self.loop.clock.now()))

    def _add(self, name: str, rid: str, prompt: int, max_tokens: int, now: float) -> list[Event]:
        inst = self.inst[name]
        inst.engine.add_request(rid, [0] * prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                arrival_time=now)
        return inst.wake(now)

    def _decoding(self) -> bool:
        return all(r.num_output_tokens >= 2 for i in self.inst.values() for r in i.engine.requests.values())

    def run(self) -> list[dict[str, float]]:
        loop, now = self.loop, 0.0
        for name in self.inst:
            for i in range(CO_RUNNING):
                loop.push_all(self._add(name, f"bg-{name}-{i}", 64, LONG_RUN_TOKENS, now))
        loop.push_all(self._add("src", "target", self.length - 16, LONG_RUN_TOKENS, now))
        loop.run(stop=self._decoding)
        t0 = loop.clock.now()
        for t, name in self.arrivals.plan(self.seed, tuple(self.inst), horizon_s=3600.0):
            loop.push(Event(t0 + t, EventKind.ARRIVAL, self._arrival(name)))
        loop.push(Event(t0 + self.gap_s, EventKind.ARRIVAL, self._migrate))
        loop.run(stop=lambda: len(self.reports) >= self.num_migrations)
        return self.rows()

    def _arrival(self, name: str) -> Any:
        a = self.arrivals

        def arrive(now: float) -> list[Event]:
            return self._add(name, f"arr-{name}-{now:.6f}", a.prompt, a.output, now)
        return arrive

    def _migrate(self, now: float) -> list[Event]:
        src = self.inst[self.holder]
        dst = self.inst["dst" if self.holder == "src" else "src"]
        self._started += 1
        run = self.run_class(src, dst, "target", MigrationConfig(timeout_s=60.0), self.latency.migration, now,
                           on_done=lambda r, t: [])
        run.on_report(self._on_report)
        return run.start(now)

    def _on_report(self, rep: MigrationReport) -> None:
        self.reports.append(rep)
        if rep.committed:
            self.holder = rep.dst_instance_id
        end = rep.marks.get("resumed", rep.end_time)
        if len(self.reports) < self.num_migrations:
            self.loop.push(Event(end + SETTLE_S + self.gap_s, EventKind.ARRIVAL, self._migrate))

    def rows(self) -> list[dict[str, float]]:
        return [wait_row(r.marks["paused"], r.end_time, r.marks["resumed"], self.inst[r.dst_instance_id].steps)
                for r in self.reports if r.committed and "resumed" in r.marks and "paused" in r.marks]


# -- the real world ----------------------------------------------------------------------
def run_real(args: argparse.Namespace, chunked: int, out: Path) -> dict[str, Any]:
    """`llumnix bench migration` with the scenario's flags, in a subprocess; its result."""
    cmd = [sys.executable, "-m", "llumnix.cli", "bench", "migration", "--transport", "tcp",
           "--repeats", str(args.migrations), "--arrivals", args.arrivals, "--gap", str(args.gap),
           "--seed", str(args.seed), "--out", str(out)]
    if chunked:
        cmd += ["--chunked-prefill", str(chunked)]
    env = {**os.environ, "LLUMNIX_BENCH_LENGTHS": str(args.length)}
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)
    result: dict[str, Any] = json.loads((out / "migration.json").read_text())
    return result


def real_rows(result: dict[str, Any]) -> list[dict[str, float]]:
    return [r["wait"] for r in result["rows"] if r["mode"] == "live" and r.get("wait")]


Shaped = tuple[float, float, int, bool, int, int]
"""A real step: (start, end, outputs, prefill?, tokens computed, decodes among them)."""


def real_steps(result: dict[str, Any]) -> dict[str, list[Shaped]]:
    """Each instance's steps seen in the rows' windows, on one clock, deduplicated; the first
    migration's window (start-up prefills) left out."""
    seen: dict[str, dict[float, Shaped]] = {"src": {}, "dst": {}}
    for row in result["rows"][1:]:
        if "t0" not in row:
            continue
        other = "dst" if row["from"] == "src" else "src"
        for side, name in (("src", row["from"]), ("dst", other)):
            for s, e, k, _c, *x in row[f"{side}_steps"]:
                shape = (int(x[1]), int(x[2])) if len(x) >= 3 else (-1, -1)  # -1: not logged
                seen[name][round(row["t0"] + s, 3)] = (row["t0"] + s, row["t0"] + e, int(k), bool(x and x[0]), *shape)
    return {n: sorted(v.values()) for n, v in seen.items()}


def fit_latency(result: dict[str, Any], prompt: int, base: LatencyModel) -> tuple[ParametricLatencyModel, dict[str, Any]]:
    """Step time from a real run's own step log (the paper's engine: prefill-only steps):
    prefill a + b * tokens (the tokens logged, else outputs x ``prompt``), decode c + d *
    batch, the median gap between back-to-back steps as the serving loop's overhead per step."""
    steps = real_steps(result)
    pre = [(tok if tok >= 0 else k * prompt, e - s) for log in steps.values() for s, e, k, p, tok, nd in log
           if p and nd <= 0 and k > 0]
    dec = [(k, e - s) for log in steps.values() for s, e, k, p, _t, _d in log if not p and k > 0]
    gaps = [b[0] - a[1] for log in steps.values() for a, b in zip(log, log[1:], strict=False)
            if 0 <= b[0] - a[1] < 0.05]
    if len(pre) < 3 or len(dec) < 3:
        raise SystemExit("the real run has too few prefill or decode steps to fit a step time")

    def line(xy: list[tuple[int, float]]) -> tuple[float, float]:
        x, y = np.asarray([p[0] for p in xy], float), np.asarray([p[1] for p in xy], float)
        if np.ptp(x) == 0:
            return float(np.median(y)), 0.0
        b, a = np.polyfit(x, y, 1)
        if a < 0 or b < 0:  # no step may cost less than nothing: through the origin, or flat
            b = max(0.0, float(np.dot(x, y) / np.dot(x, x)))
            return (0.0, b) if b > 0 else (float(np.median(y)), 0.0)
        return float(a), float(b)

    (pa, pb), (da, db) = line(pre), line(dec)
    overhead = float(np.median(gaps)) if gaps else 0.0
    # The last stage as the real one took it (pause to commit: the copy of a block or two
    # and the install's round trip to the destination's actor), less a block's copy.
    last = [r["before_commit"] for r in real_rows(result)]
    mig = base.migration if not last else replace(
        base.migration, last_stage_overhead_s=max(0.0, float(np.median(last)) - base.migration.copy_time(1)))
    model = ParametricLatencyModel(pa, pb, 0.0, da, db, 0.0, mig, NO_CONTENTION, step_overhead_s=overhead)
    info = {"source": "fit on the real run's step log", "prefill_s": [pa, pb], "decode_s": [da, db],
            "step_overhead_s": overhead, "last_stage_overhead_s": mig.last_stage_overhead_s,
            "num_prefill_steps": len(pre), "num_decode_steps": len(dec),
            "prefill_step_median_s": float(np.median([y for _, y in pre])),
            "decode_step_median_s": float(np.median([y for _, y in dec]))}
    return model, info


def first_stage_overhead(result: dict[str, Any], cost: MigrationCost) -> float | None:
    """The first stage's fixed cost without its boundary waits: from its reservation to its
    KV written (median), less the copy of its blocks at the cost's bandwidth."""
    xs = [r["last_stage_s"]["first_sent"] - r["last_stage_s"]["first_reserved"] - cost.copy_time(r["blocks"] - 1)
          for r in result["rows"] if r["mode"] == "live" and r["committed"]
          and {"first_sent", "first_reserved"} <= set(r.get("last_stage_s", {}))]
    return max(0.0, float(np.median(xs))) if xs else None


def _chunked_models(models: dict[str, LatencyModel], real: dict[str, Any] | None,
                    info: dict[str, Any]) -> dict[str, LatencyModel]:
    """The chunked world's models: the fit (made on the unchunked run) rescaled by the
    chunked run's own steps, prefill terms by its mixed steps' measured over priced and
    decode terms by its decode steps' (the simulator's mixed-step model is not calibrated:
    this calibrates it on the run). Unchanged without a fit or without such steps."""
    base = models["sim"]
    if real is None or not isinstance(base, ParametricLatencyModel):
        return models
    check = step_check(real, base)
    rp, rd = (check[k]["median_measured_over_priced"] or 1.0 for k in ("mixed", "decode"))
    info["chunked_rescale"] = {"prefill": rp, "decode": rd}
    out: dict[str, LatencyModel] = {"base": base}
    for name, m in models.items():
        assert isinstance(m, ParametricLatencyModel)
        out[name] = replace(m, prefill_fixed_s=m.prefill_fixed_s * rp, prefill_per_token_s=m.prefill_per_token_s * rp,
                            decode_fixed_s=m.decode_fixed_s * rd, decode_per_seq_s=m.decode_per_seq_s * rd)
    return out


def step_check(result: dict[str, Any], model: LatencyModel) -> dict[str, Any]:
    """Measured over priced, per kind of real step (median and count), with the prices the
    simulator's executor gives a step of that shape: a prefill step its tokens, a mixed step
    (chunked prefill) a chunk after the first plus its decodes' marginal cost, a decode step
    its batch (context not logged: ``model`` at none)."""
    ratios: dict[str, list[float]] = {"prefill": [], "mixed": [], "decode": []}
    fixed = model.prefill_time(())
    over = model.step_overhead_s
    for log in real_steps(result).values():
        for s, e, k, p, tok, nd in log:
            if tok < 0 or k <= 0:
                continue
            if not p:
                ratios["decode"].append((e - s) / (model.decode_time(k, 0) + over))
            elif nd == 0:
                ratios["prefill"].append((e - s) / (model.prefill_time([tok]) + over))
            else:  # the chunk as a first one (a later one's marginal price is the same on a
                # linear fit), its decodes' marginal cost as the executor prices it
                chunk = model.prefill_time([tok - nd])
                extra = (model.prefill_time([1] * nd) - fixed) + (model.decode_time(nd, 0) - model.decode_time(0, 0))
                ratios["mixed"].append((e - s) / (chunk + extra + over))
    return {k: {"n": len(v), "median_measured_over_priced": float(np.median(v)) if v else None}
            for k, v in ratios.items()}


# -- both -----------------------------------------------------------------------------------
def world(rows: list[dict[str, float]], load: list[float]) -> dict[str, Any]:
    return {**summarize_waits(rows), "load_avg": load}


VARIANTS = {"sim": False, "sim_boundaries": True}
"""The simulator as it is (``MigrationRun``), and with ``BoundaryMigration``'s boundaries."""


def simulate(args: argparse.Namespace, chunked: int, latency: LatencyModel, arrivals: Arrivals,
             boundaries: bool) -> dict[str, Any]:
    """``args.sim_runs`` runs of the scenario (seeds ``seed * 100 + r``, the first the real
    run's arrival streams), pooled."""
    load, t = _load(), time.process_time()
    rows: list[dict[str, float]] = []
    steps: dict[str, list[tuple[float, float, bool]]] = {"src": [], "dst": []}
    for r in range(args.sim_runs):
        sim = SimScenario(latency, arrivals, length=args.length, gap_s=args.gap, num_migrations=args.migrations,
                          chunked=chunked, seed=args.seed * 100 + r, boundaries=boundaries)
        rows += sim.run()
        for n, i in sim.inst.items():
            steps[n] += i.steps
    out = world(rows, load)
    out.update(cpu_s=time.process_time() - t, steps={n: _step_stats(v) for n, v in steps.items()})
    return out


def compare(args: argparse.Namespace, chunked: int, real: dict[str, Any] | None,
            models: dict[str, LatencyModel], arrivals: Arrivals) -> dict[str, Any]:
    out: dict[str, Any] = {"chunked_prefill_tokens": chunked}
    for name, boundaries in VARIANTS.items():
        out[name] = simulate(args, chunked, models[name], arrivals, boundaries)
    if real is not None:
        out["real"] = world(real_rows(real), real.get("_load", []))
        out["real"]["steps"] = {n: _step_stats([(s, e, p) for s, e, _k, p, *_ in log])
                                for n, log in real_steps(real).items()}
        out["real"]["measured_over_priced"] = step_check(real, models.get("base", models["sim"]))
        for name in VARIANTS:
            out[f"{name}_over_real"] = ratios(out[name], out["real"])
    return out


def _step_stats(steps: list[tuple[float, float, bool]]) -> dict[str, Any]:
    pre = [e - s for s, e, p in steps if p]
    dec = [e - s for s, e, p in steps if not p]
    return {"num_prefill": len(pre), "num_decode": len(dec),
            "prefill_median_s": float(np.median(pre)) if pre else None,
            "decode_median_s": float(np.median(dec)) if dec else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024, help="target request's tokens")
    ap.add_argument("--arrivals", default="0.25:256:16", help="RATE:PROMPT:OUTPUT at each instance")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds before each migration")
    ap.add_argument("--migrations", type=int, default=40, help="live migrations of the real world, per engine")
    ap.add_argument("--sim-runs", type=int, default=10,
                    help="simulated runs of the scenario, pooled (the first on the real run's arrival streams, "
                         "the others on the next seeds): each as long as the real one, so the long-running "
                         "requests' contexts grow alike, and percentiles on more migrations")
    ap.add_argument("--chunked", type=int, default=256, help="chunked prefill's tokens a step (0: skip that run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latency", default=None, help="'fit' (the real run's steps; default with a real run) "
                                                     "or a profile JSON (default without one)")
    ap.add_argument("--sim-only", action="store_true", help="no real run (no Ray)")
    ap.add_argument("--real-from", default=None, help="a directory of an earlier run's real/*/migration.json")
    ap.add_argument("--out", default="llumnix-results/downtime_matched")
    args = ap.parse_args()
    arrivals = Arrivals.parse(args.arrivals)
    out_dir = Path(args.out)
    engines = [0] + ([args.chunked] if args.chunked else [])
    real: dict[int, dict[str, Any] | None] = {}
    for c in engines:
        d = Path(args.real_from or out_dir) / "real" / ("chunked" if c else "unchunked")
        if args.sim_only:
            real[c] = None
        elif args.real_from:
            real[c] = json.loads((d / "migration.json").read_text())
        else:
            before = _load()
            real[c] = run_real(args, c, d)
            real[c]["_load"] = before + _load()  # type: ignore[index]
    profile = load_profile(args.latency if args.latency not in (None, "fit") else PROFILE)
    latency: LatencyModel = profile
    model_info: dict[str, Any] = {"source": str(args.latency or PROFILE)}
    if real[0] is not None and args.latency in (None, "fit"):
        latency, model_info = fit_latency(real[0], arrivals.prompt, profile)
    models = {"sim": latency, "sim_boundaries": latency}
    first = None if real[0] is None else first_stage_overhead(real[0], latency.migration)
    if first is not None and isinstance(latency, ParametricLatencyModel):
        # the boundaries are waited for: the stage's fixed cost without them
        models["sim_boundaries"] = replace(latency, migration=replace(latency.migration, stage_overhead_s=first))
        model_info["boundaries_stage_overhead_s"] = first
    result = {"scenario": {"length": args.length, "arrivals": vars(arrivals), "gap_s": args.gap,
                           "migrations": args.migrations, "sim_runs": args.sim_runs, "co_running": CO_RUNNING, "seed": args.seed,
                           "kv_bytes": KV_BYTES, "max_model_len": MAX_MODEL_LEN},
              "latency_model": model_info, "machine": machine_info(),
              "worlds": [compare(args, c, real[c], _chunked_models(models, real[c], model_info) if c else models,
                                 arrivals) for c in engines]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "downtime_matched.json").write_text(json.dumps(result, indent=1))
    for w in result["worlds"]:
        print(f"chunked={w['chunked_prefill_tokens']}")
        for name in ("real", *VARIANTS):
            if name in w:
                print(f"  {name}: wait {_fmt(w[name]['wait'])}; downtime {_fmt(w[name]['downtime'])}")
        for name in VARIANTS:
            if f"{name}_over_real" in w:
                print(f"  {name}/real:", {k: None if v is None else round(v, 2) for k, v in w[f"{name}_over_real"].items()})
    print(f"wrote {out_dir / 'downtime_matched.json'}")


def _fmt(q: dict[str, float]) -> str:
    if not q.get("n"):
        return "n=0"
    return f"n={q['n']} P50 {1e3 * q['p50']:.0f} P90 {1e3 * q['p90']:.0f} P99 {1e3 * q['p99']:.0f} " \
           f"max {1e3 * q['max']:.0f} ms"


if __name__ == "__main__":
    main()
