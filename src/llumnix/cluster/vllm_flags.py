"""vLLM's `serve` flags that `llumnix serve` does not honour, each decided once: refused
with one line that says why and names the nearest flag we have, or accepted and ignored
(one line at start) where ignoring it changes nothing a client sees. A flag neither of
ours nor vLLM's known ones is one line with the closest flag of the command
(``unknown_flag``). docs/serving.md lists both tables."""
from __future__ import annotations

import argparse
import difflib
from typing import Any

from llumnix.core.errors import LlumnixError

_HUB = "nothing is fetched from a model hub: give --model a local .gguf file or HF directory"

REFUSED: dict[tuple[str, ...], tuple[str, str | None]] = {
    # flags: (why, the one value that means our behaviour, accepted; None: every value refused)
    ("--kv-cache-dtype",): ("the KV cache is kept in the weights' dtype; nearest: --dtype", "auto"),
    ("--tokenizer",): ("the tokenizer is the model's own (GGUF or tokenizer.json); nearest: --model", None),
    ("--tokenizer-mode",): ("the tokenizer is the model's own; nearest: --model", "auto"),
    ("-q", "--quantization"): ("weights are kept in one of our formats; nearest: --weight-format (fp32, bf16, int8, int4, auto, w8a8 on CPU)", None),
    ("--load-format",): ("the format follows the model path (.gguf or safetensors); nearest: --model", "auto"),
    ("--download-dir",): (f"{_HUB}; nearest: --model", None),
    ("--revision",): (f"{_HUB}; nearest: --model", None),
    ("--tokenizer-revision",): (f"{_HUB}; nearest: --model", None),
    ("-dp", "--data-parallel-size"): ("replicas are instances here, with live migration between them; "
                                      "nearest: --instances", "1"),
    ("--cpu-offload-gb",): ("weights stay on the instance's device; nearest: --device", "0"),
    ("--preemption-mode",): ("a preempted request is recomputed, never swapped; nearest: --kv-cache-mib",
                             "recompute"),
    ("-O", "--compilation-config"): ("no torch.compile here; nearest: --enforce-eager / --cuda-graphs", None),
    ("--speculative-config",): ("speculative decoding is not supported; nearest: --max-num-seqs", None),
    ("--enable-lora",): ("LoRA adapters are not supported; nearest: --model", None),
    ("--lora-modules",): ("LoRA adapters are not supported; nearest: --model", None),
    ("--enable-auto-tool-choice",): ("tool calls are not parsed; nearest: --chat-template", None),
    ("--tool-call-parser",): ("tool calls are not parsed; nearest: --chat-template", None),
    ("--reasoning-parser",): ("reasoning output is not parsed; nearest: --chat-template", None),
    ("--guided-decoding-backend",): ("structured output is not supported; nearest: --chat-template", None),
    ("--ssl-keyfile",): ("the gateway serves plain HTTP: put a TLS proxy in front; nearest: --host", None),
    ("--ssl-certfile",): ("the gateway serves plain HTTP: put a TLS proxy in front; nearest: --host", None),
    ("--api-server-count",): ("one gateway per process; nearest: `llumnix gateway` (one more gateway)", "1"),
}
"""vLLM flags refused with one line (a flag in the first tuple position is vLLM's long or short name)."""
_SWITCHES = {"--enable-lora", "--enable-auto-tool-choice"}
"""Refused flags that take no value."""

IGNORED: dict[str, tuple[str, bool]] = {
    # flag: (why ignoring it is harmless, takes a value)
    "--swap-space": ("a preempted request is recomputed, never swapped to CPU", True),
    "--disable-custom-all-reduce": ("an instance runs on one device", False),
    "--distributed-executor-backend": ("instances are Ray actors, each on one device", True),
    "--max-seq-len-to-capture": ("CUDA graphs cover every sequence length up to --max-model-len", True),
    "--disable-fastapi-docs": ("the gateway serves no /docs page", False),
    "--disable-frontend-multiprocessing": ("the gateway is one process", False),
    "--enable-log-requests": ("request lines are on by default (--disable-log-requests turns them off)", False),
}
"""vLLM flags accepted and ignored, with a line at start saying so."""


def _dest(flag: str) -> str:
    return "vllm_" + flag.lstrip("-").replace("-", "_")


def add_vllm_compat_args(p: argparse.ArgumentParser) -> None:
    """Declared, hidden from --help (docs/serving.md lists them), so that a value after
    one is not read as the model and the error names the flag."""
    for flags, _ in REFUSED.items():
        long = flags[-1]
        if long in _SWITCHES:
            p.add_argument(*flags, dest=_dest(long), action="store_true", help=argparse.SUPPRESS)
        else:
            p.add_argument(*flags, dest=_dest(long), default=None, metavar="X", help=argparse.SUPPRESS)
    for flag, (_, takes_value) in IGNORED.items():
        if takes_value:
            p.add_argument(flag, dest=_dest(flag), default=None, help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=_dest(flag), action="store_true", help=argparse.SUPPRESS)


def check_vllm_flags(args: argparse.Namespace) -> list[str]:
    """LlumnixError (one line) for a refused flag; the lines to print for ignored ones."""
    for flags, (why, accepted) in REFUSED.items():
        value: Any = getattr(args, _dest(flags[-1]), None)
        if value is None or value is False or (accepted is not None and str(value).lower() == accepted):
            continue
        shown = flags[-1] if value is True else f"{flags[-1]} {value}"
        raise LlumnixError(f"{shown} is not supported: {why}")
    notes = []
    for flag, (why, _) in IGNORED.items():
        value = getattr(args, _dest(flag), None)
        if value is not None and value is not False:
            notes.append(f"{flag} ignored: {why}")
    return notes


def unknown_flag(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """The one line for arguments the command does not take: the first unknown flag and
    the closest flag the command has."""
    flag = next((a for a in extras if a.startswith("-")), extras[0]).split("=", 1)[0]
    if not flag.startswith("-"):
        return f"unexpected argument {flag!r}"
    known = [o for a in parser._actions if a.help is not argparse.SUPPRESS for o in a.option_strings]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
    return f"{flag} is not a flag of this command" + (f"; nearest: {close[0]}" if close else "") + \
        " (--help lists every flag)"
