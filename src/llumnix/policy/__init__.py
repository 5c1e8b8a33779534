"""Scheduling policies: pure functions of InstanceStatus snapshots, and the
Llumlet and GlobalScheduler objects that the runtime and the simulator drive."""
from llumnix.policy import plugins as _plugins  # noqa: F401 - registers the built-in plugins
from llumnix.policy.config import (
    DISPATCH_POLICIES,
    DispatchConfig,
    FreenessConfig,
    PolicyConfigError,
    ReschedulingConfig,
    ScalingConfig,
    SchedulingConfig,
)
from llumnix.policy.dispatch import make_pipeline
from llumnix.policy.freeness import freeness, memory_load, normal_freeness, virtual_usages
from llumnix.policy.global_scheduler import DispatchQueue, DispatchRequest, GlobalScheduler
from llumnix.policy.llumlet import Llumlet
from llumnix.policy.pairing import MigrationOrder, pair_migrations
from llumnix.policy.pipeline import DispatchContext, Pipeline
from llumnix.policy.scaling import ScaleAction, scaling_decision
from llumnix.policy.selection import SELECTIONS, select_requests

__all__ = ["DISPATCH_POLICIES", "SELECTIONS", "DispatchConfig", "DispatchContext", "DispatchQueue",
           "DispatchRequest", "FreenessConfig", "GlobalScheduler", "Llumlet", "MigrationOrder", "Pipeline",
           "PolicyConfigError", "ReschedulingConfig", "ScaleAction", "ScalingConfig", "SchedulingConfig",
           "freeness", "make_pipeline", "memory_load", "normal_freeness", "pair_migrations",
           "scaling_decision", "select_requests", "virtual_usages"]
