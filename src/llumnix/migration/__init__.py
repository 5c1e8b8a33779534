"""Live migration: the pure protocol state machine and its drivers."""
from llumnix.migration.protocol import (
    MigrationConfig,
    MigrationPhase,
    MigrationProtocol,
    MigrationReport,
    StageRecord,
)

__all__ = ["MigrationConfig", "MigrationPhase", "MigrationProtocol", "MigrationReport", "StageRecord"]
