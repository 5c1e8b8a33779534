"""The engine, migration and deployment sections of a system config.

Their checks raise ``SystemConfigError`` with paths that start with the section's own
name (``engine.device``); ``fields.build`` re-roots them where the section sits.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from llumnix.config.fields import SystemConfigError, build
from llumnix.core.config import SchedulerConfig

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

DTYPES = ("float32", "bfloat16", "float16")
WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4", "auto", "w8a8")
"""``llumnix.model.quant.WEIGHT_FORMATS``, named here without importing torch."""
TRANSPORTS = ("tcp", "gloo", "ray")
"""``llumnix.migration.transport.TRANSPORTS``, named here without importing torch."""
_DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")


def _at_least(section: Any, name: str, least: int) -> None:
    if getattr(section, name) < least:
        raise SystemConfigError(f"{section.SECTION}.{name}", f"must be >= {least}, got {getattr(section, name)}")


def _check_template(text: str) -> None:
    """A chat template that does not parse is an error at start, not at the first chat
    (parsed as ``model.tokenizer`` parses it)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).parse(text)
    except jinja2.TemplateSyntaxError as e:
        problem = f"is not valid Jinja: line {e.lineno}: {e.message}"
        raise SystemConfigError("deployment.chat_template", problem) from None


@dataclass(frozen=True)
class PaceConfig:
    """Each step held to a latency model's time (``engine/pace.py``): for evaluating
    scheduling on a shared CPU as if each instance had its own device, never for serving."""

    SECTION = "pace"

    model: str
    """A latency model: a preset of ``sim/latency.py`` (a10-llama7b-serving, a10-llama7b) or a
    profile JSON (`llumnix profile`), the simulator's own."""
    scale: float = 1.0
    """Its step times times this (2: a device half as fast)."""

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise SystemConfigError("pace.scale", f"must be > 0, got {self.scale:g}")
        from llumnix.engine.pace import pace_model

        try:
            pace_model(self.model, self.scale)
        except ValueError as e:
            raise SystemConfigError("pace.model", str(e)) from None


