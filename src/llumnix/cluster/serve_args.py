"""`llumnix serve` and `llumnix gateway` flags: ours, and vLLM's names wherever the meaning
is the same, so a `vllm serve` command line starts `llumnix serve` unchanged.

Each flag that sets a field of the system config is named in ``FLAG_PATHS``; the gateway's
own flags (keys, logs, limits) go to ``GatewayConfig`` through ``gateway_fields``.
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from llumnix.cluster.vllm_flags import add_vllm_compat_args, check_vllm_flags
from llumnix.config.sections import WEIGHT_FORMATS
from llumnix.core.errors import LlumnixError
from llumnix.logging_setup import LEVEL_ENV, LOG_LEVELS

API_KEY_ENVS = ("LLUMNIX_API_KEY", "VLLM_API_KEY")
"""Where the API key is read from when --api-key is not given (so it need not show in `ps`)."""
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
VLLM_DTYPES = {"auto": None, "half": "float16", "float16": "float16", "bfloat16": "bfloat16",
               "float": "float32", "float32": "float32"}
"""vLLM's --dtype values and our engine's dtype (auto: the engine's default, float32)."""


def port(text: str) -> int:
    """An argparse type: a TCP port (0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


def bytes_or_auto(text: str) -> int | str:
    """An argparse type: 'auto' or an integer >= 1."""
    return "auto" if text == "auto" else positive_int(text)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def human_int(text: str) -> int:
    """An argparse type: vLLM's --max-model-len, a positive integer with an optional
    k/m/g (powers of 1000) or K/M/G (powers of 1024) suffix: 32k, 4K."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgKMG]?)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (say 4096, 4k or 4K)")
    unit = m.group(2)
    scale = (1000 if unit.islower() else 1024) ** ("kmg".index(unit.lower()) + 1) if unit else 1
    value = int(float(m.group(1)) * scale)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value:g}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value:g}")
    return value


def pace_spec(text: str) -> tuple[str, float | None]:
    """An argparse type: ``MODEL[:SCALE]`` (a SCALE that is not a number is part of MODEL,
    a path's colon; the config checks both)."""
    model, sep, tail = text.rpartition(":")
    if sep and model:
        try:
            return model, float(tail)
        except ValueError:
            pass
    return text, None


