"""`llumnix bench migration`: downtime of live migration against recompute and a
blocking copy, by sequence length and KV transport, between two instance
processes (Ray actors) on this machine, with other requests decoding on both sides.

Per length, one long request is prefilled once and then migrated back and forth
(``repeats`` live migrations per transport, then one blocking copy), with a
baseline window of ordinary decode steps before each migration. Measured per
migration, all on the host's monotonic clock:

* ``downtime_s``: the paper's downtime, from the pausing step boundary on the
  source (right after the request's last step there) to the destination's
  acknowledgement that it is queued to resume (schedulable);
* ``resume_s``: from the same pause to the start of the first destination step
  that runs it; ``token_gap_s``: to the end of that step (its first new token);
* co-running slowdown: the step time of the *other* requests on each side while
  the migration copies (source: until the pause, same batch; destination: until
  the install) over their step time in the ``WINDOW_S`` just before. Step time over
  a window is its length over the number of steps in it, a step straddling an edge
  counting by the fraction inside (``_step_time``): the inverse of the co-running
  requests' token rate, so a stall between steps counts too. ``control`` is the
  same ratio, measured the same way with windows of the same lengths, just before
  the migration (no migration at all): the noise of this shared machine and of the
  estimator.

  Until 2026-11-23 the ratio was of the plain mean of the steps overlapping each
  window (kept as ``*_slowdown_overlap``), with a control of two 2.5 s windows. A
  short window is more likely to overlap a long step than a short one (the
  inspection paradox), so with a 0.5-1 s "during" window against a 2.5 s "before"
  that estimator reads a few percent of slowdown where there is none, and its
  control, with equal windows, could not show it.

With ``--arrivals RATE[:PROMPT[:OUTPUT]]`` new prompts reach each instance while the
target migrates (Poisson, RATE a second each, seeded by ``--seed``), so a destination may
be running or have queued a prefill when a migration commits: the scenario of issue 49's
downtime tail (``benchmarks/sim/downtime_matched.py`` runs it in both worlds). Each
committed row then carries ``wait`` (``bench/downtime_split.py``: the downtime, the part
before the commit, the wait after it and its split), and the result their distributions
(``downtime_wait``). ``--gap S`` replaces the baseline windows before each migration,
``--chunked-prefill TOKENS`` turns on the engines' chunked prefill.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llumnix.bench.downtime_split import summarize_waits, wait_row
from llumnix.bench.machine import machine_info, write_result
from llumnix.core.errors import LlumnixError
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest

LENGTHS = (256, 512, 1024, 2048, 4096)
TRANSPORTS = ("tcp", "gloo", "ray")
CO_RUNNING = 4
WINDOW_S = 2.5
LONG_RUN_TOKENS = 20000
"""Output tokens of the target and the co-running requests with ``--arrivals``."""
Log = list[tuple[float, ...]]  # (start, end, batch size[, CPU seconds of the step thread])


@dataclass(frozen=True)
class Arrivals:
    """New prompts at each instance while the target migrates (``--arrivals``)."""

    rate: float
    """Prompts a second at each instance (Poisson)."""
    prompt: int = 256
    """Prompt tokens of each."""
    output: int = 16
    """Output tokens of each (EOS ignored)."""

    @staticmethod
    def parse(spec: str) -> Arrivals:
        try:
            parts = [float(x) for x in spec.split(":")]
        except ValueError:
            parts = []
        if not 1 <= len(parts) <= 3 or parts[0] <= 0 or any(x < 1 or x != int(x) for x in parts[1:]):
            raise LlumnixError(f"--arrivals must be RATE[:PROMPT[:OUTPUT]] (RATE > 0 a second, token counts >= 1), "
                               f"got {spec!r}")
        return Arrivals(parts[0], *(int(x) for x in parts[1:]))

    def times(self, seed: int, horizon_s: float) -> list[float]:
        """Seconds from the stream's start of one instance's arrivals (seeded)."""
        rng = np.random.default_rng(seed)
        n = int(self.rate * horizon_s * 1.5) + 20
        t = np.cumsum(rng.exponential(1.0 / self.rate, n))
        return [float(x) for x in t[t < horizon_s]]

    def plan(self, seed: int, names: tuple[str, ...], horizon_s: float) -> list[tuple[float, str]]:
        """(seconds from the streams' start, instance) in time order, one seeded stream per
        instance (the simulator's side of the matched scenario replays the same)."""
        return sorted((t, name) for k, name in enumerate(names) for t in self.times(seed * 1000 + k, horizon_s))


class ArrivalFeeder:
    """Sends ``Arrivals`` to each actor from a thread, each instance its own seeded stream."""

    def __init__(self, actors: dict[str, Any], spec: Arrivals, seed: int, horizon_s: float = 3600.0) -> None:
        self.actors, self.spec = actors, spec
        self.plan = spec.plan(seed, tuple(actors), horizon_s)
        self.sent: list[tuple[str, float, str]] = []
        """(instance, monotonic time sent, request id)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arrivals", daemon=True)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        for i, (t, name) in enumerate(self.plan):
            if self._stop.wait(max(0.0, self._t0 + t - time.monotonic())):
                return
            rid = f"arr-{name}-{i}"
            self.actors[name].add_request.remote(_req(rid, self.spec.prompt, self.spec.output, 1000 + i))
            self.sent.append((name, time.monotonic(), rid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def _prompt(n: int, salt: int) -> list[int]:
    return [100 + (i * 7919 + salt * 104729) % 40000 for i in range(n)]


def _req(rid: str, n: int, max_tokens: int, salt: int) -> GenerateRequest:
    return GenerateRequest(rid, _prompt(n, salt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                           0, time.monotonic())


def _wait_decoding(ray: Any, actor: Any, rid: str, min_tokens: int = 2, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while True:
        try:  # a long prefill on a loaded machine can hold the step boundary past a call's timeout
            if ray.get(actor.num_output_tokens.remote(rid), timeout=120) >= min_tokens:
                return
        except (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
            pass
        if time.time() > deadline:
            raise TimeoutError(f"{rid} did not start decoding")
        time.sleep(0.05)


def _mean_step(log: Log, lo: float, hi: float) -> float | None:
    """Mean duration of the decode steps that overlap [lo, hi] (biased up for a short
    window: it is likelier to overlap a long step than a short one)."""
    steps = [e - s for s, e, n, *_ in log if e >= lo and s <= hi and n > 0]
    return statistics.mean(steps) if steps else None


def _step_time(log: Log, lo: float, hi: float) -> float | None:
    """Seconds per decode step over [lo, hi]: the window's length over the steps in
    it, a step straddling an edge counted by the fraction of it inside. Gaps between
    steps count, as the co-running requests wait through them too."""
    n = sum((min(e, hi) - max(s, lo)) / (e - s) for s, e, k, *_ in log if k > 0 and e > lo and s < hi and e > s)
    return (hi - lo) / n if n > 0 else None


def _mean_cpu(log: Log, lo: float, hi: float) -> float | None:
    """Mean CPU seconds of the decode steps wholly inside [lo, hi]."""
    cpu = [x[3] for x in log if len(x) > 3 and x[2] > 0 and x[0] >= lo and x[1] <= hi]
    return statistics.mean(cpu) if cpu else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def _resume(log: Log, paused_at: float) -> tuple[float, float] | None:
    """(start, end) of the first step after the pause whose batch grew by one: the
    migrated request's first step on the destination (the only arrival: the
    benchmark adds nothing else meanwhile)."""
    prev = None
    for s, e, n, *_ in log:
        if s < paused_at:
            prev = n
            continue
        if prev is not None and n == prev + 1:
            return s, e
        prev = n
    return None


def migrate_once(ray: Any, src: Any, dst: Any, dst_name: str, rid: str, transport: str,
                 mode: str, expect_s: float = WINDOW_S, gap_s: float | None = None,
                 arrivals: bool = False) -> dict[str, Any]:
    # Ordinary decode steps on both sides before the migration: the baseline window and,
    # before it, room for a control pair of the lengths the migration is expected to take.
    time.sleep(WINDOW_S + 1.5 * expect_s + 0.5 if gap_s is None else gap_s)
    # Niced copies yield to the engines, so on a loaded machine a long sequence may take
    # longer than the serving default timeout to pre-copy; the benchmark allows a minute.
    overrides: dict[str, Any] = {"timeout_s": 60.0, **({"max_stages": 1} if mode == "blocking" else {})}
    rep = ray.get(src.migrate_request.remote(rid, dst_name, dst, overrides, transport), timeout=600)
    if rep["committed"]:  # its first step on the destination must be in the step log
        _wait_decoding(ray, dst, rid, ray.get(dst.num_output_tokens.remote(rid)) + 1, timeout=120)
    time.sleep(0.5)
    src_log, dst_log = ray.get(src.step_log.remote(cpu=True)), ray.get(dst.step_log.remote(cpu=True))
    start, end = rep["start_time"], rep["end_time"]
    paused_at = rep["marks"].get("paused", end - rep["downtime"]) if rep["committed"] else end
    row: dict[str, Any] = {
        "transport": transport, "mode": mode, "committed": rep["committed"],
        "abort_reason": rep["abort_reason"], "downtime_s": rep["downtime"], "stages": rep["num_stages"],
        "blocks": rep["num_blocks"], "bytes": rep["num_bytes"], "duration_s": rep["duration"],
        "t0": start,  # the host's monotonic clock: the step windows below are relative to it
        # where the downtime went: seconds after the pause (same host: one monotonic clock)
        "last_stage_s": {k: v - paused_at for k, v in rep.get("marks", {}).items()} if rep["committed"] else {}}
    resumed = _resume(dst_log, paused_at) if rep["committed"] else None
    marked = rep.get("marks", {}).get("resumed") if rep["committed"] else None
    if arrivals:  # other requests join batches too: the driver's mark, not the batch that grew
        resumed = None if marked is None else (marked, marked)
    row["resume_s"] = None if resumed is None else resumed[0] - paused_at
    row["token_gap_s"] = None if resumed is None else resumed[1] - paused_at
    if marked is not None:  # the wait from the commit to the destination's first step with it
        steps = [(s, e, bool(x[2])) for s, e, *x in dst_log if len(x) > 2]
        # From the destination's install (its clock, same host): its first step with the
        # request may begin before the source hears the ack that ends the report, and a
        # step's start is stamped at the top of the serving loop, before its scheduler
        # admits what was installed meanwhile (up to a millisecond before the install):
        # such a request joined the very next step, a wait of 0.
        commit = min(rep["marks"].get("dst_queued", end), marked)
        row["wait"] = wait_row(paused_at, commit, marked, steps)
    row["src_step_before_s"] = _mean_step(src_log, start - WINDOW_S, start)
    for side, log, hi in (("src", src_log, paused_at), ("dst", dst_log, end)):
        span = hi - start
        # Only copies that overlap a step slow it: a live migration whose copy fits
        # between boundaries has no "during" steps on that side.
        copied = span > 0.01
        row[f"{side}_slowdown"] = _ratio(_step_time(log, start, hi) if copied else None,
                                         _step_time(log, start - WINDOW_S, start))
        # the same estimator and window lengths, ending where the migration starts
        row[f"{side}_control"] = _ratio(_step_time(log, start - span, start) if copied else None,
                                        _step_time(log, start - span - WINDOW_S, start - span))
        before = _mean_step(log, start - WINDOW_S, start)
        row[f"{side}_slowdown_overlap"] = _ratio(_mean_step(log, start, hi) if copied else None, before)
        row[f"{side}_control_overlap"] = _ratio(before, _mean_step(log, start - 2 * WINDOW_S, start - WINDOW_S))
        # CPU seconds of the step thread per step, inside the copy against before: a
        # ratio near 1 with a slowdown means the steps waited (for the GIL or a core)
        row[f"{side}_step_cpu_ratio"] = _ratio(_mean_cpu(log, start, hi), _mean_cpu(log, start - WINDOW_S, start))
        # the raw steps around it (seconds from the start, batch size), for re-analysis
        # (with the prefill flag, 1 if the step ran prefill work, the tokens it computed and
        # the decodes among them)
        row[f"{side}_steps"] = [(round(s - start, 4), round(e - start, 4), k, round(c, 4), int(bool(x and x[0])),
                                 *x[1:3]) for s, e, k, c, *x in log if e > start - span - 2 * WINDOW_S and s < end + 1.0]
    return row


def run_length(ray: Any, actors: dict[str, Any], length: int, transports: tuple[str, ...], repeats: int,
               salt: int, gap_s: float | None = None, feeder: ArrivalFeeder | None = None) -> list[dict[str, Any]]:
    names = ("src", "dst")
    # With arrivals the run is one long series of migrations: the requests must outlive it.
    max_bg, max_target = (6000, 3000) if feeder is None else (LONG_RUN_TOKENS, LONG_RUN_TOKENS)
    bg = {n: [f"bg-{length}-{n}-{i}" for i in range(CO_RUNNING)] for n in names}
    for k, (n, rids) in enumerate(bg.items()):
        for i, rid in enumerate(rids):
            ray.get(actors[n].add_request.remote(_req(rid, 64, max_bg, salt * 10 + k * CO_RUNNING + i)))
    target = f"t-{length}"
    ray.get(actors["src"].add_request.remote(_req(target, length - 16, max_target, salt)))
    _wait_decoding(ray, actors["src"], target)
    for n, rids in bg.items():
        for rid in rids:
            _wait_decoding(ray, actors[n], rid)
    rows, holder = [], "src"
    plan = [(t, "live") for t in transports for _ in range(repeats)] + [("tcp", "blocking")]
    expect = WINDOW_S  # how long a migration of this length takes, from the last one
    if feeder is not None:
        feeder.start()
    try:
        for transport, mode in plan:
            other = "dst" if holder == "src" else "src"
            row = migrate_once(ray, actors[holder], actors[other], other, target, transport, mode, expect,
                               gap_s=gap_s, arrivals=feeder is not None)
            expect = max(row["duration_s"] or 0.0, 0.5)
            row.update({"length": length, "from": holder})
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("_steps")}), flush=True)
            if row["committed"]:
                holder = other
    finally:
        if feeder is not None:
            feeder.stop()
    for n in names:
        for rid in bg[n] + [target]:
            ray.get(actors[n].abort.remote(rid))
    return rows


def recompute_time(ray: Any, dst: Any, length: int, salt: int) -> float:
    """Downtime of recompute: re-prefilling the whole sequence on the destination."""
    rid = f"recompute-{length}"
    ray.get(dst.add_request.remote(_req(rid, length, 1, salt)))
    deadline = time.time() + 300
    while ray.get(dst.num_output_tokens.remote(rid)) != -1 and time.time() < deadline:
        time.sleep(0.02)
    log = ray.get(dst.step_log.remote())
    return float(max(e - s for s, e, _ in log[-3:]))


def _choices(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...], int]:
    lengths: tuple[int, ...] = (256, 1024) if args.quick else LENGTHS
    env = os.environ.get("LLUMNIX_BENCH_LENGTHS")
    if env:
        lengths = tuple(int(x) for x in env.split(","))
    names = getattr(args, "transport", None) or os.environ.get("LLUMNIX_BENCH_TRANSPORTS") or ",".join(TRANSPORTS)
    transports = tuple(t.strip() for t in str(names).split(",") if t.strip())
    repeats = int(getattr(args, "repeats", None) or os.environ.get("LLUMNIX_BENCH_REPEATS") or 3)
    return lengths, transports, repeats


@dataclass(frozen=True)
class Scenario:
    """What ``--arrivals``, ``--gap`` and ``--chunked-prefill`` change (defaults: none of it)."""

    arrivals: Arrivals | None = None
    gap_s: float | None = None
    chunked_prefill: int = 0
    """Tokens a step at most with chunked prefill; 0: off (the paper's engine)."""
    seed: int = 0

    @staticmethod
    def from_args(args: argparse.Namespace) -> Scenario:
        spec, gap, chunk = (getattr(args, k, None) for k in ("arrivals", "gap", "chunked_prefill"))
        if gap is not None and not gap >= 0:
            raise LlumnixError(f"--gap must be >= 0 seconds, got {gap:g}")
        if chunk is not None and chunk < 0:
            raise LlumnixError(f"--chunked-prefill must be >= 0 tokens (0: off), got {chunk}")
        return Scenario(None if spec is None else Arrivals.parse(spec), gap, int(chunk or 0),
                        int(getattr(args, "seed", None) or 0))

    def engine(self, device: str) -> dict[str, Any]:
        # The co-running requests grow by a token per step for the whole run: on a GPU, whose
        # steps are several times faster, 512 MiB fills up before the longest lengths (and
        # so it does on a CPU in a long series of migrations with arrivals).
        big = str(device).startswith("cuda") or self.arrivals is not None
        out: dict[str, Any] = {"kv_cache_bytes": (2048 if big else 512) * 2**20, "max_num_seqs": 16,
                               "max_num_batched_tokens": 8192}
        if self.chunked_prefill:
            out.update(chunked_prefill=True, max_num_batched_tokens=self.chunked_prefill)
        return out

    def settings(self) -> dict[str, Any]:
        a = self.arrivals
        return {"arrivals": None if a is None else {"rate_per_instance_s": a.rate, "prompt_tokens": a.prompt,
                                                    "output_tokens": a.output, "seed": self.seed},
                "gap_s": self.gap_s, "chunked_prefill_tokens": self.chunked_prefill}


def _migration_config(args: argparse.Namespace, transports: tuple[str, ...]) -> dict[str, Any]:
    from llumnix.migration.transports import check_transport

    for t in transports:
        try:
            check_transport(t)
        except ValueError as e:
            raise LlumnixError(f"--transport: {e}") from None
    bulk_rate = getattr(args, "bulk_rate", None)
    if bulk_rate is not None and bulk_rate <= 0:
        raise LlumnixError(f"--bulk-rate must be > 0 MB/s, got {bulk_rate:g}")
    mig: dict[str, Any] = {"transport": "tcp", "transport_options": {"bulk_idle": bool(getattr(args, "bulk_idle", True))}}
    if bulk_rate:
        mig["transport_options"]["bulk_rate_bytes_per_s"] = bulk_rate * 1e6
    return mig


def main_migration_bench(args: argparse.Namespace) -> int:
    import ray

    from llumnix.cluster.instance_actor import InstanceActor
    from llumnix.cluster.launcher import check_gpu_capacity, instance_gpus, ray_gpus
    from llumnix.cluster.llumsched import LLUMSCHED_NAME, LlumSchedActor
    from llumnix.config.sections import LiveMigrationConfig
    from llumnix.policy import ReschedulingConfig, SchedulingConfig

    lengths, transports, repeats = _choices(args)
    mig = _migration_config(args, transports)
    scenario = Scenario.from_args(args)
    ray.init(num_cpus=2, include_dashboard=False, namespace="llumnix-bench", log_to_driver=False)
    token = b"bench-token"
    # (Ray's stubs do not know a decorated class's .options(): hence the ignores.)
    sched = LlumSchedActor.options(name=LLUMSCHED_NAME, num_cpus=0).remote(  # type: ignore[attr-defined]
        SchedulingConfig(rescheduling=ReschedulingConfig(enabled=False)), None, reschedule_interval_s=3600)
    ray.get(sched.cluster_info.remote())  # instances push status to it; the handle keeps it alive
    engine = {**scenario.engine(args.device), "device": args.device, "dtype": args.dtype,
              "cuda_graphs": args.cuda_graphs}
    # Both instances share one GPU when on CUDA: half a GPU each, so Ray pins them to it.
    gpus = instance_gpus(engine) / 2
    check_gpu_capacity(2, gpus, ray_gpus())
    actors = {n: InstanceActor.options(num_cpus=0, num_gpus=gpus).remote(  # type: ignore[attr-defined]
                  n, args.model, engine, None, LLUMSCHED_NAME, args.threads or 1, token, LiveMigrationConfig(**mig))
              for n in ("src", "dst")}
    ray.get([a.ready.remote() for a in actors.values()])
    rows, recompute, arrived = [], {}, {}
    for k, n in enumerate(lengths):
        feeder = None if scenario.arrivals is None else ArrivalFeeder(actors, scenario.arrivals, scenario.seed * 100 + k)
        rows += run_length(ray, actors, n, transports, repeats, salt=k, gap_s=scenario.gap_s, feeder=feeder)
        arrived[n] = None if feeder is None else len(feeder.sent)
        recompute[n] = recompute_time(ray, actors["dst"], n, salt=k)
    gc_stats = {n: ray.get(a.gc_stats.remote()) for n, a in actors.items()}
    ray.shutdown()
    result = summarize(rows, recompute, lengths, transports)
    result["gc"] = gc_stats  # full garbage collections in each instance over the whole run
    result.update({"benchmark": "migration", "model": args.model, "transports": list(transports),
                   "machine": machine_info(), "settings": {
                       "co_running_per_instance": CO_RUNNING, "torch_threads_per_instance": args.threads or 1,
                       "live_repeats_per_transport": repeats, "baseline_window_s": WINDOW_S,
                       "bulk_rate_mb_per_s": getattr(args, "bulk_rate", None),
                       "bulk_idle": mig["transport_options"]["bulk_idle"],
                       "gil_switch_interval_s": float(os.environ.get("LLUMNIX_GIL_SWITCH_S") or 0.005),
                       "gc_freeze": all(s["frozen"] > 0 for s in gc_stats.values()),
                       "engine": engine, "processes": "two Ray actors (separate processes) on this machine",
                       **scenario.settings(), "num_arrivals": arrived,
                       "note": "one long request per length, migrated back and forth; the blocking "
                               "copy (tcp) and recompute are single runs"}})
    out = write_result(Path(args.out) / "migration.json", result, quiet=True).parent
    _plot(result, out / "migration.png")
    _print(result)
    return 0


def _median(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def _pooled(rows: list[dict[str, Any]], key: str) -> list[float]:
    """``src_KEY`` and ``dst_KEY`` of every row, where measured."""
    return [r[k] for r in rows for k in (f"src_{key}", f"dst_{key}") if r.get(k) is not None]


def summarize(rows: list[dict[str, Any]], recompute: dict[int, float], lengths: tuple[int, ...],
              transports: tuple[str, ...]) -> dict[str, Any]:
    table = []
    for n in lengths:
        at = [r for r in rows if r["length"] == n]
        blk = [r for r in at if r["mode"] == "blocking"]
        entry: dict[str, Any] = {"length": n, "recompute_s": recompute[n],
                                 "blocking_downtime_s": blk[0]["downtime_s"] if blk else None,
                                 "src_decode_step_s": _median([r["src_step_before_s"] for r in at])}
        for t in transports:
            live = [r for r in at if r["mode"] == "live" and r["transport"] == t]
            ok = [r for r in live if r["committed"]]
            entry[t] = {
                "committed": f"{len(ok)}/{len(live)}",
                "downtime_s": _median([r["downtime_s"] for r in ok]),
                "downtime_samples_s": [r["downtime_s"] for r in ok],
                "resume_s": _median([r["resume_s"] for r in ok]),
                "token_gap_s": _median([r["token_gap_s"] for r in ok]),
                "stages": _median([r["stages"] for r in ok]),
                "duration_s": _median([r["duration_s"] for r in ok]),
                "slowdown_src": _median([r["src_slowdown"] for r in ok]),
                "slowdown_dst": _median([r["dst_slowdown"] for r in ok]),
            }
        table.append(entry)
    floors: dict[str, Any] = {}
    for t in transports:
        first, last = table[0][t], table[-1][t]
        live = [r for r in rows if r["mode"] == "live" and r["transport"] == t and r["committed"]]
        slow, ctrl = _pooled(live, "slowdown"), _pooled(live, "control")
        slow_o, ctrl_o = _pooled(live, "slowdown_overlap"), _pooled(live, "control_overlap")
        floors[t] = {
            "downtime_ratio_longest_over_shortest": _ratio(last["downtime_s"], first["downtime_s"]),
            "resume_ratio_longest_over_shortest": _ratio(last["resume_s"], first["resume_s"]),
            "recompute_over_live_at_longest": _ratio(table[-1]["recompute_s"], last["downtime_s"]),
            "co_running_slowdown_max": (max(slow) - 1.0) if slow else None,
            "co_running_slowdown_median": (statistics.median(slow) - 1.0) if slow else None,
            "control_no_migration_max": (max(ctrl) - 1.0) if ctrl else None,
            "control_no_migration_median": (statistics.median(ctrl) - 1.0) if ctrl else None,
            "co_running_slowdown_median_overlap_mean": (statistics.median(slow_o) - 1.0) if slow_o else None,
            "control_median_overlap_mean": (statistics.median(ctrl_o) - 1.0) if ctrl_o else None,
            "all_committed": all(r["committed"] for r in rows if r["transport"] == t),
        }
    waits = [r["wait"] for r in rows if r["mode"] == "live" and r.get("wait")]
    return {"table": table, "rows": rows, "floors": floors, "downtime_wait": summarize_waits(waits) if waits else None}


def _ms(seconds: float | None) -> float:
    """Milliseconds to plot; NaN (a gap in the line, never a 0) for a value not measured."""
    return math.nan if seconds is None else 1000 * seconds


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = r["table"]
    xs = [row["length"] for row in t]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in r["transports"]:
        ax.plot(xs, [_ms(row[name]["downtime_s"]) for row in t], marker="o", label=f"live, {name} (median)")
    ax.plot(xs, [_ms(row["tcp"]["resume_s"]) if "tcp" in row else math.nan for row in t], marker=".",
            linestyle=":", label="live tcp: pause -> first step on dst")
    ax.plot(xs, [_ms(row["blocking_downtime_s"]) for row in t], marker="s", label="blocking copy (tcp)")
    ax.plot(xs, [1000 * row["recompute_s"] for row in t], marker="^", label="recompute")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("downtime (ms)")
    ax.set_title(f"migration downtime, {r['model']}, two processes, CPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="live migration (median) vs blocking copy vs recompute (ms)")
    cols = ["length"] + [f"{n} {k}" for n in r["transports"] for k in ("down", "resume", "slow s/d")]
    for c in cols + ["blocking", "recompute", "src step"]:
        t.add_column(c, justify="right")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1000 * v:.1f}"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * (v - 1):+.0f}%"

    for row in r["table"]:
        cells = [str(row["length"])]
        for n in r["transports"]:
            x = row[n]
            cells += [ms(x["downtime_s"]), ms(x["resume_s"]), f"{pct(x['slowdown_src'])}/{pct(x['slowdown_dst'])}"]
        cells += [ms(row["blocking_downtime_s"]), ms(row["recompute_s"]), ms(row["src_decode_step_s"])]
        t.add_row(*cells)
    Console().print(t)
    Console().print(r["floors"])
