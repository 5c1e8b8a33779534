"""Traffic splitting: which pools a request for a model may go to, in order.

The pools that serve the model (by name, or by prefix with ``name*``) share its traffic
by weight; the first choice is drawn among those with a healthy endpoint (all of them
when none has one), then come its fallback chain and the other pools that serve the
model (each followed by its own fallback chain), heaviest first. Dispatch walks the list: a pool with no endpoint to offer (all
ejected, drained or already tried) hands the request to the next.
"""
from __future__ import annotations

import random
from typing import Protocol, TypeVar

from llumnix.lite.config import PoolConfig


class RoutedPool(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def cfg(self) -> PoolConfig: ...

    def has_healthy(self) -> bool: ...


P = TypeVar("P", bound=RoutedPool)


def route(pools: list[P], model: str, rng: random.Random) -> list[P]:
    """The pools to try for ``model``, first choice first (empty when none serves it)."""
    if len(pools) == 1:  # the common case: one pool, no split and no fallback
        only = pools[0]
        return [only] if only.cfg.weight > 0 and only.cfg.serves(model) else []
    serving = [p for p in pools if p.cfg.serves(model) and p.cfg.weight > 0]
    if not serving:
        return []
    healthy = [p for p in serving if p.has_healthy()] or serving
    first = _weighted(healthy, rng)
    by_name = {p.name: p for p in pools}
    order: list[P] = []
    for head in [first, *sorted((p for p in serving if p is not first), key=lambda p: (-p.cfg.weight, p.name))]:
        p: P | None = head
        while p is not None and p not in order:  # the pool, then its fallback chain
            order.append(p)
            p = by_name[p.cfg.fallback] if p.cfg.fallback is not None else None
    return order


def _weighted(pools: list[P], rng: random.Random) -> P:
    if len(pools) == 1:
        return pools[0]
    x = rng.random() * sum(p.cfg.weight for p in pools)
    for p in pools:
        x -= p.cfg.weight
        if x < 0:
            return p
    return pools[-1]
