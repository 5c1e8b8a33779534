"""`llumnix profile`: measure the real engine and write a simulator profile.

The file follows ``llumnix-sim-profile/1`` (sim/profile.py), so ``llumnix simulate``
loads it as its latency model. Measured here, all as whole ``EngineCore.step()``
calls (schedule + forward + sample + update, the Python around the model included):

* prefill: one step admitting one prompt of n tokens, by n (median of ``reps``);
* decode: one decode step of b requests holding c context tokens in all, on a grid;
* KV: bytes of one block (all layers, K and V);
* migration, over the tcp transport between two engines stepping in this process:
  the copy (a linear fit of send time against bytes: fixed cost + bandwidth), the
  reservation round trip and the wait for a step boundary a pre-copy stage pays, and
  the downtime of committed live migrations.

The serving cluster runs each instance with ``threads_per_instance`` torch threads
(cluster/launcher.py: 1), as a Ray worker process, which Ray starts at nice 15
(its ``worker_niceness``): on a machine shared with other (niced) work an instance
keeps a smaller CPU share than a process at nice 0 would, so the profile is taken at
the same niceness (``--nice``). The default cluster runs two instances on a 2-core
machine, so an instance often steps while the other steps too, and then its decode
steps are slower (they stream the weights, and the two share memory bandwidth and
caches; a prefill computes and hardly slows). With ``neighbor`` on, a second engine
process is started that decodes a batch: the grid is measured with it paused (an
instance alone), then a few points with it paused and running in turn, interleaved;
their ratios are ``contention.neighbor_factor`` (prefill, decode), which the simulator
applies to a step that starts while another instance is stepping.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llumnix.core.sampling_params import SamplingParams
from llumnix.sim.profile import SCHEMA


@dataclass(frozen=True)
class ProfileGrid:
    """What to measure; the defaults cover the fidelity benchmark's cluster."""

    prefill_tokens: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 384)
    """Prompt lengths of the prefill table."""
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 24)
    """Batch sizes of the decode grid."""
    decode_contexts: tuple[int, ...] = (64, 256, 768)
    """Total context tokens of the decode grid (at least the batch size)."""
    reps: int = 2
    """Prefill repetitions per length and sweep (the median is kept)."""
    decode_steps: int = 6
    """Decode steps timed per grid point and sweep (the median is kept)."""
    passes: int = 2
    """Sweeps over the whole grid; each point keeps the median over sweeps."""
    fit: bool = False
    """Write the tables from a least-squares fit of the measured points (smooths noise).
    Off by default: a decode step of one request skips the attention mask and costs about
    half of one of two (a jump no line in the batch size follows), so the fit moved the
    one-request row by 30-40%."""
    migration_lengths: tuple[int, ...] = (32, 128, 512)
    """Prompt lengths of the migrated requests; empty: no migration measurement."""
    migration_repeats: int = 2
    """Live migrations per length."""
    co_running: int = 2
    """Requests decoding on each side while a migration runs."""
    contention_rounds: int = 8
    """Rounds of the neighbor measurement (each times every point alone and beside it)."""


QUICK_GRID = ProfileGrid(prefill_tokens=(4, 8, 16), decode_batches=(1, 2), decode_contexts=(4, 16), reps=1,
                         decode_steps=1, passes=1, migration_lengths=(20,), migration_repeats=1, co_running=1,
                         contention_rounds=2)
"""A grid for tests and smoke runs (seconds on a tiny model)."""


