"""One typed system config: what `llumnix serve --config` reads, its flags override, and
an experiment's systems may be written as (``SystemConfig``)."""
from __future__ import annotations

from llumnix.config.fields import SystemConfigError
from llumnix.config.sections import CHUNKED_BUDGET, DeploymentConfig, LiveMigrationConfig, LLMConfig
from llumnix.config.system import KEYS, SystemConfig

__all__ = ["CHUNKED_BUDGET", "KEYS", "DeploymentConfig", "LLMConfig", "LiveMigrationConfig", "SystemConfig",
           "SystemConfigError"]