@dataclass(frozen=True)
class LLMConfig:
    """Each instance's engine: the keyword arguments of ``llumnix.llm.LLM``, with the
    defaults `llumnix serve` runs (chunked prefill and prefix caching on)."""

    SECTION = "engine"

    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    dtype: str = "float32"
    """Weights and KV cache: float32, bfloat16 or float16."""
    weight_format: str = "fp32"
    """Projection weights: fp32 (as loaded in dtype: the exact path), or on cpu with float32
    packed for weight-only kernels: bf16, int8 (per channel), int4 (32-wide groups, a
    GGUF Q4_1 block's own integers) or auto (int4 below 16 rows a step, bf16 from 16), or
    w8a8 (int8 weights times 8-bit activations, fbgemm; SmoothQuant-calibrated). The
    KV cache stays in dtype either way."""
    kv_cache_bytes: int = 512 * 2**20
    """KV cache per instance (`--kv-cache-mib` in MiB), unless num_blocks is given."""
    num_blocks: int | None = None
    """KV blocks per instance; None sizes the pool from kv_cache_bytes."""
    block_size: int = 16
    """Tokens per KV block."""
    max_num_seqs: int = SchedulerConfig.max_num_seqs
    """Most requests in one batch."""
    max_num_batched_tokens: int | None = None
    """Most tokens one step computes; None: ``num_batched_tokens``."""
    max_model_len: int | None = None
    """Longest sequence; None: the model's context length."""
    chunked_prefill: bool = True
    """Prefill long prompts in chunks beside the running decodes."""
    enable_prefix_caching: bool = True
    """Share the KV of common prompt prefixes between requests on an instance."""
    cuda_graphs: bool | None = None
    """Replay decode steps from CUDA graphs; None: on with a CUDA device."""
    seed: int = 0
    """Seed of the engine's sampling RNG."""
    gpu_memory_utilization: float | None = None
    """On CUDA, the fraction of the device's memory an instance may use: the KV cache gets
    what is left of it after the weights, CUDA graphs and activations (vLLM's flag); None:
    kv_cache_bytes. On cpu it has no effect (the KV cache is kv_cache_bytes)."""
    pace: PaceConfig | None = None
    """Hold every step to a latency model's time (evaluation only; `--pace`); None: off."""

    def __post_init__(self) -> None:
        if not _DEVICE.fullmatch(self.device):
            raise SystemConfigError("engine.device", f"must be cpu, cuda or cuda:N, not {self.device!r}")
        if self.dtype not in DTYPES:
            raise SystemConfigError("engine.dtype", f"must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.weight_format not in WEIGHT_FORMATS:
            raise SystemConfigError("engine.weight_format",
                                    f"must be one of {', '.join(WEIGHT_FORMATS)}, not {self.weight_format!r}")
        if self.weight_format != "fp32" and (self.is_cuda or self.dtype != "float32"):
            raise SystemConfigError("engine.weight_format", f"{self.weight_format} needs device cpu "
                                    f"and dtype float32, not {self.device} and {self.dtype}")
        for name in ("kv_cache_bytes", "block_size", "max_num_seqs"):
            _at_least(self, name, 1)
        for name in ("num_blocks", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        if self.cuda_graphs and not self.is_cuda:
            raise SystemConfigError("engine.cuda_graphs", "needs device cuda")
        util = self.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise SystemConfigError("engine.gpu_memory_utilization", f"must be in (0, 1], got {util:g}")
        if self.chunked_prefill and self.num_batched_tokens < self.max_num_seqs:
            raise SystemConfigError("engine.max_num_batched_tokens", f"must be at least max_num_seqs "
                                    f"({self.max_num_seqs}) with chunked prefill, got {self.num_batched_tokens}")

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def num_batched_tokens(self) -> int:
        """max_num_batched_tokens, or its default: with chunked prefill the device's
        ``CHUNKED_BUDGET``, without it the engine's (one whole prefill a step)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.chunked_prefill:
            return CHUNKED_BUDGET["cuda" if self.is_cuda else "cpu"]
        return SchedulerConfig.max_num_batched_tokens

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``LLM`` (every one, defaults resolved)."""
        kwargs = dataclasses.asdict(self)
        kwargs["max_num_batched_tokens"] = self.num_batched_tokens
        return kwargs


@dataclass(frozen=True)
class LiveMigrationConfig:
    """How a request's KV moves: ``MigrationConfig``'s stages over a KV transport."""

    SECTION = "migration"

    transport: str = "tcp"
    """KV transport between instances: tcp, gloo or ray."""
    max_stages: int = 3
    """Most copy stages, the last (stop-and-copy) one included."""
    last_stage_max_blocks: int = 2
    """Go to the last stage once at most this many unsent blocks remain."""
    timeout_s: float = 10.0
    """A migration not committed within this many seconds is aborted."""
    transport_options: dict[str, Any] = field(default_factory=dict)
    """``TransportOptions`` fields (bulk_nice, bulk_rate_bytes_per_s, chunk_bytes...)."""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise SystemConfigError("migration.transport", f"must be {', '.join(TRANSPORTS[:-1])} or "
                                    f"{TRANSPORTS[-1]}, not {self.transport!r}")
        _at_least(self, "max_stages", 1)
        _at_least(self, "last_stage_max_blocks", 0)
        if not self.timeout_s > 0:
            raise SystemConfigError("migration.timeout_s", f"must be > 0, got {self.timeout_s:g}")
        if self.transport_options:
            from llumnix.migration.transport import TransportOptions

            build(TransportOptions, self.transport_options, "migration.transport_options")

    @property
    def protocol(self) -> Any:
        """The ``MigrationConfig`` of the protocol's state machine."""
        from llumnix.migration.protocol import MigrationConfig

        return MigrationConfig(self.max_stages, self.last_stage_max_blocks, self.timeout_s)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DeploymentConfig:
    """Where and how many instances run: what serving needs and simulating does not."""

    SECTION = "deployment"

    instances: int | None = None
    """Instance actors at the start; None: 2 (the simulator: its cluster's size)."""
    gpus_per_instance: float | None = None
    """GPUs Ray reserves per instance; None: 1 on cuda, 0 on cpu (0.5 packs two per GPU)."""
    threads_per_instance: int = 1
    """torch intra-op threads of each instance."""
    cms: str | None = None
    """Cluster meta store: None or 'memory', or a redis:// URL."""
    ray_address: str | None = None
    """Join this Ray cluster instead of starting a local one."""
    ray_num_cpus: int = 2
    """CPUs of the local Ray cluster."""
    namespace: str = "llumnix"
    """Ray namespace (named actors live there)."""
    llumsched_name: str | None = None
    """Name of the LlumSched actor; None: the runtime's default."""
    reschedule_interval_s: float = 0.5
    """Seconds between LlumSched's migration (and scaling) rounds."""
    replace_lost_instances: bool = True
    """Start a fresh instance in place of one that died."""
    instance_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each instance actor asks for (e.g. one ``llumnix_slot`` a node)."""
    served_model_name: str | None = None
    """The model's name in the API (vLLM's flag); None: 'smollm2', the GGUF file's stem or
    the directory's name."""
    chat_template: str | None = None
    """A Jinja chat template the gateway renders chats with instead of the model's own."""

    def __post_init__(self) -> None:
        if self.instances is not None:
            _at_least(self, "instances", 1)
        _at_least(self, "threads_per_instance", 1)
        _at_least(self, "ray_num_cpus", 1)
        if self.gpus_per_instance is not None and not self.gpus_per_instance >= 0:
            raise SystemConfigError("deployment.gpus_per_instance", f"must be >= 0, got {self.gpus_per_instance:g}")
        if not self.reschedule_interval_s > 0:
            raise SystemConfigError("deployment.reschedule_interval_s",
                                    f"must be > 0, got {self.reschedule_interval_s:g}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise SystemConfigError("deployment.served_model_name", "must not be empty")
        if self.chat_template is not None:
            _check_template(self.chat_template)

    @property
    def num_instances(self) -> int:
        return 2 if self.instances is None else self.instances
