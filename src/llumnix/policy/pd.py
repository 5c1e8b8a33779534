"""Prefill-decode disaggregation: instance roles, the config, and adaptive PD's decisions.

Pure: every function reads snapshots (``InstanceStatus``) and the roles the caller keeps,
with ``now`` passed in; nothing here does I/O or keeps state. The simulator calls it
(``sim/pd_flow.py``) and the cluster can call the same functions unchanged::

    dispatch          new request -> the prefill pool (roles prefill and mixed), by the
                      configured dispatch policy over those instances' statuses only
    hand-off          a request on a ``prefill`` instance that has its first token ->
                      ``pick_decode_instance`` (decode freeness among instances with room
                      for its blocks) -> one live migration; None: the decode pool is full,
                      it keeps decoding where it is and is offered again next round
    adaptive rounds   ``adaptive_decisions`` -> this round's ``RoleChange``s (several
                      lends at once, else at most one change); with
                      ``rebalance_queued``, ``queue_moves`` spreads queued prompts over
                      the prefill-taking instances (the simulator only, so far)

Roles: ``mixed`` prefills and decodes (co-located, today's behaviour), ``prefill``
hands every request off after its first token, ``decode`` takes no new request.
Adaptive PD moves capacity where the load is:

    lend      decode -> mixed     the prefill queue per prefill-taking instance is above
                                  ``lend_above_tokens`` while the decode pool has room
                                  (mean freeness, and no hand-off waiting for room): as
                                  many as bring it back to the threshold, at most
                                  ``max_lends_per_round``
    reclaim   mixed -> decode     the queue fell below ``reclaim_below_tokens``, lent for
                                  ``reclaim_after_s`` at least, its own prompts done (a
                                  hand-off into it must not wait behind a prefill step)
    flip      mixed -> prefill    lent for ``flip_after_s`` with the queue still high and
                                  the decode pool's room: its decodes leave by hand-off
                                  (migration drains it)
    flip      prefill -> decode   the decode pool is tight (low freeness, or hand-offs
                                  waiting for room) and the prefill queue low
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llumnix.core.status import InstanceStatus

ROLES = ("prefill", "decode", "mixed")
PD_MODES = ("off", "static", "adaptive")
TAKES_PREFILL = ("prefill", "mixed")
"""Roles that new requests are dispatched to."""
DECODES = ("decode", "mixed")
"""Roles in the decode pool (hand-off destinations, rescheduling among them)."""


def _bad(field_path: str, problem: str) -> Exception:
    from llumnix.policy.config import bad_value  # config imports this module

    return bad_value(field_path, problem)


@dataclass(frozen=True)
class PDConfig:
    mode: str = "off"
    """off (every instance mixed, co-located) | static (fixed roles) | adaptive."""
    prefill_instances: int = 1
    """Instances started as ``prefill`` (the first ones); the rest are ``decode``."""
    min_prefill: int = 1
    """Adaptive PD keeps at least this many prefill-taking instances (prefill or mixed)."""
    min_decode: int = 1
    """Adaptive PD keeps at least this many ``decode`` instances (not lent). 0 lets it lend
    the last one (a 1 + 1 cluster runs co-located while the prefill queue is long)."""
    lend_above_tokens: int = 4096
    """Queued prefill tokens per prefill-taking instance above which a decode instance
    takes prefills (is lent, becomes mixed)."""
    reclaim_below_tokens: int = 1024
    """Queued prefill tokens per prefill-taking instance below which a lent instance
    goes back to decode only, and a prefill instance may flip to decode."""
    decode_room_freeness: float = 10.0
    """The decode pool has room (may lend) when its mean freeness is at least this."""
    decode_tight_freeness: float = 2.0
    """The decode pool is tight (a prefill instance may flip to decode) below this."""
    flip_after_s: float = 5.0
    """A lent instance still needed after this long flips to ``prefill``."""
    cooldown_s: float = 0.5
    """Seconds between two adaptive rounds that change roles."""
    max_lends_per_round: int = 1
    """Decode instances one round may lend at once: as many as bring the queued prefill
    tokens per prefill-taking instance down to ``lend_above_tokens``, at most this many
    (a burst of long prompts needs several at once, not one per cooldown)."""
    reclaim_after_s: float = 0.0
    """A lent instance goes back to decode only after this long lent (hysteresis: the
    next burst of a bursty trace finds it still lent)."""
    rebalance_queued: bool = False
    """Adaptive PD moves queued prompts (no KV yet: metadata only) from the most queued
    prefill-taking instance to the least, so a lend relieves the queue that made it,
    not only the prompts that arrive after it."""
    growth_blocks: int = 1
    """Blocks of decode growth a hand-off destination must have beyond the request's own."""
    stop_and_copy_behind_prefill: bool = True
    """The cluster's hand-off: with prompt work waiting on the prefill instance, pause the
    request at once and copy it in one stage (its next steps there are prefill chunks); False:
    always the live migration. (The simulator's flow always pauses behind queued prompts.)"""
    precopy_prefill_chunks: bool = True
    """The cluster's hand-off of a prompt starts while it prefills: each finished chunk's KV
    is copied to the decode instance while the next computes, and the pause after its
    first token (at once, behind prompt work) copies only the tail. False: the hand-off
    starts after the first token, one step later, and copies the whole prompt then."""
    max_handoffs_in_flight: int = 8
    """The cluster's hand-offs out of one prefill instance at once, each on its own thread:
    a followed prompt's lasts as long as its remaining chunks, and one at a time a request
    past its first token would wait behind it, decoding there a token per prefill chunk."""

    def __post_init__(self) -> None:
        if self.mode not in PD_MODES:
            raise _bad("pd.mode", f"must be one of {', '.join(PD_MODES)}, got {self.mode!r}")
        for name in ("prefill_instances", "min_prefill", "min_decode", "lend_above_tokens",
                     "reclaim_below_tokens", "growth_blocks", "max_handoffs_in_flight", "max_lends_per_round"):
            v = getattr(self, name)
            least = 0 if name in ("growth_blocks", "min_decode") else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise _bad(f"pd.{name}", f"must be an integer >= {least}, got {v!r}")
        for name in ("decode_room_freeness", "decode_tight_freeness", "flip_after_s", "cooldown_s",
                     "reclaim_after_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise _bad(f"pd.{name}", f"must be a number, got {v!r}")
        for name in ("stop_and_copy_behind_prefill", "precopy_prefill_chunks", "rebalance_queued"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(f"pd.{name}", f"must be true or false, got {getattr(self, name)!r}")
        for name in ("flip_after_s", "cooldown_s", "reclaim_after_s"):
            if getattr(self, name) < 0:
                raise _bad(f"pd.{name}", "must be >= 0")
        if self.reclaim_below_tokens > self.lend_above_tokens:
            raise _bad("pd.reclaim_below_tokens", "must be <= lend_above_tokens")
        if self.decode_tight_freeness > self.decode_room_freeness:
            raise _bad("pd.decode_tight_freeness", "must be <= decode_room_freeness")

    @property
    def is_on(self) -> bool:
        return self.mode != "off"

    def check_instances(self, num_instances: int) -> None:
        """Both pools non-empty at the start; raises the path-named error otherwise."""
        if self.is_on and not 1 <= self.prefill_instances < num_instances:
            raise _bad("pd.prefill_instances", f"must be between 1 and {num_instances - 1} "
                       f"(the deployment has {num_instances} instances), got {self.prefill_instances}")


def initial_roles(instance_ids: Sequence[str], config: PDConfig) -> dict[str, str]:
    """The first ``prefill_instances`` ids are prefill, the rest decode (all mixed when off)."""
    if not config.is_on:
        return {i: "mixed" for i in instance_ids}
    return {i: "prefill" if k < config.prefill_instances else "decode" for k, i in enumerate(instance_ids)}


# -- snapshot metrics ----------------------------------------------------------------
def queued_prefill_tokens(status: InstanceStatus) -> int:
    """Prompt tokens not yet computed: every queued request's, and those of running
    requests still without their first token (a chunked prefill in progress, counted whole)."""
    return (sum(r.num_tokens for r in status.waiting)
            + sum(r.num_tokens for r in status.running if r.num_output_tokens == 0))


def handoff_blocks(num_blocks: int, config: PDConfig) -> int:
    """Blocks a destination must be able to reserve for a request holding ``num_blocks``."""
    return num_blocks + config.growth_blocks


def pick_decode_instance(statuses: Sequence[InstanceStatus], roles: Mapping[str, str], num_blocks: int,
                         config: PDConfig, freeness_of: Any, promised: Mapping[str, int] | None = None,
                         exclude: str | None = None) -> str | None:
    """The hand-off destination for a request holding ``num_blocks``: among the ``decode``
    instances (not mixed ones: a hand-off into an instance that prefills waits behind its
    prefill steps), schedulable and not terminating, whose free blocks (beyond the watermark,
    less ``promised``: blocks of hand-offs started since their last report) hold it and
    ``growth_blocks`` more, the highest ``freeness_of(status)``; ties by id. None: the
    decode pool is full. ``freeness_of``: the caller's freeness (Algorithm 1's)."""
    need = handoff_blocks(num_blocks, config)
    best: tuple[float, str] | None = None
    for s in statuses:
        iid = s.instance_id
        if iid == exclude or roles.get(iid) != "decode" or s.is_terminating or not s.is_schedulable:
            continue
        room = s.num_free_blocks - s.num_watermark_blocks - (promised or {}).get(iid, 0)
        if room < need:
            continue
        f = float(freeness_of(s))
        if best is None or f > best[0] or (f == best[0] and iid < best[1]):
            best = (f, iid)
    return None if best is None else best[1]


def queue_moves(loads: Mapping[str, int], queued: Mapping[str, Sequence[tuple[str, int]]],
                max_moves: int) -> list[tuple[str, str, str]]:
    """Moves ``(request_id, src, dst)`` of queued prompts among the prefill-taking
    instances (``rebalance_queued``). ``loads``: each one's queued prefill tokens;
    ``queued``: its movable prompts in queue order, ``(request_id, tokens)``. The last
    queued prompt of the most loaded instance that has one goes to the least loaded
    while that instance's load plus the prompt stays below the source's: each move
    lowers the sum of squared loads, so none is ever undone."""
    loads = dict(loads)
    queues = {i: list(q) for i, q in queued.items()}
    moves: list[tuple[str, str, str]] = []
    while len(moves) < max_moves and loads:
        dst = min(loads, key=lambda i: (loads[i], i))
        srcs = [i for i in loads if queues.get(i)]
        if not srcs:
            break
        src = max(srcs, key=lambda i: (loads[i], i))
        rid, tokens = queues[src][-1]
        if src == dst or loads[dst] + tokens >= loads[src]:
            break
        queues[src].pop()
        loads[src] -= tokens
        loads[dst] += tokens
        moves.append((rid, src, dst))
    return moves


# -- adaptive PD -------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleChange:
    instance_id: str
    role: str
    """The new role."""
    reason: str
    """lend | reclaim | flip."""

    @property
    def is_flip(self) -> bool:
        return self.reason == "flip"


@dataclass(frozen=True)
class PoolView:
    """What adaptive PD reads at one round: each instance's role, the time it took it,
    its queued prefill tokens and its freeness (Algorithm 1's, from its status)."""

    roles: Mapping[str, str]
    role_since: Mapping[str, float]
    queued_tokens: Mapping[str, int]
    freeness: Mapping[str, float]
    num_waiting_handoffs: int = 0
    """Requests with their first token still on a prefill instance (the decode pool had
    no room for them, or their hand-off has not started yet)."""

    def ids(self, *roles: str) -> list[str]:
        return sorted(i for i, r in self.roles.items() if r in roles)

    @property
    def prefill_pressure(self) -> float:
        """Queued prefill tokens per prefill-taking instance."""
        takers = self.ids(*TAKES_PREFILL)
        return sum(self.queued_tokens.get(i, 0) for i in takers) / max(1, len(takers))

    @property
    def decode_room(self) -> float:
        """Mean freeness of the ``decode`` instances (inf with none)."""
        dec = self.ids("decode")
        return sum(self.freeness.get(i, 0.0) for i in dec) / len(dec) if dec else float("inf")


def adaptive_decisions(view: PoolView, config: PDConfig, now: float,
                       last_change: float | None) -> list[RoleChange]:
    """This round's role changes (module docstring), none within ``cooldown_s`` of the last:
    up to ``max_lends_per_round`` lends, else at most one reclaim or flip."""
    if config.mode != "adaptive" or (last_change is not None and now - last_change < config.cooldown_s):
        return []
    pressure, room = view.prefill_pressure, view.decode_room
    has_room = room >= config.decode_room_freeness and view.num_waiting_handoffs == 0
    decode, mixed, prefill = view.ids("decode"), view.ids("mixed"), view.ids("prefill")
    if pressure > config.lend_above_tokens:
        old = [i for i in mixed if now - view.role_since.get(i, now) >= config.flip_after_s]
        if old and has_room and len(decode) >= config.min_decode:
            return [RoleChange(min(old, key=lambda i: (view.role_since.get(i, now), i)), "prefill", "flip")]
        if has_room and len(decode) > config.min_decode:
            n = min(_num_to_lend(view, config), len(decode) - config.min_decode, config.max_lends_per_round)
            freest = sorted(decode, key=lambda i: (view.freeness.get(i, 0.0), i), reverse=True)
            return [RoleChange(i, "mixed", "lend") for i in freest[:max(1, n)]]
        return []
    if pressure < config.reclaim_below_tokens:
        # only once its own prompts are done: a hand-off into it must not wait behind one
        held = [i for i in mixed if now - view.role_since.get(i, now) >= config.reclaim_after_s
                and view.queued_tokens.get(i, 0) == 0]
        if held:  # none has prompts queued: the first by id
            return [RoleChange(min(held), "decode", "reclaim")]
        tight = room < config.decode_tight_freeness or view.num_waiting_handoffs > 0
        if not mixed and tight and len(prefill) > config.min_prefill:
            least = min(prefill, key=lambda i: (view.queued_tokens.get(i, 0), i))
            return [RoleChange(least, "decode", "flip")]
    return []


def _num_to_lend(view: PoolView, config: PDConfig) -> int:
    """Lends that bring the queued prefill tokens per prefill-taking instance down to
    ``lend_above_tokens`` (with the queue spread over the new takers too)."""
    takers = view.ids(*TAKES_PREFILL)
    total = sum(view.queued_tokens.get(i, 0) for i in takers)
    return max(1, -(-total // config.lend_above_tokens) - len(takers))