def synthetic_prompt(n: int, salt: int, vocab: int) -> list[int]:
    """``n`` ordinary token ids; prompts of different ``salt`` share no prefix."""
    lo = min(100, vocab // 4)
    return [lo + (i * 7919 + salt * 104729) % max(1, vocab - lo) for i in range(n)]


def _median_step(engine: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _num_output_tokens(engine: Any, request_id: str) -> int:
    return int(engine.requests[request_id].num_output_tokens)


def abort_all(engine: Any) -> None:
    """Abort every request the engine holds (between measurements)."""
    for rid in list(engine.requests):
        engine.abort_request(rid)


class _Salt:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def time_prefill(engine: Any, n: int, reps: int, vocab: int, salt: _Salt) -> float:
    """Median seconds of a step that prefills one prompt of ``n`` tokens."""
    times = []
    for _ in range(reps):
        engine.add_request(f"prefill-{salt()}", synthetic_prompt(n, salt.n, vocab), SamplingParams(max_tokens=1))
        times.append(_median_step(engine, 1))
        abort_all(engine)
    return statistics.median(times)


def decode_prompt_lens(batch: int, context: int, steps: int) -> list[int]:
    """Prompt lengths of a decode grid point: ``context`` tokens in all once the timed
    steps are half done, spread from 0.5x to 1.5x the mean. Real batches hold requests
    of different lengths, and the engine's attention takes a masked path when the
    contexts in a batch differ (a batch of equal lengths skips the mask and runs up to
    2-3x faster at batch 8 on CPU, which made the first profiles far too optimistic)."""
    mean = max(1.0, context / batch - steps / 2 - 1)
    if batch == 1:
        return [max(1, round(mean))]
    return [max(1, round(mean * (0.5 + i / (batch - 1)))) for i in range(batch)]


def time_decode(engine: Any, batch: int, context: int, steps: int, vocab: int, salt: _Salt) -> float:
    """Median seconds of a decode step of ``batch`` requests with ``context`` tokens in all
    (``decode_prompt_lens``: the timed steps straddle ``context``)."""
    params = SamplingParams(max_tokens=steps + 4, ignore_eos=True)
    for n in decode_prompt_lens(batch, context, steps):
        engine.add_request(f"decode-{salt()}", synthetic_prompt(n, salt.n, vocab), params)
    while any(r.num_output_tokens == 0 for r in engine.requests.values()):
        engine.step()  # every prefill first (several may share a step)
    t = _median_step(engine, steps)
    abort_all(engine)
    return t


def _median_of(passes: list[Any]) -> Any:
    """Element-wise median of equally shaped lists (or lists of lists)."""
    if isinstance(passes[0], list):
        return [_median_of(list(parts)) for parts in zip(*passes, strict=True)]
    return statistics.median(passes)


def measure_grid(engine: Any, grid: ProfileGrid, vocab: int) -> dict[str, Any]:
    """The prefill and decode tables: each point the median over ``passes`` sweeps of
    the whole grid (a neighbor's load that comes and goes hits the sweeps unevenly),
    then smoothed by a least-squares fit of the engine's cost model when ``fit``."""
    salt = _Salt()
    engine.add_request("warm-up", synthetic_prompt(16, 0, vocab), SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    contexts = list(grid.decode_contexts)
    sweeps = []
    for k in range(grid.passes):
        _progress(f"sweep {k + 1}/{grid.passes}: prefill")
        prefill = [time_prefill(engine, n, grid.reps, vocab, salt) for n in grid.prefill_tokens]
        _progress(f"sweep {k + 1}/{grid.passes}: decode")
        # A point whose context is below two tokens a request is taken at that minimum.
        decode = [[time_decode(engine, b, max(c, 2 * b), grid.decode_steps, vocab, salt) for c in contexts]
                  for b in grid.decode_batches]
        sweeps.append((prefill, decode))
    prefill = _median_of([p for p, _ in sweeps])
    decode = _median_of([d for _, d in sweeps])
    out: dict[str, Any] = {"raw": {"prefill_latency_s": prefill, "decode_latency_s": decode,
                                   "sweeps": [{"prefill": p, "decode": d} for p, d in sweeps]}}
    if grid.fit and len(grid.prefill_tokens) >= 3 and len(grid.decode_batches) * len(contexts) >= 3:
        prefill, decode, out["fit"] = fit_tables(grid, prefill, decode)
    out["prefill"] = {"num_tokens": list(grid.prefill_tokens), "latency_s": monotone(prefill)}
    out["decode"] = {"batch_sizes": list(grid.decode_batches), "context_tokens": contexts,
                     "latency_s": monotone_grid(decode)}
    return out


def fit_tables(grid: ProfileGrid, prefill: list[float],
               decode: list[list[float]]) -> tuple[list[float], list[list[float]], dict[str, Any]]:
    """The tables evaluated from least-squares fits (relative error) of
    prefill = p0 + p1 n + p2 n^2 and decode = d0 + d1 batch + d2 context
    (sim/latency.py's parametric model), and the fits' worst residuals."""
    from llumnix.sim.latency import fit_decode, fit_prefill

    p0, p1, p2 = fit_prefill(grid.prefill_tokens, [1e3 * t for t in prefill])
    pts = [(b, max(c, 2 * b), decode[i][j]) for i, b in enumerate(grid.decode_batches)
           for j, c in enumerate(grid.decode_contexts)]
    d0, d1, d2 = fit_decode([b for b, _, _ in pts], [c for _, c, _ in pts], [1e3 * t for _, _, t in pts])
    pre = [max(1e-6, p0 + p1 * n + p2 * n * n) for n in grid.prefill_tokens]
    dec = [[max(1e-6, d0 + d1 * b + d2 * c) for c in grid.decode_contexts] for b in grid.decode_batches]
    res_p = max(abs(f / t - 1) for f, t in zip(pre, prefill, strict=True))
    res_d = max(abs((d0 + d1 * b + d2 * c) / t - 1) for b, c, t in pts)
    return pre, dec, {"prefill_s": [p0, p1, p2], "decode_s": [d0, d1, d2],
                      "prefill_max_rel_residual": res_p, "decode_max_rel_residual": res_d}


def _progress(msg: str) -> None:
    print(f"  profile: {msg}", file=sys.stderr, flush=True)


def monotone(values: list[float]) -> list[float]:
    """Running maximum: more tokens never take less time, so a dip is noise. (The
    simulator extrapolates past the last knot along the last segment; a falling
    segment would extrapolate to negative latencies.)"""
    out, top = [], 0.0
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


def monotone_grid(rows: list[list[float]]) -> list[list[float]]:
    """``monotone`` along the context axis, then along the batch axis."""
    rows = [monotone(r) for r in rows]
    cols = [monotone(list(c)) for c in zip(*rows, strict=True)]
    return [list(r) for r in zip(*cols, strict=True)]


def measure_contention(engine: Any, vocab: int, neighbor: Neighbor, rounds: int = 8) -> dict[str, Any]:
    """Step times with the neighbor engine paused and running, interleaved round by
    round (alternating which goes first) so a drift of the machine's speed hits both
    alike: decode of 1 request at 128 context tokens and of 4 at 256, and a prefill of
    64 tokens. Their medians' ratios are the ``neighbor_factor`` the simulator applies
    to a step that starts while another instance steps: decode the geometric mean of
    the two decode points, prefill the prefill's."""
    salt = _Salt()
    points: dict[str, Callable[[], float]] = {
        "decode_1x128": lambda: time_decode(engine, 1, 128, 6, vocab, salt),
        "decode_4x256": lambda: time_decode(engine, 4, 256, 6, vocab, salt),
        "prefill_64": lambda: time_prefill(engine, 64, 2, vocab, salt),
    }
    samples: dict[str, dict[str, list[float]]] = {side: {k: [] for k in points} for side in ("alone", "busy")}
    for r in range(rounds):
        for busy in ((False, True) if r % 2 == 0 else (True, False)):
            if busy:
                neighbor.resume()
            else:
                neighbor.pause()
            time.sleep(0.2)  # let the neighbor's step (or its stop) take effect
            side = "busy" if busy else "alone"
            for name, measure in points.items():
                samples[side][name].append(measure())
    neighbor.resume()
    alone = {k: statistics.median(v) for k, v in samples["alone"].items()}
    beside = {k: statistics.median(v) for k, v in samples["busy"].items()}
    ratio = {k: beside[k] / alone[k] for k in points}
    decode = math.sqrt(ratio["decode_1x128"] * ratio["decode_4x256"])
    return {"rounds": rounds, "alone_s": alone, "with_neighbor_s": beside, "ratio": ratio,
            "neighbor_factor": {"prefill": ratio["prefill_64"], "decode": decode}}


# -- the busy neighbor -------------------------------------------------------------------
_NEIGHBOR = """
import sys, torch
torch.set_num_threads({threads})
from llumnix.llm import LLM
from llumnix.core.sampling_params import SamplingParams
llm = LLM({model!r}, device={device!r}, dtype={dtype!r}, kv_cache_bytes=64 * 2**20)
e = llm.engine
vocab = llm.loaded.config.vocab_size
k = 0
def refill():
    global k
    while len(e.requests) < {batch}:
        k += 1
        e.add_request(f"n{{k}}", [100 + (i * 31 + k) % (vocab - 100) for i in range(48)],
                      SamplingParams(max_tokens=64, ignore_eos=True))
refill()
e.step()
print("ready", flush=True)
while True:
    refill()
    e.step()
"""


class Neighbor:
    """A second engine process decoding ``batch`` requests until stopped."""

    def __init__(self, model: str, device: str, dtype: str, threads: int, batch: int = 4) -> None:
        code = _NEIGHBOR.format(threads=threads, model=model, device=device, dtype=dtype, batch=batch)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    def wait_ready(self, timeout: float = 300.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if line.strip() == "ready":
                return
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"the neighbor engine exited with {self.proc.returncode}")
        raise TimeoutError("the neighbor engine did not start")

    def pause(self) -> None:
        """Stop it from running (SIGSTOP): it keeps its memory and uses no CPU."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()  # a stopped process would not act on SIGTERM until continued
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- migration ---------------------------------------------------------------------------
def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of a least-squares line; a flat line through the mean when x
    does not vary."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


class _TimedSender:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.sends: list[tuple[int, float]] = []  # (bytes, seconds)

    def send(self, request_id: str, block_ids: list[int], source: Any, urgent: bool = False) -> bool:
        t0 = time.perf_counter()
        ok = bool(self.inner.send(request_id, block_ids, source, urgent=urgent))
        self.sends.append((source.nbytes, time.perf_counter() - t0))
        return ok

    def close(self) -> None:
        self.inner.close()


class _TimedDestination:
    def __init__(self, inner: Any, instance_id: str) -> None:
        self.inner = inner
        self.instance_id = instance_id
        self.reserves: list[float] = []

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        t0 = time.perf_counter()
        out = self.inner.try_reserve(request_id, num_blocks)
        self.reserves.append(time.perf_counter() - t0)
        return out  # type: ignore[no-any-return]

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        t0 = time.perf_counter()
        out = self.inner.try_reserve_with_cache(request_id, keys)
        self.reserves.append(time.perf_counter() - t0)
        return out  # type: ignore[no-any-return]

    def release(self, request_id: str) -> int:
        return int(self.inner.release(request_id))

    def install(self, snapshot: Any) -> float:
        return float(self.inner.install(snapshot))


def sibling_servers(llm: Any, instance_ids: tuple[str, ...]) -> list[Any]:
    """Started ``InstanceServer``s of engines configured as ``llm``'s, sharing its
    weights, each stepping in its own thread: instances to migrate between in one process."""
    from llumnix.cluster.instance import InstanceServer
    from llumnix.engine import EngineCore
    from llumnix.model import ModelExecutor
    from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig

    servers = []
    for iid in instance_ids:
        ex = ModelExecutor(llm.loaded.model, llm.executor.num_blocks, llm.executor.block_size,
                           device=llm.executor.device, dtype=llm.executor.dtype)
        eng = EngineCore(llm.config, ex, llm.executor.num_blocks, instance_id=iid,
                         eos_token_id=llm.tokenizer.eos_token_id)
        srv = InstanceServer(eng, Llumlet(iid, eng, ReschedulingConfig(), FreenessConfig()))
        srv.start()
        servers.append(srv)
    return servers


def _start_decoding(src: Any, rid: str, prompt: list[int], params: SamplingParams) -> None:
    """Add ``rid`` on ``src`` and wait until it has decoded two tokens (a running request
    with KV to move)."""
    src.call(functools.partial(src.engine.add_request, rid, prompt, params))
    deadline = time.time() + 300
    while src.call(functools.partial(_num_output_tokens, src.engine, rid)) < 2:
        if time.time() > deadline:
            raise TimeoutError(f"{rid} did not start decoding")
        time.sleep(0.01)


def measure_migration(llm: Any, grid: ProfileGrid) -> dict[str, Any]:
    """Live migrations over tcp between two engines (sharing the weights) stepping in
    their own threads, ``co_running`` requests decoding on each; returns the
    profile's ``migration`` section plus what it was fitted from."""
    from llumnix.migration import MigrationConfig
    from llumnix.migration.destination import DestinationEndpoint
    from llumnix.migration.driver import migrate
    from llumnix.migration.tcp_transport import KVSender
    from llumnix.migration.transport import TransportOptions

    token = b"profile"
    vocab = llm.loaded.config.vocab_size
    servers = sibling_servers(llm, ("src", "dst"))
    src, dst = servers
    # copies at nice 19, not SCHED_IDLE: both engines step without a pause here, and with a CI's
    # lint beside them on 2 cores an idle-class copy never ran before a try's request ended
    options = TransportOptions(bulk_idle=False)
    endpoint = DestinationEndpoint(dst, token, reservation_timeout_s=20.0, options=options)
    sender = _TimedSender(KVSender(endpoint.address, token, options))
    dest = _TimedDestination(endpoint, "dst")
    long_run = SamplingParams(max_tokens=256, ignore_eos=True)  # outlives a migration
    boundary: list[float] = []
    downtimes: list[float] = []
    stages: list[int] = []
    failed: list[str] = []
    k = 0
    try:
        for srv in servers:
            for _ in range(grid.co_running):
                k += 1
                rid, p = f"co-{k}", synthetic_prompt(32, k, vocab)
                srv.call(functools.partial(srv.engine.add_request, rid, p, long_run))
        for n in grid.migration_lengths:
            # a small model can finish the request mid-migration (on a loaded machine all three
            # 256-token tries did): it gets the room max_model_len leaves it, and more tries
            mig_run = SamplingParams(max_tokens=max(256, min(llm.config.max_model_len, 1024) - n), ignore_eos=True)
            for _ in range(grid.migration_repeats):
                for _attempt in range(6):
                    k += 1
                    rid, p = f"mig-{k}", synthetic_prompt(n, k, vocab)
                    _start_decoding(src, rid, p, mig_run)
                    t0 = time.perf_counter()
                    src.call(lambda: None)  # the wait for the source's next step boundary
                    boundary.append(time.perf_counter() - t0)
                    rep = migrate(rid, src, dest, sender, MigrationConfig())
                    dst.call(functools.partial(dst.engine.abort_request, rid))
                    src.call(functools.partial(src.engine.abort_request, rid))
                    if rep.committed and rep.downtime is not None:
                        downtimes.append(rep.downtime)
                        stages.append(rep.num_stages)
                        break
                    failed.append(str(rep.abort_reason) if not rep.committed else "committed without a downtime")
    finally:
        sender.close()
        endpoint.close()
        for srv in servers:
            srv.stop()
    if not downtimes or not sender.sends:
        raise RuntimeError(f"no live migration committed while profiling ({len(downtimes)} committed, "
                           f"{len(sender.sends)} sends; failed tries: {'; '.join(failed) or 'none'})")
    fixed, per_byte = _fit_line([float(b) for b, _ in sender.sends], [s for _, s in sender.sends])
    bandwidth = 1.0 / per_byte if per_byte > 0 else 1e12
    reserve = statistics.median(dest.reserves) if dest.reserves else 0.0
    wait = statistics.median(boundary)
    # A pre-copy stage: reserve on the destination (at its step boundary), copy, then
    # ask the source (at its boundary) what is left. The last stage is done at one
    # boundary with blocks reserved ahead, so its downtime is the measured one.
    overhead = max(0.0, fixed) + reserve + wait
    # The last stage's fixed cost: the measured downtime less the copy of the block or
    # so it sends (the request grows by at most a block between the stages' checks).
    downtime = statistics.median(downtimes)
    last = max(0.0, downtime - llm.executor.bytes_per_block / bandwidth)
    return {
        "bandwidth_bytes_per_s": bandwidth, "stage_overhead_s": overhead, "last_stage_overhead_s": last,
        "commit_s": 0.0, "decode_slowdown": 1.0,
        "measured": {"downtime_s": downtimes, "downtime_median_s": downtime,
                     "num_stages": stages, "send_fixed_s": fixed, "reserve_round_trip_s": reserve,
                     "step_boundary_wait_s": wait, "num_sends": len(sender.sends),
                     "transport": "tcp"},
    }


# -- the whole profile ---------------------------------------------------------------------
def build_profile(llm: Any, grid: ProfileGrid, *, model_name: str, device: str,
                  neighbor: Callable[[], Neighbor] | None = None, threads: int = 1) -> dict[str, Any]:
    """Measure ``llm``'s engine and return the profile document. With ``neighbor`` (a
    factory), the second engine is started and paused while the grid is measured (the
    grid is an instance stepping alone), then the neighbor factors are measured with it
    paused and running in turn (``measure_contention``)."""
    engine = llm.engine
    vocab = llm.loaded.config.vocab_size
    contention: dict[str, Any] = {"neighbor": neighbor is not None, "threads": threads, "grid": "alone"}
    if neighbor is not None:
        nb = neighbor()
        try:
            nb.wait_ready()
            nb.pause()
            tables = measure_grid(engine, grid, vocab)
            _progress("neighbor contention")
            contention.update(measure_contention(engine, vocab, nb, grid.contention_rounds))
        finally:
            nb.stop()
    else:
        tables = measure_grid(engine, grid, vocab)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "model": model_name, "device": device,
        "block_size": engine.kv.block_size, **tables,
        "kv": {"bytes_per_block": int(llm.executor.bytes_per_block)},
    }
    if grid.migration_lengths:
        doc["migration"] = measure_migration(llm, grid)
    else:  # no measurement: a copy as fast as memory, no fixed cost
        doc["migration"] = {"bandwidth_bytes_per_s": 1e10, "stage_overhead_s": 0.0}
    doc["contention"] = contention
    doc["grid"] = asdict(grid)
    return doc


def main_profile(args: argparse.Namespace) -> int:
    import torch

    from llumnix.bench.machine import machine_info
    from llumnix.llm import LLM
    from llumnix.sim.profile import profile_from_dict

    threads = args.threads or 1
    torch.set_num_threads(threads)
    if args.nice > os.nice(0):  # the neighbor process inherits it
        os.nice(args.nice - os.nice(0))
    grid = QUICK_GRID if args.quick else ProfileGrid()
    llm = LLM(args.model, device=args.device, dtype=args.dtype,
              num_blocks=max(256, 2 * max(grid.decode_contexts) // 16 + 64))
    print(f"llumnix profile: {llm.loaded.name} on {args.device}, {threads} thread(s)"
          f"{', a busy neighbor engine' if args.neighbor else ''} ...", flush=True)

    def start_neighbor() -> Neighbor:
        return Neighbor(args.model, args.device, args.dtype, threads)

    doc = build_profile(llm, grid, model_name=llm.loaded.name, device=args.device,
                        neighbor=start_neighbor if args.neighbor else None, threads=threads)
    doc["contention"]["nice"] = os.nice(0)
    doc["machine"] = machine_info()
    profile_from_dict(doc)  # what we write must load
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    pre, dec = doc["prefill"], doc["decode"]
    nf = doc["contention"].get("neighbor_factor", {})
    print(f"prefill {pre['num_tokens'][0]}..{pre['num_tokens'][-1]} tokens: "
          f"{1e3 * pre['latency_s'][0]:.1f}..{1e3 * pre['latency_s'][-1]:.1f} ms; decode batch 1: "
          f"{1e3 * dec['latency_s'][0][0]:.1f} ms, batch {dec['batch_sizes'][-1]}: "
          f"{1e3 * dec['latency_s'][-1][0]:.1f} ms; beside a stepping neighbor: prefill "
          f"x{nf.get('prefill', 1.0):.2f}, decode x{nf.get('decode', 1.0):.2f}")
    print(f"wrote {out}")
    return 0
