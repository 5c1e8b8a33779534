"""`llumnix serve`: a local (or joined) Ray cluster behind the OpenAI gateway."""
from __future__ import annotations

import argparse
import faulthandler
import ipaddress
import os
import signal
from typing import Any

import yaml

from llumnix.core.config import SchedulerConfig
from llumnix.core.errors import LlumnixError

CHUNKED_BUDGET = {"cpu": 256, "cuda": 2048}
"""Tokens a step computes with chunked prefill, unless told otherwise, by device.

CPU: SmolLM2 on this 2-core machine, 1 thread an instance. One engine, chats decoding while
1,000-token prompts arrive (benchmarks/chunked_prefill.py): the chats' P99 gap between
tokens 0.90 s against 3.30 s unchunked, the long prompts' TTFT 3.62 s against 3.57 s (128
tokens: 0.50 s, TTFT 4.04 s). The 2-instance cluster under ShareGPT-like lengths
(benchmarks/chunked_serve.sh, two seeds with long prompts): the longest stall 1.1-1.45 s
against 7.8-8.2 s, but more gaps of about a chunk step (P99 0.90 s against 0.22-0.29 s);
TTFT P99 8.7 / 7.9 s against 6.7-6.9 / 10.8 s: on a CPU a chunk step is no cheaper for
the decodes riding in it, so the stall is spread, not shrunk.
CUDA: vLLM's usual default, not measured here (no GPU lent since chunking landed)."""


def port(text: str) -> int:
    """An argparse type: a TCP port (0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_http_args(p: argparse.ArgumentParser, default_port: int) -> None:
    """The gateway's HTTP flags, the same for `serve` and `gateway`."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=default_port, help=f"port to listen on (default {default_port})")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on the API")
    p.add_argument("--admin-key", default=os.environ.get("LLUMNIX_ADMIN_KEY"),
                   help="require 'Authorization: Bearer KEY' on /admin/* (default: $LLUMNIX_ADMIN_KEY); "
                        "without one, drain and undrain are off and /admin/cluster is read-only")
    p.add_argument("--max-request-bytes", type=positive_int, default=8 << 20, metavar="N",
                   help="answer larger request bodies with a 413 before parsing them (default 8 MiB)")
    p.add_argument("--shutdown-grace", type=float, default=30.0, metavar="S",
                   help="on SIGTERM/Ctrl-C, stop taking requests and let running ones finish for up "
                        "to S seconds (default 30)")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file with ClusterConfig fields (flags override it)")
    p.add_argument("--model", default=None, help="'smollm2' (default), a .gguf file or an HF directory")
    p.add_argument("--instances", type=positive_int, default=None, help="instance actors (default 2)")
    _add_http_args(p, 8000)
    p.add_argument("--dispatch", default=None, help="llumnix | infaas++ | round-robin | random | "
                   "least-requests | power-of-two | llm-d")
    p.add_argument("--prefix-affinity", action=argparse.BooleanOptionalAction, default=None,
                   help="llumnix dispatch: send a prompt where its longest prefix was sent before, among "
                   "instances with at most max(4, 2 x its requests) more requests than the freest (default: "
                   "on with prefix caching and the llumnix policy)")
    p.add_argument("--prefix-slack", type=int, default=None, metavar="N",
                   help="prefix affinity: requests an instance may hold beyond the freest and still get a "
                   "prompt for its cached prefix (default 4)")
    p.add_argument("--prefix-slack-ratio", type=float, default=None, metavar="R",
                   help="prefix affinity: the slack is at least R x the freest's requests, so it grows with "
                   "load (default 2; 0: the fixed slack alone)")
    p.add_argument("--migration", action=argparse.BooleanOptionalAction, default=None,
                   help="continuous rescheduling by live migration (default on)")
    p.add_argument("--migrate-out-threshold", type=float, default=None,
                   help="instances with freeness below this migrate requests out (default 3)")
    p.add_argument("--scaling", default=None, metavar="MIN:MAX",
                   help="auto-scaling between MIN and MAX instances (default off)")
    p.add_argument("--scale-out-below", type=float, default=None,
                   help="add an instance when the average freeness over the window is below this (default 10)")
    p.add_argument("--scale-in-above", type=float, default=None,
                   help="drain and stop an instance when the average freeness is above this (default 60)")
    p.add_argument("--scaling-window", type=float, default=None, metavar="S",
                   help="seconds of freeness samples a scaling decision averages (default 10)")
    p.add_argument("--scaling-cooldown", type=float, default=None, metavar="S",
                   help="quiet seconds after a scaling action (default 30)")
    p.add_argument("--scaling-signal", default=None, choices=("mean", "cluster", "demand"),
                   help="average freeness as the mean of the instances' (mean), the summed "
                   "cluster's (cluster), or the summed cluster's with every queued request's "
                   "demand (demand)")
    p.add_argument("--reschedule-interval", type=float, default=None, metavar="S",
                   help="seconds between LlumSched's migration (and scaling) rounds (default 0.5)")
    p.add_argument("--transport", default=None,
                   help="KV transport for live migration: tcp (default), gloo or ray")
    p.add_argument("--cms", default=None, help="cluster meta store: memory (default) or redis://HOST:PORT")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting one")
    p.add_argument("--kv-cache-mib", type=positive_int, default=None, help="KV cache per instance (default 512)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="batch size limit per instance")
    p.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="prefill long prompts in chunks beside the running decodes, within "
                   "--max-num-batched-tokens a step (default: on)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None, metavar="N",
                   help="most tokens an instance computes in one step (default with chunked prefill: 256 on "
                   "cpu, 2048 on cuda; without: 4096); with chunked prefill at least --max-num-seqs")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share the KV of common prompt prefixes between requests on an instance (default: on)")
    p.add_argument("--device", default=None, help="cpu or cuda")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay decode steps from CUDA graphs, recorded at start (default: on with cuda)")
    p.add_argument("--gpus-per-instance", type=float, default=None, metavar="N",
                   help="GPUs Ray reserves per instance (default: 1 on cuda, 0 on cpu; 0.5 packs two per GPU)")
    p.add_argument("--threads-per-instance", type=positive_int, default=None,
                   help="torch threads of each instance (default 1)")


