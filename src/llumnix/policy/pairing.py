"""Migration pairing: sources below the out threshold, destinations above the in
threshold; pair the lowest freeness with the highest, repeatedly."""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.freeness import freeness


@dataclass(frozen=True)
class MigrationOrder:
    src_instance_id: str
    dst_instance_id: str


def pair_migrations(statuses: list[InstanceStatus], cfg: ReschedulingConfig,
                    fcfg: FreenessConfig) -> list[MigrationOrder]:
    live = [s for s in statuses if s.is_schedulable or s.is_terminating]
    f = {s.instance_id: freeness(s, fcfg) for s in live}
    # Terminating instances are always sources (their fake request is infinite).
    srcs = sorted((s for s in live if (f[s.instance_id] < cfg.out_threshold or s.is_terminating)
                   and s.num_migrating_out < cfg.max_out and (s.running or s.waiting)),
                  key=lambda s: (f[s.instance_id], s.instance_id))
    dsts = sorted((s for s in live if f[s.instance_id] > cfg.in_threshold and not s.is_terminating
                   and s.num_migrating_in < cfg.max_in),
                  key=lambda s: (-f[s.instance_id], s.instance_id))
    orders: list[MigrationOrder] = []
    for src, dst in zip(srcs, dsts, strict=False):
        if src.instance_id == dst.instance_id:
            break  # the sets only meet when thresholds allow it; never pair with itself
        orders.append(MigrationOrder(src.instance_id, dst.instance_id))
    return orders
