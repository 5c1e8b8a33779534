"""Lite mode's configuration: endpoints (engines Llumnix does not own), the pools they
form, and how the gateway watches them. Built from ``--engine-url`` flags or a config
file's ``pools:`` section; every error is one line naming its path (``pools[0].endpoints[1].url``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from llumnix.config.fields import SystemConfigError, build, join
from llumnix.lite.sse import MIN_LINE_BYTES

KINDS = ("auto", "vllm", "sglang", "llamacpp", "llumnix", "openai")


@dataclass(frozen=True)
class EndpointConfig:
    url: str
    """The engine's base URL (``http://host:port``; a trailing ``/v1`` is dropped)."""
    name: str = ""
    """Its id in /admin/cluster and /metrics (default: host:port)."""
    kind: str = "auto"
    """auto | vllm | sglang | llamacpp | llumnix | openai: which metrics to scrape and
    whether prompts go as token ids (vllm, sglang, llumnix) or text; auto reads /metrics."""
    capacity_tokens: int = 0
    """KV tokens the engine holds (0: from its metrics where they say, else 16384)."""
    max_num_seqs: int = 0
    """Requests it runs at once; later ones count as queued (0: 256)."""
    model: str = ""
    """The model name the engine serves (default: the first its /v1/models lists)."""
    api_key: str | None = None
    """Sent as 'Authorization: Bearer KEY' to this endpoint."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SystemConfigError("url", f"must be http(s)://host:port, not {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/").removesuffix("/v1"))
        if not self.name:
            object.__setattr__(self, "name", parts.netloc)
        if self.kind not in KINDS:
            raise SystemConfigError("kind", f"must be one of {', '.join(KINDS)}, not {self.kind!r}")
        for key in ("capacity_tokens", "max_num_seqs"):
            if getattr(self, key) < 0:
                raise SystemConfigError(key, "must be >= 0")


@dataclass(frozen=True)
class PoolConfig:
    name: str
    endpoints: tuple[EndpointConfig, ...]
    models: tuple[str, ...] = ()
    """Model names this pool serves; ``prefix*`` matches by prefix; empty: any model."""
    weight: float = 1.0
    """Share of its models' traffic among the pools that serve them."""
    fallback: str | None = None
    """The pool that takes its requests when none of its endpoints is healthy."""
    internal: bool = False
    """Our own instances (full mode, as ``deployment`` starts them) rather than endpoints:
    ``llumnix serve --config`` only; its models default to the served model's name."""

    def serves(self, model: str) -> bool:
        return not self.models or model in self.models or \
            any(m.endswith("*") and model.startswith(m[:-1]) for m in self.models)


@dataclass(frozen=True)
class LiteConfig:
    pools: tuple[PoolConfig, ...]
    dispatch: str = "llumnix"
    """The dispatch policy within a pool (``policy/dispatch.py``)."""
    dispatch_params: dict[str, Any] | None = None
    """Its params (None: for ``llumnix``, every queued request counts, since engines queue
    behind us, and prompts go where their prefix went before unless that endpoint holds
    more than one request beyond the freest; none for the others)."""
    max_attempts: int = 3
    """Endpoints a request may be tried on (before its first output, or to resume it)."""
    resume: bool = True
    """A request whose endpoint fails mid-stream goes on on another endpoint from its
    prompt and the output so far (off: it ends with an error event)."""
    connect_timeout_s: float = 2.0
    first_byte_timeout_s: float = 60.0
    """An endpoint that sends nothing for this long after a request counts as failed."""
    idle_timeout_s: float = 30.0
    """Most seconds between two chunks of a stream."""
    max_line_bytes: int = 8 << 20
    """The longest SSE line an engine may stream (at least 64 KiB); a longer one is the
    engine's failure. A reply may be two such lines and 4 KiB per token asked for."""
    probe_interval_s: float = 1.0
    scrape_interval_s: float = 0.5
    eject_after: int = 2
    """Consecutive failures (requests or probes) that eject an endpoint; a refused
    connection ejects at once."""
    backoff_s: float = 1.0
    """First ejection's length; it doubles with each ejection in a row, up to ``max_backoff_s``."""
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        names = [p.name for p in self.pools]
        if not self.pools:
            raise SystemConfigError("pools", "needs at least one pool")
        if len(set(names)) != len(names):
            raise SystemConfigError("pools", f"pool names must be unique, got {names}")
        if sum(p.internal for p in self.pools) > 1:
            raise SystemConfigError("pools", "at most one pool can be internal (the instances this file deploys)")
        eps = [e.name for p in self.pools for e in p.endpoints]
        if len(set(eps)) != len(eps):
            raise SystemConfigError("pools", f"endpoint names must be unique, got {eps}")
        for i, p in enumerate(self.pools):
            if p.fallback is not None and (p.fallback not in names or p.fallback == p.name):
                raise SystemConfigError(f"pools[{i}].fallback", f"must name another pool, not {p.fallback!r}")
        if self.max_attempts < 1:
            raise SystemConfigError("max_attempts", "must be >= 1")
        if self.max_line_bytes < MIN_LINE_BYTES:
            raise SystemConfigError("max_line_bytes", f"must be >= {MIN_LINE_BYTES}")
        from llumnix.policy import PolicyConfigError, make_pipeline

        try:
            make_pipeline(self.dispatch, self.policy_params)
        except PolicyConfigError as e:
            raise SystemConfigError("dispatch", str(e)) from None

    @property
    def policy_params(self) -> dict[str, Any]:
        if self.dispatch_params is not None:
            return self.dispatch_params
        # Slack 1, not full mode's 4 and 2x: an external engine's compute is what its
        # queue waits for (measured: with 4, chats sharing a system prompt all went to one
        # of three CPU engines; benchmarks/lite/results/).
        return {"queued": "all", "prefix": True, "prefix_slack": 1} if self.dispatch == "llumnix" else {}

    def pool(self, name: str) -> PoolConfig:
        return next(p for p in self.pools if p.name == name)


