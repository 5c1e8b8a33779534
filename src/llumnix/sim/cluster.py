"""The simulated cluster: its engine limits, and the instances it starts and stops."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llumnix.core.clock import VirtualClock
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.engine import EngineCore
from llumnix.migration.protocol import MigrationConfig
from llumnix.policy.lifecycle import InstanceState
from llumnix.sim.executor import HostSteps, SimExecutor
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import LatencyModel


@dataclass(frozen=True)
class ClusterConfig:
    num_instances: int = 16
    """Instances at the start of a run."""
    num_blocks: int = 862
    """KV blocks per instance (the paper's A10s hold 792 to 862)."""
    block_size: int = 16
    """Tokens per KV block."""
    max_num_seqs: int = 256
    """Most requests in one batch."""
    max_num_batched_tokens: int = 12800
    """Most tokens in one prefill step (with chunked prefill: in any step)."""
    chunked_prefill: bool = False
    """Chunked prefill in every engine (``SchedulerConfig.chunked_prefill``; not the
    paper's engine). The latency of a step that mixes decodes into a prefill is the
    prefill's plus the decodes' marginal cost (``SimExecutor``), not calibrated."""
    max_model_len: int = 16384
    """Longest sequence an instance accepts."""
    watermark: float = 0.01
    """Fraction of blocks an admission must leave free."""
    status_interval_s: float = 0.05
    """Period of the llumlets' status reports."""
    report_on_load_change: bool = True
    """Also report right after a step or dispatch that changed an instance's request set."""
    reschedule_every: int = 2
    """Status rounds per rescheduling (migration pairing) round."""
    trigger_gap_s: float | None = None
    """Triggered rescheduling as the cluster's LlumSched runs it (``policy/trigger.py``;
    the cluster's ``rescheduling.trigger_gap_s``): every status report delivered goes
    through the trigger, and one that makes a source, a blocked queue or a wanted
    destination starts a rescheduling pass at once, passes at least this many seconds
    apart; the rounds every ``reschedule_every`` stay as the backstop. None: rounds only."""
    status_delay_s: float = 0.0
    """Seconds a status report takes to reach the rescheduler (its pairing and trigger; on
    the cluster LlumSched, through the instances' channels and its status feed). Dispatch
    reads each report at once (the gateway's channels carry one per step). 0: one
    scheduler reads every report at once (PD: only 0)."""
    migration_start_s: float = 0.0
    """Seconds from a rescheduling pass's order to its migration's first stage: the
    cluster's call to the source, the source's wait for a step boundary to pick the
    request, the destination's status. The source picks the request when it ends (a chain's
    next move starts at once, as before). 0: at once."""
    migration: MigrationConfig = field(default_factory=MigrationConfig)
    """Stages, last-stage threshold and timeout of live migration."""
    instance_startup_s: float = 10.0
    """Seconds from a scale-up decision until the new instance takes requests."""
    check_invariants: bool = False
    """Check every engine's block accounting after every step (tests; slow)."""
    enable_prefix_caching: bool = False
    """Automatic prefix caching in every engine (worth it only on traces with shared
    prefixes: other traces' prompts are all token 0)."""

    def __post_init__(self) -> None:
        for name in ("num_instances", "num_blocks", "block_size", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len", "reschedule_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.status_interval_s <= 0:
            raise ValueError("status_interval_s must be > 0")
        for name in ("status_delay_s", "migration_start_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.trigger_gap_s is not None and not self.trigger_gap_s >= 0:
            raise ValueError("trigger_gap_s must be >= 0 (or null: periodic rounds only)")
        if self.chunked_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("with chunked_prefill, max_num_batched_tokens must be >= max_num_seqs")

    @property
    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            cache=CacheConfig(block_size=self.block_size, num_blocks=self.num_blocks, watermark=self.watermark,
                              enable_prefix_caching=self.enable_prefix_caching),
            scheduler=SchedulerConfig(max_num_seqs=self.max_num_seqs,
                                      max_num_batched_tokens=self.max_num_batched_tokens,
                                      chunked_prefill=self.chunked_prefill),
            max_model_len=self.max_model_len,
        )


class Cluster:
    """Instances by id, in start order; makes new ones with the same engine config."""

    def __init__(self, config: ClusterConfig, latency: LatencyModel, clock: VirtualClock,
                 make_llumlet: Callable[[str, EngineCore], Any] | None = None) -> None:
        self.config = config
        self.latency = latency
        self.clock = clock
        self.make_llumlet = make_llumlet
        self.instances: dict[str, SimInstance] = {}
        self._engine_config = config.engine_config
        self._next_index = 0
        self.host = HostSteps()
        """All instances share one host as far as step contention goes (a latency model
        without contention factors ignores it)."""
        self.retired_steps = 0
        self.retired_block_seconds = 0.0
        """Steps and KV block-seconds of instances already removed (for the run's totals)."""

    def new_instance(self, *, up: bool = True) -> SimInstance:
        iid = f"instance-{self._next_index}"
        self._next_index += 1
        ex = SimExecutor(self.latency, self.host)
        engine = EngineCore(self._engine_config, ex, self.config.num_blocks, clock=self.clock, instance_id=iid)
        llumlet = self.make_llumlet(iid, engine) if self.make_llumlet else None
        inst = SimInstance(iid, engine, ex, llumlet, up_since=self.clock.now())
        if not up:
            inst.state = InstanceState.STARTING
        self.instances[iid] = inst
        return inst

    def remove(self, instance_id: str) -> SimInstance:
        inst = self.instances.pop(instance_id)
        inst.executor.step_done()
        self.retired_steps += inst.executor.num_steps
        self.retired_block_seconds += inst.block_seconds
        return inst

    @property
    def num_live(self) -> int:
        return len(self.instances)

    @property
    def num_steps(self) -> int:
        """Steps of every instance the run had, removed ones included."""
        return self.retired_steps + sum(i.executor.num_steps for i in self.instances.values())

    @property
    def block_seconds(self) -> float:
        """KV block-seconds in use over the run, removed instances included."""
        return self.retired_block_seconds + sum(i.block_seconds for i in self.instances.values())

    def check_invariants(self) -> None:
        for inst in self.instances.values():
            inst.engine.check_invariants()