def _add_http_args(p: argparse.ArgumentParser, default_port: int) -> None:
    """The gateway's flags, the same for `serve` and `gateway`."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=default_port, help=f"port to listen on (default {default_port})")
    p.add_argument("--api-key", default=next((os.environ[e] for e in API_KEY_ENVS if os.environ.get(e)), None),
                   help="require 'Authorization: Bearer KEY' on the API (default: $LLUMNIX_API_KEY, "
                        "else $VLLM_API_KEY)")
    p.add_argument("--admin-key", default=os.environ.get("LLUMNIX_ADMIN_KEY"),
                   help="require 'Authorization: Bearer KEY' on /admin/* (default: $LLUMNIX_ADMIN_KEY); "
                        "without one, drain and undrain are off and /admin/cluster is read-only")
    p.add_argument("--max-request-bytes", type=bytes_or_auto, default="auto", metavar="N",
                   help="answer larger request bodies with a 413 before parsing them (default auto: 64 "
                        "bytes a token of --max-model-len, at least 512 KiB)")
    p.add_argument("--http-read-timeout", type=float, default=30.0, metavar="S",
                   help="close a connection whose request (headers and body) has not arrived S seconds "
                        "after its first byte (default 30)")
    p.add_argument("--private-metrics", action="store_true",
                   help="/metrics, /docs, /redoc and /openapi.json need the API key too")
    p.add_argument("--fair-share", type=positive_int, default=None, metavar="N",
                   help="serve at most N choices at once from this gateway; the rest wait in a per-client "
                        "fair queue (virtual token counters; the client is the request's 'user', else its "
                        "address). Default: off, every request goes at once")
    p.add_argument("--shutdown-grace", type=float, default=30.0, metavar="S",
                   help="on SIGTERM/Ctrl-C, stop taking requests and let running ones finish for up "
                        "to S seconds (default 30)")
    p.add_argument("--log-level", default=os.environ.get(LEVEL_ENV, "info"), choices=LOG_LEVELS,
                   help="Llumnix's log level in this process, LlumSched and the instances (default info; "
                        "other libraries log at warning)")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="no log line per finished request")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="no throughput line while requests are served")
    p.add_argument("--log-stats-interval", type=positive_float, default=10.0, metavar="S",
                   help="seconds between the throughput lines while requests are served (default 10)")
    p.add_argument("--uvicorn-log-level", default="warning", choices=UVICORN_LOG_LEVELS,
                   help="uvicorn's log level (default warning; info logs every HTTP request)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model's name in the API (default: smollm2, the GGUF file's stem or the "
                        "directory's name); one name")
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a Jinja chat template, as a file or inline, instead of the model's own")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    from llumnix.lite.serve import add_lite_args

    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as `vllm serve MODEL` takes it (same as --model)")
    add_lite_args(p)
    p.add_argument("--config", help="YAML file with the system's model, engine, scheduling, migration and "
                   "deployment sections (benchmarks/configs/); flags override it")
    p.add_argument("--model", default=None, help="'smollm2' (default), a .gguf file or an HF directory")
    p.add_argument("--instances", type=positive_int, default=None, help="instance actors (default 2)")
    _add_http_args(p, 8000)
    _add_scheduling_args(p)
    _add_engine_args(p)
    add_vllm_compat_args(p)


def _add_scheduling_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--pd", default=None, choices=("off", "static", "adaptive"),
                   help="prefill-decode disaggregation: off (every instance prefills and decodes; default), "
                   "static (the first --prefill-instances take new requests and hand each off to a decode "
                   "instance after its first token) or adaptive (LlumSched also moves instances between the "
                   "roles with the load)")
    p.add_argument("--prefill-instances", type=positive_int, default=None, metavar="N",
                   help="PD: instances started as prefill instances, the rest decode (default 1); alone it "
                   "means --pd static")
    p.add_argument("--reschedule-interval", type=float, default=None, metavar="S",
                   help="seconds between LlumSched's periodic migration (and scaling) rounds (default 0.5)")
    p.add_argument("--reschedule-trigger-gap", type=_trigger_gap, default=None, metavar="S|off",
                   help="a status that makes an instance a migration source starts a rescheduling pass at "
                   "once, passes at least S seconds apart (default 0.03); off: the periodic rounds only")
    p.add_argument("--transport", default=None,
                   help="KV transport for live migration: tcp (default), gloo or ray")
    p.add_argument("--cms", default=os.environ.get("LLUMNIX_CMS") or None,
                   help="cluster meta store: memory (default) or redis://[:PASSWORD@]HOST:PORT (default: "
                        "$LLUMNIX_CMS, which keeps a password out of ps)")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting one")


def _trigger_gap(value: str) -> float | str:
    if value == "off":
        return value
    try:
        gap = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither seconds nor 'off'") from None
    if not gap >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds or 'off', got {value}")
    return gap


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache-mib", type=positive_int, default=None, help="KV cache per instance (default 512)")
    p.add_argument("--gpu-memory-utilization", type=fraction, default=None, metavar="F",
                   help="on cuda: the share of the device's memory an instance may use, its KV cache "
                   "sized from what the weights, graphs and activations leave (instead of --kv-cache-mib); "
                   "no effect on cpu")
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="batch size limit per instance")
    p.add_argument("--block-size", type=positive_int, default=None, metavar="N",
                   help="tokens per KV block (default 16)")
    p.add_argument("--num-gpu-blocks-override", type=positive_int, default=None, metavar="N",
                   help="KV blocks per instance, instead of sizing the cache from --kv-cache-mib (vLLM's name; "
                   "cpu too)")
    p.add_argument("--max-model-len", type=human_int, default=None, metavar="N",
                   help="longest sequence, prompt and output (default: the model's context; 4k = 4000, "
                   "4K = 4096)")
    p.add_argument("--chunked-prefill", "--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="prefill long prompts in chunks beside the running decodes, within "
                   "--max-num-batched-tokens a step (default: on)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None, metavar="N",
                   help="most tokens an instance computes in one step (default with chunked prefill: 256 on "
                   "cpu, 2048 on cuda; without: 4096); with chunked prefill at least --max-num-seqs")
    p.add_argument("--prefix-caching", "--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None, help="share the KV of common prompt prefixes between requests on an "
                   "instance (default: on)")
    p.add_argument("--device", default=None, help="cpu or cuda")
    p.add_argument("--dtype", default=None, choices=tuple(VLLM_DTYPES),
                   help="weights and KV cache (default float32; auto: the default)")
    p.add_argument("--weight-format", default=None, choices=WEIGHT_FORMATS,
                   help="CPU weights: fp32 (exact, default) or packed once at load for torch's weight-only "
                        "kernels (benchmarks/engine_speed.md)")
    p.add_argument("--seed", type=int, default=None, help="seed of each instance's sampling RNG (default 0)")
    p.add_argument("--pace", type=pace_spec, default=None, metavar="MODEL[:SCALE]",
                   help="evaluation only, never for serving: hold every engine step to the time this latency "
                   "model (a10-llama7b-serving, a10-llama7b or a profile JSON: the simulator's) gives its batch, "
                   "times SCALE (default 1), so instances sharing a CPU behave as if each had its own device")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay decode steps from CUDA graphs, recorded at start (default: on with cuda)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (vLLM's; = --no-cuda-graphs)")
    p.add_argument("--gpus-per-instance", type=float, default=None, metavar="N",
                   help="GPUs Ray reserves per instance (default: 1 on cuda, 0 on cpu; 0.5 packs two per GPU)")
    p.add_argument("--threads-per-instance", type=positive_int, default=None,
                   help="torch threads of each instance (default 1)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM command lines: no code from a model directory is ever run")
    p.add_argument("-tp", "--tensor-parallel-size", type=positive_int, default=1, metavar="N",
                   help="only 1: an instance runs on one device (more instances: --instances)")
    p.add_argument("-pp", "--pipeline-parallel-size", type=positive_int, default=1, metavar="N",
                   help="only 1: an instance runs on one device (more instances: --instances)")


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", required=True,
                   help="the Ray cluster `llumnix serve` runs on, as `llumnix serve` prints it ('auto': "
                   "the one on this machine)")
    p.add_argument("--namespace", default="llumnix", help="its Ray namespace (default llumnix)")
    p.add_argument("--model", default=None,
                   help="where to load the tokenizer from (default: the model the instances load)")
    _add_http_args(p, 8001)


FLAG_PATHS = {
    "instances": "deployment.instances", "dispatch": "scheduling.dispatch.policy",
    "prefix_affinity": "scheduling.dispatch.params.prefix",
    "prefix_slack": "scheduling.dispatch.params.prefix_slack",
    "prefix_slack_ratio": "scheduling.dispatch.params.prefix_slack_ratio",
    "migration": "scheduling.rescheduling.enabled",
    "migrate_out_threshold": "scheduling.rescheduling.out_threshold",
    "scale_out_below": "scheduling.scaling.scale_out_below", "scale_in_above": "scheduling.scaling.scale_in_above",
    "scaling_window": "scheduling.scaling.window_s", "scaling_cooldown": "scheduling.scaling.cooldown_s",
    "scaling_signal": "scheduling.scaling.signal", "pd": "scheduling.pd.mode",
    "prefill_instances": "scheduling.pd.prefill_instances", "reschedule_interval": "deployment.reschedule_interval_s",
    "transport": "migration.transport", "cms": "deployment.cms", "ray_address": "deployment.ray_address",
    "kv_cache_mib": "engine.kv_cache_bytes", "max_num_seqs": "engine.max_num_seqs",
    "block_size": "engine.block_size", "num_gpu_blocks_override": "engine.num_blocks",
    "chunked_prefill": "engine.chunked_prefill", "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "prefix_caching": "engine.enable_prefix_caching", "device": "engine.device",
    "cuda_graphs": "engine.cuda_graphs", "gpus_per_instance": "deployment.gpus_per_instance",
    "threads_per_instance": "deployment.threads_per_instance", "max_model_len": "engine.max_model_len",
    "seed": "engine.seed", "gpu_memory_utilization": "engine.gpu_memory_utilization",
    "weight_format": "engine.weight_format",
}
"""Each serve flag (its argparse dest) whose value is a field of the system config as it is."""


def flag_values(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The system config's fields the flags set, path -> (flag, value); the flags whose
    value needs a conversion (and the refusals) here too."""
    check_supported(args)
    out = {path: ("--" + dest.replace("_", "-"), getattr(args, dest))
           for dest, path in FLAG_PATHS.items() if getattr(args, dest) is not None}
    if (model := model_arg(args)) is not None:
        out["model"] = ("--model", model)
    if args.kv_cache_mib is not None:
        out["engine.kv_cache_bytes"] = ("--kv-cache-mib", args.kv_cache_mib * 2**20)
    if args.dtype is not None and VLLM_DTYPES[args.dtype] is not None:
        out["engine.dtype"] = ("--dtype", VLLM_DTYPES[args.dtype])
    if args.enforce_eager:
        if args.cuda_graphs:
            raise LlumnixError("--enforce-eager and --cuda-graphs contradict each other")
        out["engine.cuda_graphs"] = ("--enforce-eager", False)
    if (name := served_model_name(args)) is not None:
        out["deployment.served_model_name"] = ("--served-model-name", name)
    if args.reschedule_trigger_gap is not None:
        gap = args.reschedule_trigger_gap
        out["scheduling.rescheduling.trigger_gap_s"] = ("--reschedule-trigger-gap", None if gap == "off" else gap)
    if args.prefill_instances is not None and args.pd is None:
        out["scheduling.pd.mode"] = ("--prefill-instances", "static")
    if args.pace is not None:
        out["engine.pace.model"] = ("--pace", args.pace[0])
        if args.pace[1] is not None:
            out["engine.pace.scale"] = ("--pace SCALE", args.pace[1])
    if args.chat_template is not None:
        out["deployment.chat_template"] = ("--chat-template", read_chat_template(args.chat_template))
    return out


