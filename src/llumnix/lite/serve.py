"""Lite mode from the command line: ``llumnix serve --engine-url URL [--engine-url URL ...]
[--model NAME]``, or ``llumnix serve --config FILE`` whose file has a ``pools:`` section
(and optionally ``lite:`` settings and ``scheduling.dispatch``). Also runnable alone as
``python -m llumnix.lite`` with the same flags. No Ray: the gateway and LlumSched's
dispatch run in this process, in front of engines it does not own."""
from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import yaml

from llumnix.config.fields import SystemConfigError
from llumnix.core.errors import LlumnixError
from llumnix.lite.config import LiteConfig, from_doc, from_urls
from llumnix.logging_setup import configure_logging

ENGINE_API_KEY_ENV = "LLUMNIX_ENGINE_API_KEY"
"""Where ``--engine-api-key`` is read from when not given (so it need not show in `ps`)."""


def add_lite_args(p: argparse.ArgumentParser) -> None:
    """The flags `llumnix serve` adds for lite mode."""
    p.add_argument("--engine-url", action="append", default=None, metavar="URL",
                   help="lite mode: serve from this OpenAI-compatible engine (vLLM, SGLang, llama.cpp's "
                        "server, another llumnix serve), repeatable; no local instances are started")
    p.add_argument("--engine-api-key", default=os.environ.get(ENGINE_API_KEY_ENV) or None, metavar="KEY",
                   help="lite mode: sent as 'Authorization: Bearer KEY' to every --engine-url (and to each "
                        f"endpoint of --config that names no api_key; default: ${ENGINE_API_KEY_ENV})")


def wants_lite(args: argparse.Namespace) -> bool:
    """``--engine-url`` given, or a config file with a ``pools:`` section."""
    return bool(getattr(args, "engine_url", None)) or "pools" in _read_doc(getattr(args, "config", None))


def wants_mixed(args: argparse.Namespace) -> bool:
    """A config file whose ``pools:`` include an internal one (our own instances beside
    external endpoints), and no ``--engine-url``."""
    pools = _read_doc(getattr(args, "config", None)).get("pools")
    return not getattr(args, "engine_url", None) and isinstance(pools, list) and \
        any(isinstance(p, dict) and p.get("internal") is True for p in pools)


