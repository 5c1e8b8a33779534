"""Prefix-cache affinity at dispatch (not the paper's; ``llumnix`` with ``params: {prefix: true}``).

An instance's engine keeps the KV of the prompt prefixes it computed
(``kv/prefix_cache.py``), so a request whose prompt starts like one sent there
before (a shared system prompt, the earlier turns of a conversation) skips that
part of its prefill there, and nowhere else. LlumSched does not see the engines'
caches; it remembers where it sent each prompt instead (``PrefixIndex``): per
instance, the keys of the prompts' full blocks, chained as the engine chains them,
least recently sent forgotten first, at most as many as the instance has blocks.
With ``dispatch.prefix_evictions`` every report also names the keys its engine
evicted since the previous one, and the index forgets them (llm-d's KV events do
the same for its precise scorer). Blocks a migration brings are not learned
(measured: it spreads hot prefixes; ``benchmarks/sim/beyond.md``), so a remembered
prefix may still be gone; a wrong guess costs one prefill, as a miss does without
the option.

The pick (``affinity_pick``), over the candidates the filters left:

    freest   = what the policy's scores pick (Llumnix: the highest freeness)
    eligible = candidates with at most max(``slack``, ``slack_ratio`` x freest's)
               more requests (running, queued and just sent) than freest, whose
               remembered prefix is at least ``min_tokens`` longer than freest's
    pick     = the eligible one with the longest remembered prefix (ties: score, id),
               or freest when none is eligible

Why a request-count bound and not freeness: while memory is plentiful every
instance is about equally free, and freeness says nothing of how busy an instance
is in compute, so a popular prefix would pile onto one instance. With the bound it
stays on one instance until that instance holds ``slack`` more requests than the
one freeness would pick; then a request goes there, and that instance caches the
prefix too. Queued requests count like running ones: under load every instance
queues, and then the cache matters most, since every hit is prefill work and
memory the cluster does not spend (an earlier rule that refused instances with a
queue lost most hits exactly there; ``benchmarks/sim/prefix.yaml``). The bound is
against freest, not the least loaded instance, because freest is where the request
would go without affinity: what affinity costs is the difference between the two
(and it keeps a dispatch from scanning every instance).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from llumnix.core.status import InstanceStatus
from llumnix.kv.prefix_cache import sequence_keys


@dataclass(frozen=True)
class PrefixOptions:
    slack: int = 4
    """Requests an instance may hold beyond the freest candidate and still be picked for
    its cached prefix."""
    slack_ratio: float = 0.0
    """The slack grows with load: at least this many times the freest candidate's own
    requests (running and queued). Under load a cache hit saves the most (prefill compute
    and memory the cluster is short of), and a gap of a few requests means less."""
    min_tokens: int = 64
    """Prefix tokens a pick must save over the freest candidate's."""


def block_keys(prompt: Sequence[int], block_size: int) -> list[bytes]:
    """The keys of the prompt's full blocks, in order (as ``PrefixCache`` keys them)."""
    return sequence_keys(prompt, (), len(prompt) // block_size, block_size)


_NONE: frozenset[str] = frozenset()


class PrefixIndex:
    """Per instance, the block keys of the prompts sent there, least recently sent first,
    each with the time it was last sent."""

    def __init__(self) -> None:
        self._sent: dict[str, OrderedDict[bytes, float]] = {}
        self._holders: dict[bytes, set[str]] = {}
        """Key -> the instances it was sent to: a lookup touches only those."""
        self.num_forgotten: dict[str, int] = {}
        """Per instance, keys forgotten because it reported them evicted."""

    def matches(self, keys: list[bytes]) -> dict[str, int]:
        """Per instance with a match: how many leading blocks of ``keys`` were sent there."""
        hits: dict[str, int] = {}
        current = set(self._holders.get(keys[0], ())) if keys else set()
        depth = 1  # every instance in ``current`` was sent keys[:depth]
        while current and depth < len(keys):
            still = current & self._holders.get(keys[depth], _NONE)
            for iid in current - still:
                hits[iid] = depth
            current, depth = still, depth + 1
        for iid in current:
            hits[iid] = depth
        return hits

    def record(self, instance_id: str, keys: list[bytes], capacity: int, now: float = 0.0) -> None:
        """``keys`` were sent to the instance at ``now``; it holds at most ``capacity``
        blocks. The head is marked most recent, so a chain is forgotten from its tail: a
        lost head would make every block after it unreachable (matching stops at the first
        miss)."""
        sent = self._sent.setdefault(instance_id, OrderedDict())
        for k in reversed(keys):
            if k in sent:
                sent.move_to_end(k)
            else:
                self._holders.setdefault(k, set()).add(instance_id)
            sent[k] = now
        while len(sent) > capacity:
            self._forget(instance_id, sent.popitem(last=False)[0])

    def forget_evicted(self, instance_id: str, keys: Sequence[bytes], since: float) -> int:
        """The instance evicted ``keys`` after ``since`` (its previous report). A key sent
        there after ``since`` is kept: the eviction may have come first, and the request
        sent will store the block again. Returns how many keys were forgotten."""
        sent = self._sent.get(instance_id)
        if not sent:
            return 0
        n = 0
        for k in keys:
            t = sent.get(k)
            if t is not None and t <= since:
                del sent[k]
                self._forget(instance_id, k)
                n += 1
        if n:
            self.num_forgotten[instance_id] = self.num_forgotten.get(instance_id, 0) + n
        return n

    def _forget(self, instance_id: str, key: bytes) -> None:
        holders = self._holders[key]
        holders.discard(instance_id)
        if not holders:
            del self._holders[key]

    def remove(self, instance_id: str) -> None:
        for k in self._sent.pop(instance_id, ()):
            self._forget(instance_id, k)
        self.num_forgotten.pop(instance_id, None)

    def size(self, instance_id: str) -> int:
        return len(self._sent.get(instance_id, ()))


def affinity_choice(freest: InstanceStatus, matched: Sequence[tuple[InstanceStatus, float]],
                    hits: dict[str, int], options: PrefixOptions) -> InstanceStatus:
    """The rule in the module doc. ``freest``: what the policy's scores pick; ``matched``:
    (candidate, its score, higher is better) for the candidates with a match, in id order."""
    base = hits.get(freest.instance_id, 0)
    load = freest.num_running + freest.num_waiting
    limit = load + max(options.slack, options.slack_ratio * load)
    best: tuple[tuple[int, float], InstanceStatus] | None = None
    for s, v in matched:
        n = hits[s.instance_id]
        if n <= base or (n - base) * s.block_size < options.min_tokens or s.num_running + s.num_waiting > limit:
            continue
        key = (-n, -v)
        if best is None or key < best[0]:  # strict: ties keep the lower id
            best = (key, s)
    return freest if best is None else best[1]


def affinity_pick(cands: list[InstanceStatus], scores: list[float], hits: dict[str, int] | None,
                  options: PrefixOptions) -> InstanceStatus:
    """The ``prefix-affinity`` picker over a pipeline's candidates (sorted by id) and scores."""
    freest = cands[scores.index(max(scores))]  # what max-score picks: the first best
    if not hits:
        return freest
    matched = [(s, v) for s, v in zip(cands, scores, strict=True) if s.instance_id in hits]
    return affinity_choice(freest, matched, hits, options)