def check_supported(args: argparse.Namespace) -> None:
    """vLLM's flags that have no meaning here are one line, not a start that ignores them
    (``vllm_flags``)."""
    check_vllm_flags(args)
    for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size),
                        ("--pipeline-parallel-size", args.pipeline_parallel_size)):
        if value > 1:
            raise LlumnixError(f"{flag} {value} is not supported: each instance runs on one device "
                               "(serve more instances with --instances N)")


def model_arg(args: argparse.Namespace) -> str | None:
    """The model given as `serve MODEL` or `--model MODEL` (the same one if both)."""
    tag = getattr(args, "model_tag", None)
    if tag is not None and args.model is not None and tag != args.model:
        raise LlumnixError(f"two models given: {tag!r} and --model {args.model!r}")
    model = tag if tag is not None else args.model
    return None if model is None else str(model)


def served_model_name(args: argparse.Namespace) -> str | None:
    names = args.served_model_name
    if not names:
        return None
    if len(names) > 1:
        raise LlumnixError(f"--served-model-name takes one name here, not {len(names)} ({' '.join(names)})")
    return str(names[0])


def read_chat_template(value: str) -> str:
    """vLLM's rule: a path to a file holding the template, or the template itself (it
    holds '{', '}' or a newline); anything else is a file that is not there."""
    path = Path(value).expanduser()
    try:
        if path.is_file():
            return path.read_text()
    except OSError as e:
        raise LlumnixError(f"--chat-template: cannot read {value}: {e.strerror or e}") from None
    if any(c in value for c in "{}\n"):
        return value
    raise LlumnixError(f"--chat-template: {value!r} is neither a file nor a template")


def gateway_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``GatewayConfig`` fields the gateway flags set."""
    return {"api_key": args.api_key, "admin_key": args.admin_key, "max_request_bytes": args.max_request_bytes,
            "log_requests": not args.disable_log_requests, "log_stats": not args.disable_log_stats,
            "log_stats_interval_s": args.log_stats_interval, "http_read_timeout_s": args.http_read_timeout,
            "private_docs_and_metrics": args.private_metrics, "fair_share": args.fair_share}