def build_config(args: argparse.Namespace) -> Any:
    from llumnix.cluster.launcher import ClusterConfig

    base: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config) as f:
                base = yaml.safe_load(f) or {}
        except OSError as e:
            raise LlumnixError(f"cannot read --config: {e}") from e
        except yaml.YAMLError as e:
            raise LlumnixError(f"--config {args.config} is not valid YAML: {' '.join(str(e).split())}") from None
        if not isinstance(base, dict):
            raise LlumnixError(f"--config {args.config} must hold a mapping of ClusterConfig fields")
        for key in ("engine", "scheduling", "migration"):
            if base.get(key) is not None and not isinstance(base[key], dict):
                raise LlumnixError(f"--config {args.config}: {key} must be a mapping, not {base[key]!r}")
        known = set(ClusterConfig.__dataclass_fields__)
        unknown = sorted(set(base) - known)
        if unknown:
            raise LlumnixError(f"unknown field {unknown[0]!r} in {args.config} (known: {', '.join(sorted(known))})")
    engine = dict(base.get("engine") or {})
    scheduling = dict(base.get("scheduling") or {})
    if args.kv_cache_mib is not None:
        engine["kv_cache_bytes"] = args.kv_cache_mib * 2**20
    if args.max_num_seqs is not None:
        engine["max_num_seqs"] = args.max_num_seqs
    if args.device is not None:
        engine["device"] = args.device
    if engine.get("device") is not None:
        _check_device(str(engine["device"]))
    if args.cuda_graphs is not None:
        if args.cuda_graphs and not str(engine.get("device") or "cpu").startswith("cuda"):
            raise LlumnixError("--cuda-graphs needs --device cuda")
        engine["cuda_graphs"] = args.cuda_graphs
    if args.chunked_prefill is not None:
        engine["chunked_prefill"] = args.chunked_prefill
    engine.setdefault("chunked_prefill", True)
    if args.max_num_batched_tokens is not None:
        engine["max_num_batched_tokens"] = args.max_num_batched_tokens
    if engine["chunked_prefill"]:
        device = str(engine.get("device") or "cpu").split(":")[0]
        engine.setdefault("max_num_batched_tokens", CHUNKED_BUDGET.get(device, CHUNKED_BUDGET["cuda"]))
        seqs = engine.get("max_num_seqs", SchedulerConfig.max_num_seqs)  # LLM's default
        if engine["max_num_batched_tokens"] < seqs:
            raise LlumnixError(f"with chunked prefill --max-num-batched-tokens ({engine['max_num_batched_tokens']}) "
                               f"must be at least --max-num-seqs ({seqs})")
    if args.prefix_caching is not None:
        engine["enable_prefix_caching"] = args.prefix_caching
    engine.setdefault("enable_prefix_caching", True)
    if args.gpus_per_instance is not None:
        if args.gpus_per_instance < 0:
            raise LlumnixError(f"--gpus-per-instance must be >= 0, got {args.gpus_per_instance:g}")
        base["gpus_per_instance"] = args.gpus_per_instance
    resched = dict(scheduling.get("rescheduling") or {})
    if args.migration is not None:
        resched["enabled"] = args.migration
    if args.migrate_out_threshold is not None:
        resched["out_threshold"] = args.migrate_out_threshold
        resched["in_threshold"] = max(args.migrate_out_threshold, resched.get("in_threshold", 0))
    if engine["enable_prefix_caching"]:
        # requests share prefix blocks: give up what frees the most per block moved (the
        # paper's order when nothing is shared; policy/selection.py)
        resched.setdefault("selection", "freed")
    if resched:
        scheduling["rescheduling"] = resched
    scaling = dict(scheduling.get("scaling") or {})
    if args.scaling is not None:
        try:
            lo, hi = (int(x) for x in args.scaling.split(":"))
        except ValueError:
            raise LlumnixError(f"--scaling must be MIN:MAX (two integers), not {args.scaling!r}") from None
        scaling.update(enabled=True, min_instances=lo, max_instances=hi)
        if args.instances is None and "instances" not in base:
            base["instances"] = lo
    for key, val in (("scale_out_below", args.scale_out_below), ("scale_in_above", args.scale_in_above),
                     ("window_s", args.scaling_window), ("cooldown_s", args.scaling_cooldown),
                     ("signal", args.scaling_signal)):
        if val is not None:
            scaling[key] = val
    if scaling:
        scheduling["scaling"] = scaling
    if args.transport is not None:
        from llumnix.migration.transports import check_transport

        try:
            check_transport(args.transport)
        except ValueError as e:
            raise LlumnixError(f"--transport: {e}") from None
        base["migration"] = {**(base.get("migration") or {}), "transport": args.transport}
    if args.reschedule_interval is not None:
        if args.reschedule_interval <= 0:
            raise LlumnixError("--reschedule-interval must be > 0")
        base["reschedule_interval_s"] = args.reschedule_interval
    if args.dispatch is not None:
        scheduling["dispatch"] = {**(scheduling.get("dispatch") or {}), "policy": args.dispatch}
    dispatch = dict(scheduling.get("dispatch") or {})
    params = dict(dispatch.get("params") or {})
    llumnix = dispatch.get("policy", "llumnix") == "llumnix"
    if args.prefix_affinity is not None:
        if not llumnix:
            raise LlumnixError(f"--prefix-affinity needs the llumnix dispatch policy, not {dispatch['policy']!r}")
        params["prefix"] = args.prefix_affinity
    elif llumnix and engine["enable_prefix_caching"] and "prefix" not in params and not params.get("shield"):
        params["prefix"] = True  # the caches are only worth as much as the hits dispatch finds them
    for flag, key, val in (("--prefix-slack", "prefix_slack", args.prefix_slack),
                           ("--prefix-slack-ratio", "prefix_slack_ratio", args.prefix_slack_ratio)):
        if val is None:
            continue
        if params.get("prefix") is not True:
            raise LlumnixError(f"{flag} needs prefix affinity (the llumnix policy with --prefix-affinity "
                               "or prefix caching on)")
        if not 0 <= val < float("inf"):
            raise LlumnixError(f"{flag} must be >= 0, got {val:g}")
        params[key] = val
    if params.get("prefix") is True:
        # the slack grows with load (benchmarks/sim/beyond.md: at light load as the fixed 4,
        # under load far more hits)
        params.setdefault("prefix_slack_ratio", 2.0)
    if params:
        dispatch["params"] = params
    if engine["enable_prefix_caching"]:
        # the prefix index (affinity, llm-d's prefix scorer) forgets what the engines
        # report evicted (benchmarks/sim/beyond.md)
        dispatch.setdefault("prefix_evictions", True)
    if dispatch:
        scheduling["dispatch"] = dispatch
    for key, val in (("model", args.model), ("instances", args.instances), ("cms", args.cms),
                     ("ray_address", args.ray_address), ("threads_per_instance", args.threads_per_instance)):
        if val is not None:
            base[key] = val
    if int(base.get("instances", 2)) < 1:
        raise LlumnixError("--instances must be >= 1")
    _check_reachable_parts(base)
    base["engine"], base["scheduling"] = engine, scheduling
    from llumnix.policy import SchedulingConfig

    sched = SchedulingConfig.from_dict(scheduling)  # fail fast on a bad policy name or field
    if sched.scaling.enabled and not (sched.scaling.min_instances <= int(base.get("instances", 2))
                                      <= sched.scaling.max_instances):
        raise LlumnixError(f"--instances {base.get('instances', 2)} is outside --scaling "
                           f"{sched.scaling.min_instances}:{sched.scaling.max_instances}")
    return ClusterConfig(**base)


