"""One system, served or simulated: engine, scheduling, migration and deployment, with
the defaults `llumnix serve` runs.

YAML (every key optional; `llumnix serve --config FILE`, or a system of an experiment)::

    model: smollm2
    engine: {device: cpu, max_num_seqs: 64, chunked_prefill: true}      # LLMConfig
    scheduling:                                                         # SchedulingConfig
      dispatch: {policy: llumnix, params: {prefix: true, prefix_slack_ratio: 2}}
      rescheduling: {enabled: true, out_threshold: 3, selection: freed}
    migration: {transport: tcp, max_stages: 3}                          # LiveMigrationConfig
    deployment: {instances: 2, cms: memory, reschedule_interval_s: 0.5}  # DeploymentConfig

Some defaults follow from other fields (``with_defaults``): with prefix caching on, a
migration source gives up the request that frees it most (selection ``freed``), the
prefix index forgets evicted prefixes (``prefix_evictions``), and the llumnix policy
sends a prompt where its prefix is cached (``params.prefix``, slack ratio 2). Whatever
the engine, a source does not give up a request with fewer than 4 output tokens left
(``rescheduling.min_tokens_left``: it would end before its migration commits), and a
move must leave its destination freer than its source (``rescheduling.pairing: even``:
the move back never follows). A key the document writes keeps its value.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llumnix.config.fields import SystemConfigError, build, join, mapping, typed
from llumnix.config.sections import DeploymentConfig, LiveMigrationConfig, LLMConfig
from llumnix.policy.config import SchedulingConfig

if TYPE_CHECKING:
    from llumnix.cluster.launcher import ClusterConfig

_SECTIONS: dict[str, Any] = {"engine": LLMConfig, "scheduling": SchedulingConfig,
                             "migration": LiveMigrationConfig, "deployment": DeploymentConfig}
KEYS = ("model", *_SECTIONS)
"""The top-level keys of a system document."""
FLAT_KEYS = tuple(f.name for f in dataclasses.fields(DeploymentConfig))
"""Deployment keys a document may also write at its top level: the spelling of
`llumnix serve --config` files before this tree (``launcher.ClusterConfig``'s fields)."""


@dataclass(frozen=True)
class SystemConfig:
    model: str = "smollm2"
    """'smollm2', a .gguf file or a Hugging Face directory."""
    engine: LLMConfig = field(default_factory=LLMConfig)
    """Each instance's engine."""
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    """Dispatch, rescheduling (migration pairing), auto-scaling, freeness."""
    migration: LiveMigrationConfig = field(default_factory=LiveMigrationConfig)
    """Stages and transport of live migration."""
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    """Instances and where they run (serving only)."""

    def __post_init__(self) -> None:
        if self.deployment.instances is not None:
            self.check_scaling_range(self.deployment.instances)

    def check_scaling_range(self, instances: int) -> None:
        s = self.scheduling.scaling
        if s.enabled and not s.min_instances <= instances <= s.max_instances:
            raise SystemConfigError("deployment.instances", f"{instances} is outside the auto-scaling range "
                                    f"{s.min_instances}:{s.max_instances} (scheduling.scaling)")

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> SystemConfig:
        """The system a document describes, its unset keys at their defaults; an unknown
        key or a bad value raises ``SystemConfigError`` naming its path below ``where``."""
        d = with_defaults(lift_flat_keys(mapping(doc, where), where), where)
        for key in d:
            if key not in KEYS:
                raise SystemConfigError(join(where, str(key)), f"unknown key (known: {', '.join(KEYS)})")
        sections = {name: build(tp, d.get(name), join(where, name)) for name, tp in _SECTIONS.items()}
        model = typed(str, d.get("model", cls.model), join(where, "model"))
        try:
            return cls(model, **sections)
        except SystemConfigError as e:
            raise SystemConfigError(join(where, e.path), e.problem) from None

    def to_cluster_config(self) -> ClusterConfig:
        """The serving runtime's input (no Ray is started)."""
        from llumnix.cluster.launcher import ClusterConfig

        dep = self.deployment
        self.check_scaling_range(dep.num_instances)
        extra: dict[str, Any] = {}
        if dep.llumsched_name is not None:
            extra["llumsched_name"] = dep.llumsched_name
        if dep.instance_resources:
            extra["instance_resources"] = dict(dep.instance_resources)
        return ClusterConfig(model=self.model, instances=dep.num_instances, engine=self.engine.llm_kwargs(),
                             scheduling=self.scheduling, migration=self.migration,
                             cms=dep.cms, ray_address=dep.ray_address, ray_num_cpus=dep.ray_num_cpus,
                             threads_per_instance=dep.threads_per_instance, namespace=dep.namespace,
                             reschedule_interval_s=dep.reschedule_interval_s,
                             gpus_per_instance=dep.gpus_per_instance,
                             replace_lost_instances=dep.replace_lost_instances, **extra)


def lift_flat_keys(d: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``d`` with deployment keys written at the top level moved into ``deployment``."""
    flat = {k: d.pop(k) for k in list(d) if k in FLAT_KEYS}
    if not flat:
        return d
    deployment = mapping(d.get("deployment"), join(where, "deployment"))
    for k in flat:
        if k in deployment:
            raise SystemConfigError(join(where, f"deployment.{k}"), f"given twice (also as top-level {k})")
    return {**d, "deployment": {**deployment, **flat}}


def with_defaults(d: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``d`` with the defaults that follow from its other keys filled in (see the module's
    docstring); keys it writes are kept."""
    engine = mapping(d.get("engine"), join(where, "engine"))
    sched = mapping(d.get("scheduling"), join(where, "scheduling"))
    dispatch = mapping(sched.get("dispatch"), join(where, "scheduling.dispatch"))
    params = mapping(dispatch.get("params"), join(where, "scheduling.dispatch.params"))
    resched = mapping(sched.get("rescheduling"), join(where, "scheduling.rescheduling"))
    policy = dispatch.get("policy", "llumnix")
    if "prefix" in params and policy != "llumnix":
        raise SystemConfigError(join(where, "scheduling.dispatch.params.prefix"),
                                f"needs the llumnix dispatch policy, not {policy!r}")
    # a migration lasts at least its stages' decode steps; in the simulator at the bench
    # cluster's sizing (benchmarks/cluster/min_tokens_left.json) 4 cut the migrations their
    # request outlived from 3-4% to 0.1-0.5% of those started, preemptions unchanged
    resched.setdefault("min_tokens_left", 4)
    # with triggered rescheduling the paper's pairing moved the same requests on within a
    # gap (a destination the move made a source gave them up at once): in the simulator at
    # the H200 run's sizing 2.6-3.8 moves per moved request, `even` 1.5-1.7 with
    # preemptions as low (benchmarks/cluster/even_pairing.json)
    resched.setdefault("pairing", "even")
    if engine.get("enable_prefix_caching", LLMConfig.enable_prefix_caching) is True:
        # requests share prefix blocks: give up what frees the most per block moved (the
        # paper's order when nothing is shared; policy/selection.py)
        resched.setdefault("selection", "freed")
        # the prefix index (affinity, llm-d's prefix scorer) forgets what the engines
        # report evicted (benchmarks/sim/beyond.md)
        dispatch.setdefault("prefix_evictions", True)
        if policy == "llumnix" and "prefix" not in params and not params.get("shield"):
            params["prefix"] = True  # the caches are only worth as much as the hits dispatch finds them
    if params.get("prefix") is True:
        # the slack grows with load (benchmarks/sim/beyond.md: at light load as the fixed 4,
        # under load far more hits)
        params.setdefault("prefix_slack_ratio", 2.0)
    return {**d, "scheduling": {**sched, "dispatch": {**dispatch, "params": params}, "rescheduling": resched}}
