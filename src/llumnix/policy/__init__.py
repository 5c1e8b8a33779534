"""Scheduling policies: pure functions of InstanceStatus snapshots, and the
Llumlet and GlobalScheduler objects that the runtime and the simulator drive."""
from llumnix.policy import plugins as _plugins  # noqa: F401 - registers the built-in plugins
from llumnix.policy.config import (
    DISPATCH_POLICIES,
    SELECTIONS,
    DispatchConfig,
    FreenessConfig,
    PolicyConfigError,
    ReschedulingConfig,
    ScalingConfig,
    SchedulingConfig,
)
from llumnix.policy.dispatch import POLICY_PARAMS, make_pipeline
from llumnix.policy.dispatch_queue import DispatchQueue, DispatchRequest, dispatch_order
from llumnix.policy.freeness import (
    average_normal_freeness,
    freeness,
    memory_load,
    normal_freeness,
    queue_aware_freeness,
    virtual_usages,
)
from llumnix.policy.global_scheduler import GlobalScheduler
from llumnix.policy.llumlet import Llumlet
from llumnix.policy.pairing import MigrationOrder, pair_migrations
from llumnix.policy.pending import PendingDispatches
from llumnix.policy.pipeline import DispatchContext, Pipeline
from llumnix.policy.scaling import NO_ACTION, ScaleAction, scale_in_victim, scaling_decision
from llumnix.policy.selection import movable_requests, select_requests

__all__ = ["DISPATCH_POLICIES", "NO_ACTION", "POLICY_PARAMS", "SELECTIONS", "DispatchConfig",
           "DispatchContext", "DispatchQueue", "DispatchRequest", "FreenessConfig", "GlobalScheduler",
           "Llumlet", "MigrationOrder", "PendingDispatches", "Pipeline", "PolicyConfigError",
           "ReschedulingConfig", "ScaleAction", "ScalingConfig", "SchedulingConfig",
           "average_normal_freeness", "dispatch_order", "freeness", "make_pipeline", "memory_load",
           "movable_requests", "normal_freeness", "pair_migrations", "queue_aware_freeness", "scale_in_victim", "scaling_decision",
           "select_requests", "virtual_usages"]