def _check_device(device: str) -> None:
    """cpu, cuda or cuda:N: what an instance's engine can run on."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise LlumnixError(f"--device must be cpu, cuda or cuda:N, not {device!r}")


def _check_reachable_parts(cfg: dict[str, Any]) -> None:
    """What every instance actor would fail on, checked here in one line each instead of
    as actor tracebacks after Ray has started: the model path and the meta store."""
    from llumnix.cluster.meta_store import make_meta_store, redact_url
    from llumnix.model.loader import resolve_model_path

    resolve_model_path(str(cfg.get("model", "smollm2")))
    url = cfg.get("cms")
    if url is None or url == "memory":
        return
    try:
        store = make_meta_store(str(url))
    except ValueError as e:
        raise LlumnixError(str(e)) from None
    try:
        store.ping()  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001 - redis raises its own connection errors
        raise LlumnixError(f"--cms: cannot reach {redact_url(str(url))}: {type(e).__name__}") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main_serve(args: argparse.Namespace) -> int:
    from llumnix.cluster.launcher import start_cluster
    from llumnix.model import load_tokenizer

    cfg = build_config(args)
    # Tokenization happens at the gateway. Loading the tokenizer first also checks the model
    # file here, in one line, before any instance actor can fail on it inside Ray.
    tokenizer = load_tokenizer(cfg.model)
    print(f"llumnix serve: starting {cfg.instances} instance(s) of {cfg.model} on Ray ...", flush=True)
    cluster = start_cluster(cfg)
    return _run_gateway("llumnix serve", cluster, tokenizer, args)


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", required=True,
                   help="the Ray cluster `llumnix serve` runs on ('auto': the one on this machine)")
    p.add_argument("--namespace", default="llumnix", help="its Ray namespace (default llumnix)")
    p.add_argument("--model", default=None,
                   help="where to load the tokenizer from (default: the model the instances load)")
    _add_http_args(p, 8001)


def main_gateway(args: argparse.Namespace) -> int:
    """One more OpenAI gateway in front of a running cluster: it dispatches through the
    same LlumSched and reads only its own requests' outputs from the instances."""
    from llumnix.cluster.launcher import attach_cluster
    from llumnix.model import load_tokenizer

    cluster = attach_cluster(args.ray_address, args.namespace)
    model = args.model or cluster.info.get("model_source")
    if model is None:
        raise LlumnixError("the cluster does not say which model it runs; pass --model")
    tokenizer = load_tokenizer(model)
    return _run_gateway("llumnix gateway", cluster, tokenizer, args)


def _run_gateway(title: str, cluster: Any, tokenizer: Any, args: argparse.Namespace) -> int:
    import uvicorn

    from llumnix.cluster.backend import ClusterBackend
    from llumnix.gateway.app import build_app

    backend = ClusterBackend(cluster.llumsched, cluster.instances, cluster.info, tokenizer)
    app = build_app(backend, api_key=args.api_key, admin_key=args.admin_key,
                    admin_requires_key=not is_loopback(args.host), max_request_bytes=args.max_request_bytes)

    @app.on_event("startup")
    async def _start() -> None:
        await backend.start()

    @app.on_event("shutdown")
    async def _stop() -> None:
        await backend.stop()

    print(f"{title}: http://{args.host}:{args.port}/v1  (model '{backend.model_name}')\n"
          f"  try: curl http://{args.host}:{args.port}/v1/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{backend.model_name}\", \"messages\": [{{\"role\": \"user\", \"content\": "
          f"\"What is the capital of France?\"}}], \"max_tokens\": 30}}'", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                    timeout_graceful_shutdown=args.shutdown_grace)
    finally:
        cluster.shutdown()
    return 0
