"""`llumnix serve`: a local (or joined) Ray cluster behind the OpenAI gateway."""
from __future__ import annotations

import argparse
import faulthandler
import ipaddress
import os
import shlex
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml

from llumnix.cluster.serve_args import API_KEY_ENVS, flag_values, gateway_fields
from llumnix.cluster.serve_args import add_gateway_args as add_gateway_args  # tests import these from here
from llumnix.cluster.serve_args import add_serve_args as add_serve_args
from llumnix.cluster.startup import Progress, bind_port, serve_http
from llumnix.cluster.vllm_flags import check_vllm_flags
from llumnix.core.errors import LlumnixError
from llumnix.logging_setup import configure_logging


def build_config(args: argparse.Namespace) -> Any:
    """The ``ClusterConfig`` of ``--config`` (a ``SystemConfig`` document) with the flags
    over it; a bad value is one line naming the flag, or the file's key, that gave it."""
    return build_system(args)[1]


def build_system(args: argparse.Namespace) -> tuple[Any, Any]:
    """(``SystemConfig``, ``ClusterConfig``) of ``--config`` with the flags over it."""
    from llumnix.config import SystemConfig, SystemConfigError

    doc = _read_config(args.config) if args.config else {}
    for key in ("pools", "lite"):  # the gateway's (lite/serve.py), beside the deployment's
        doc.pop(key, None)
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
    return system, cfg


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
    out = flag_values(args)
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
    from llumnix.config.model_path import check_model_path

    check_model_path(model)
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
    from llumnix.lite.serve import main_lite, wants_lite, wants_mixed

    configure_logging(args.log_level)  # before Ray starts: its actors inherit the level
    if wants_lite(args) and not wants_mixed(args):  # --engine-url, or pools: in --config: engines we do not own
        return main_lite(args)

    progress = Progress("llumnix serve")
    system, cfg = build_system(args)  # no torch, no Ray: a bad flag or model path in a second
    for note in check_vllm_flags(args):
        progress(note)
    sock = bind_port(args.host, args.port)  # then the port: one in use fails now, not after the load
    engine = system.engine
    if engine.gpu_memory_utilization is not None and not engine.is_cuda:
        progress(f"--gpu-memory-utilization has no effect on {engine.device}: each instance's KV cache is "
                 f"--kv-cache-mib ({engine.kv_cache_bytes // 2**20} MiB)")
    progress(f"starting {cfg.instances} instance(s) of {cfg.model} on Ray ...")
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:
        # Tokenization happens at the gateway: its tokenizer loads while Ray starts and the
        # instances load their models (the model file's magic was checked above).
        loading = pool.submit(_tokenizer, cfg.model, system.deployment.chat_template)
        cluster = start_cluster(cfg, progress=lambda text: _say(progress, text, args, cfg.namespace))
        tokenizer = loading.result()
    return _run_gateway(progress, cluster, tokenizer, args, sock, system.deployment.served_model_name, cfg.model,
                        slo=system.scheduling.slo)


def _say(progress: Progress, text: str, args: argparse.Namespace, namespace: str) -> None:
    """The launcher's start-up lines; after Ray's, the command that attaches another gateway."""
    progress(text)
    if text.startswith("Ray "):
        from llumnix.cluster.launcher import ray_address

        extra = "".join(f" --{flag} {shlex.quote(value)}" for flag, value in (
            ("served-model-name", " ".join(args.served_model_name or ())), ("chat-template", args.chat_template))
            if value)
        port = args.port + 1 if 0 < args.port < 65535 else 0  # 0: any free port
        progress(f"attach another gateway with: llumnix gateway --ray-address {ray_address()} "
                 f"--namespace {namespace} --port {port}{extra}")


def _tokenizer(model: str, chat_template: str | None) -> Any:
    from llumnix.model import load_tokenizer

    tokenizer = load_tokenizer(model, chat_template=chat_template)
    import llumnix.cluster.gateway_client  # noqa: F401 - the gateway's modules (FastAPI, pydantic
    import llumnix.gateway.app  # noqa: F401 - schemas: ~1 s) import here too, while the instances load
    return tokenizer