def _read_doc(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise LlumnixError(f"cannot read --config: {e}") from None
    except yaml.YAMLError as e:
        raise LlumnixError(f"--config {path} is not valid YAML: {' '.join(str(e).split())}") from None
    return doc if isinstance(doc, dict) else {}


def served_name(model: str) -> str:
    """The name a model spec is served as (the loader's: 'smollm2', a file's stem, a directory's name)."""
    if model == "smollm2":
        return model
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def lite_config(args: argparse.Namespace) -> tuple[LiteConfig, str, str]:
    """(the lite config, the tokenizer's model spec, the served model name) from flags and file."""
    doc = _read_doc(getattr(args, "config", None))
    model = getattr(args, "model", None) or doc.get("model") or "smollm2"
    names = getattr(args, "served_model_name", None)
    name = (names[0] if isinstance(names, list) else names) or served_name(str(model))
    dispatch = getattr(args, "dispatch", None) or ((doc.get("scheduling") or {}).get("dispatch") or {}).get("policy")
    key = getattr(args, "engine_api_key", None)
    try:
        if getattr(args, "engine_url", None):
            cfg = from_urls(args.engine_url, name, key, **({"dispatch": dispatch} if dispatch else {}))
        else:
            lite = dict(doc.get("lite") or {})
            if dispatch:
                lite.setdefault("dispatch", dispatch)
            cfg = from_doc(doc.get("pools"), lite, key)
    except SystemConfigError as e:
        raise LlumnixError(str(e)) from None
    except LlumnixError as e:  # an unknown dispatch policy or its params
        raise LlumnixError(f"lite.dispatch: {e}") from None
    return cfg, str(model), name


def build_lite_app(args: argparse.Namespace) -> tuple[Any, Any]:
    """The gateway app over a ``LiteBackend`` (started and stopped with the app)."""
    from llumnix.lite.app import lite_app
    from llumnix.lite.backend import LiteBackend
    from llumnix.model import load_tokenizer

    cfg, model, name = lite_config(args)
    if any(p.internal for p in cfg.pools):
        raise LlumnixError("pools: an internal pool needs `llumnix serve --config` (it starts the instances)")
    tokenizer = load_tokenizer(model)
    backend = LiteBackend(cfg, tokenizer, name, vocab_size=tokenizer.vocab_size,
                          max_model_len=getattr(args, "max_model_len", None) or 8192)
    app = lite_app(backend, api_key=getattr(args, "api_key", None), admin_key=getattr(args, "admin_key", None),
                   admin_requires_key=getattr(args, "host", "127.0.0.1") not in ("127.0.0.1", "localhost", "::1"),
                   max_request_bytes=getattr(args, "max_request_bytes", "auto"),
                   http_read_timeout_s=getattr(args, "http_read_timeout", 30.0),
                   private_docs_and_metrics=getattr(args, "private_metrics", False),
                   fair_share=getattr(args, "fair_share", None),
                   log_requests=not getattr(args, "disable_log_requests", False),
                   log_stats=not getattr(args, "disable_log_stats", False),
                   log_stats_interval_s=getattr(args, "log_stats_interval", 10.0))
    return app, backend


def build_mixed(args: argparse.Namespace, internal: Any) -> Any:
    """A ``MixedBackend``: the config file's internal pool served by ``internal`` (the
    cluster's ``ClusterBackend``), each external pool by a ``LiteBackend`` of its own
    (the lite settings shared; fallback between pools is the mixed backend's)."""
    import dataclasses

    from llumnix.lite.backend import LiteBackend
    from llumnix.lite.mixed import Member, MixedBackend

    cfg, _, _ = lite_config(args)
    members = []
    for i, p in enumerate(cfg.pools):
        if p.internal:
            members.append(Member(p if p.models else dataclasses.replace(p, models=(internal.model_name,)), internal))
            continue
        own = dataclasses.replace(cfg, pools=(dataclasses.replace(p, fallback=None),))
        name = next((m for m in p.models if not m.endswith("*")), internal.model_name)
        members.append(Member(p, LiteBackend(own, internal.tokenizer, name, vocab_size=internal.vocab_size,
                                             max_model_len=internal.max_model_len, seed=i)))
    return MixedBackend(members, internal.tokenizer, internal.model_name, internal.vocab_size)


def main_lite(args: argparse.Namespace) -> int:
    import uvicorn

    from llumnix.gateway.read_deadline import http_protocol

    app, backend = build_lite_app(args)
    host, port = getattr(args, "host", "127.0.0.1"), getattr(args, "port", 8000)
    eps = ", ".join(f"{e.endpoint_id} ({e.url})" for e in backend.endpoints.values())
    print(f"llumnix serve (lite): http://{host}:{port}/v1  (model '{backend.model_name}') over {eps}", flush=True)
    # uvicorn re-raises the SIGTERM it stopped on once it has shut down: a clean stop, exit 0
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(app, host=host, port=port, log_level="warning", http=http_protocol(app),
                timeout_graceful_shutdown=int(getattr(args, "shutdown_grace", 30)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llumnix.lite", description=__doc__)
    add_lite_args(p)
    p.add_argument("--config", help="YAML with a pools: section (and lite:, scheduling.dispatch)")
    p.add_argument("--model", default=None, help="the tokenizer's model: 'smollm2' (default), a .gguf or an HF dir")
    p.add_argument("--served-model-name", default=None, help="the model name clients ask for")
    p.add_argument("--dispatch", default=None, help="llumnix (default) | round-robin | least-requests | "
                   "power-of-two | random | llm-d | infaas++")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the engines')")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--admin-key", default=os.environ.get("LLUMNIX_ADMIN_KEY"))
    args = p.parse_args(argv)
    configure_logging()
    if not wants_lite(args):
        p.error("give --engine-url or a --config with a pools: section")
    try:
        return main_lite(args)
    except LlumnixError as e:
        print(f"llumnix serve: {e}", flush=True)
        return 2
