"""`llumnix serve`: a local (or joined) Ray cluster behind the OpenAI gateway."""
from __future__ import annotations

import argparse
import faulthandler
import ipaddress
import os
import signal
from typing import Any

import yaml

from llumnix.core.errors import LlumnixError


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
    p.add_argument("--config", help="YAML file with the system's model, engine, scheduling, migration and "
                   "deployment sections (benchmarks/configs/); flags override it")
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


FLAG_PATHS = {
    "model": "model", "instances": "deployment.instances", "dispatch": "scheduling.dispatch.policy",
    "prefix_affinity": "scheduling.dispatch.params.prefix",
    "prefix_slack": "scheduling.dispatch.params.prefix_slack",
    "prefix_slack_ratio": "scheduling.dispatch.params.prefix_slack_ratio",
    "migration": "scheduling.rescheduling.enabled",
    "migrate_out_threshold": "scheduling.rescheduling.out_threshold",
    "scale_out_below": "scheduling.scaling.scale_out_below", "scale_in_above": "scheduling.scaling.scale_in_above",
    "scaling_window": "scheduling.scaling.window_s", "scaling_cooldown": "scheduling.scaling.cooldown_s",
    "scaling_signal": "scheduling.scaling.signal", "reschedule_interval": "deployment.reschedule_interval_s",
    "transport": "migration.transport", "cms": "deployment.cms", "ray_address": "deployment.ray_address",
    "kv_cache_mib": "engine.kv_cache_bytes", "max_num_seqs": "engine.max_num_seqs",
    "chunked_prefill": "engine.chunked_prefill", "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "prefix_caching": "engine.enable_prefix_caching", "device": "engine.device",
    "cuda_graphs": "engine.cuda_graphs", "gpus_per_instance": "deployment.gpus_per_instance",
    "threads_per_instance": "deployment.threads_per_instance",
}
"""Each serve flag (its argparse dest) and the field of the system config it sets."""


def build_config(args: argparse.Namespace) -> Any:
    """The ``ClusterConfig`` of ``--config`` (a ``SystemConfig`` document) with the flags
    over it; a bad value is one line naming the flag, or the file's key, that gave it."""
    from llumnix.config import SystemConfig, SystemConfigError

    doc = _read_config(args.config) if args.config else {}
    flags = _flag_values(args, doc)
    for path, (_, value) in flags.items():
        _set_path(doc, path, value)
    try:
        system = SystemConfig.from_dict(doc)
        cfg = system.to_cluster_config()
    except SystemConfigError as e:
        flag = flags.get(e.path, (None,))[0]
        raise LlumnixError(f"{flag} {e.problem}" if flag else str(e)) from None
    _check_reachable_parts(system.model, system.deployment.cms)
    return cfg


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise LlumnixError(f"cannot read --config: {e}") from e
    except yaml.YAMLError as e:
        raise LlumnixError(f"--config {path} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict | None):
        raise LlumnixError(f"--config {path} must hold a mapping (model, engine, scheduling, migration, "
                           "deployment)")
    return doc or {}


def _flag_values(args: argparse.Namespace, doc: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The fields the given flags set: path -> (flag, value)."""
    out = {path: ("--" + dest.replace("_", "-"), getattr(args, dest))
           for dest, path in FLAG_PATHS.items() if getattr(args, dest) is not None}
    if args.kv_cache_mib is not None:
        out["engine.kv_cache_bytes"] = ("--kv-cache-mib", args.kv_cache_mib * 2**20)
    if args.migrate_out_threshold is not None:  # in_threshold rises with it, never below it
        old_in = _get_path(doc, "scheduling.rescheduling.in_threshold")
        value = max(args.migrate_out_threshold, old_in if isinstance(old_in, int | float) else 0)
        out["scheduling.rescheduling.in_threshold"] = ("--migrate-out-threshold", value)
    if args.scaling is not None:
        try:
            lo, hi = (int(x) for x in args.scaling.split(":"))
        except ValueError:
            raise LlumnixError(f"--scaling must be MIN:MAX (two integers), not {args.scaling!r}") from None
        for key, value in (("enabled", True), ("min_instances", lo), ("max_instances", hi)):
            out[f"scheduling.scaling.{key}"] = ("--scaling", value)
        if args.instances is None and _get_path(doc, "deployment.instances", doc.get("instances")) is None:
            out["deployment.instances"] = ("--scaling", lo)  # start at the minimum
    return out


def _get_path(doc: dict[str, Any], path: str, default: Any = None) -> Any:
    node: Any = doc
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set a field of the document; a section that is not a mapping is left for the
    config's own error."""
    *heads, last = path.split(".")
    node = doc
    for key in heads:
        if node.get(key) is None:
            node[key] = {}
        if not isinstance(node[key], dict):
            return
        node = node[key]
    node[last] = value


def _check_reachable_parts(model: str, cms: str | None) -> None:
    """What every instance actor would fail on, checked here in one line each instead of
    as actor tracebacks after Ray has started: the model path and the meta store."""
    from llumnix.cluster.meta_store import make_meta_store, redact_url
    from llumnix.model.loader import resolve_model_path

    resolve_model_path(model)
    if cms is None or cms == "memory":
        return
    try:
        store = make_meta_store(cms)
    except ValueError as e:
        raise LlumnixError(str(e)) from None
    try:
        store.ping()  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001 - redis raises its own connection errors
        raise LlumnixError(f"--cms: cannot reach {redact_url(cms)}: {type(e).__name__}") from None


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