def from_urls(urls: list[str], model: str, api_key: str | None = None, **fields: Any) -> LiteConfig:
    """One pool of ``--engine-url`` endpoints serving ``model`` (each sent ``api_key``)."""
    eps = []
    for u in urls:
        try:
            eps.append(build(EndpointConfig, {"url": u, "api_key": api_key}, ""))
        except SystemConfigError as e:
            raise SystemConfigError("--engine-url", e.problem) from None
    return LiteConfig(pools=(PoolConfig("default", tuple(eps), models=(model,)),), **fields)


def from_doc(pools: Any, lite: Any = None, api_key: str | None = None) -> LiteConfig:
    """A config file's ``pools:`` list (and optional ``lite:`` settings); ``api_key`` is
    sent to every endpoint whose entry names none (``--engine-api-key``)."""
    if not isinstance(pools, list):
        raise SystemConfigError("pools", "must be a list of pools")
    built = []
    for i, p in enumerate(pools):
        where = f"pools[{i}]"
        if not isinstance(p, dict):
            raise SystemConfigError(where, "must be a mapping")
        pool = _build(_PoolFields, {k: v for k, v in p.items() if k != "endpoints"}, where)
        eps = p.get("endpoints")
        if pool.internal and eps:
            raise SystemConfigError(join(where, "endpoints"), "an internal pool has no endpoints (its instances "
                                    "are the deployment's)")
        if not pool.internal and (not isinstance(eps, list) or not eps):
            raise SystemConfigError(join(where, "endpoints"), "must be a non-empty list")
        endpoints = tuple(_build(EndpointConfig, _with_key({"url": e} if isinstance(e, str) else e, api_key),
                                 f"{where}.endpoints[{j}]") for j, e in enumerate(eps or ()))
        models = [pool.models] if isinstance(pool.models, str) else pool.models
        if not isinstance(models, list | tuple) or not all(isinstance(m, str) and m for m in models):
            raise SystemConfigError(join(where, "models"), f"must be a list of model names, not {pool.models!r}")
        built.append(PoolConfig(pool.name, endpoints, tuple(models), pool.weight, pool.fallback, pool.internal))
    settings = _build(_LiteFields, lite or {}, "lite")
    return LiteConfig(pools=tuple(built), **{k: v for k, v in vars(settings).items() if v is not None})


def _with_key(entry: Any, api_key: str | None) -> Any:
    if api_key is None or not isinstance(entry, dict) or entry.get("api_key") is not None:
        return entry
    return {**entry, "api_key": api_key}


@dataclass(frozen=True)
class _PoolFields:
    name: str
    models: Any = ()
    weight: float = 1.0
    fallback: str | None = None
    internal: bool = False

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise SystemConfigError("weight", "must be >= 0")


@dataclass(frozen=True)
class _LiteFields:
    dispatch: str | None = None
    dispatch_params: dict[str, Any] | None = None
    max_attempts: int | None = None
    resume: bool | None = None
    connect_timeout_s: float | None = None
    first_byte_timeout_s: float | None = None
    idle_timeout_s: float | None = None
    max_line_bytes: int | None = None
    probe_interval_s: float | None = None
    scrape_interval_s: float | None = None
    eject_after: int | None = None
    backoff_s: float | None = None
    max_backoff_s: float | None = None


def _build(cls: type[Any], value: Any, where: str) -> Any:
    try:
        return build(cls, value, where)
    except SystemConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise SystemConfigError(where, str(e)) from None