def main_gateway(args: argparse.Namespace) -> int:
    """One more OpenAI gateway in front of a running cluster: it dispatches through the
    same LlumSched and reads only its own requests' outputs from the instances."""
    from llumnix.cluster.launcher import attach_cluster
    from llumnix.cluster.serve_args import read_chat_template, served_model_name

    configure_logging(args.log_level)
    progress = Progress("llumnix gateway")
    sock = bind_port(args.host, args.port)
    template = None if args.chat_template is None else read_chat_template(args.chat_template)
    name = served_model_name(args)
    cluster = attach_cluster(args.ray_address, args.namespace)
    progress(f"joined the cluster at {args.ray_address} (namespace {args.namespace}): "
             f"{len(cluster.instances)} instance(s)")
    model = args.model or cluster.info.get("model_source")
    if model is None:
        raise LlumnixError("the cluster does not say which model it runs; pass --model")
    return _run_gateway(progress, cluster, _tokenizer(model, template), args, sock, name, model)


def _run_gateway(progress: Progress, cluster: Any, tokenizer: Any, args: argparse.Namespace, sock: Any,
                 served_name: str | None, root: str, slo: Any = None) -> int:
    """The OpenAI gateway over ``cluster`` on ``sock``, until SIGINT/SIGTERM; ``root`` is
    the model the served name stands for. With an internal pool in ``--config``, the
    cluster is that pool of a ``MixedBackend``."""
    from llumnix.cluster.gateway_client import ClusterBackend
    from llumnix.gateway.app import build_app
    from llumnix.lite.serve import wants_mixed

    info = dict(cluster.info)
    if served_name is not None:
        info["model"] = served_name
    backend: Any = ClusterBackend(cluster.llumsched, cluster.instances, info, tokenizer)
    app_kw = {"admin_requires_key": not is_loopback(args.host), "model_root": root, **gateway_fields(args)}
    if slo is not None:  # the system's SLO classes (`llumnix gateway` knows only the defaults)
        app_kw["slo"] = slo
    if wants_mixed(args):  # the instances as one pool beside the config file's external ones
        from llumnix.lite.app import lite_app
        from llumnix.lite.serve import build_mixed

        backend = build_mixed(args, backend)
        app = lite_app(backend, **app_kw)
    else:
        app = build_app(backend, **app_kw)
        app.router.on_startup.append(backend.start)
        app.router.on_shutdown.append(backend.stop)

    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"

    def ready() -> None:
        progress(f"ready in {progress.elapsed_s:.1f} s: {url}/v1  (model '{backend.model_name}')\n"
                 f"  try: {try_command(url, backend.model_name, args.api_key)}")

    def on_sigterm(*_: Any) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack
    try:
        try:
            serve_http(app, sock, args.uvicorn_log_level, args.shutdown_grace, ready)
        finally:
            cluster.shutdown()
    except Terminated:  # uvicorn re-raises the SIGTERM it stopped on, after its graceful shutdown
        pass
    return 0  # SIGTERM is how a supervisor (make, systemd, Kubernetes) asks for a clean stop


class Terminated(Exception):
    """SIGTERM: a clean stop, exit 0 (Ctrl-C stays a KeyboardInterrupt, exit 130)."""


def try_command(url: str, model: str, api_key: str | None) -> str:
    """The curl line printed at ready: with the key's header when the API needs one
    (the key itself only where it was on the command line; from the environment it stays
    in ``$LLUMNIX_API_KEY``)."""
    auth = ""
    if api_key:
        env = next((e for e in API_KEY_ENVS if os.environ.get(e) == api_key), None)
        auth = f' -H "Authorization: Bearer ${env}"' if env else " -H " + shlex.quote(f"Authorization: Bearer {api_key}")
    return (f"curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", "
            f"\"content\": \"What is the capital of France?\"}}], \"max_tokens\": 30, \"temperature\": 0}}'")
