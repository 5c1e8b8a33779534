"""Prefix-cache affinity at dispatch (not the paper's; ``llumnix`` with ``params: {prefix: true}``).

An instance's engine keeps the KV of the prompt prefixes it computed
(``kv/prefix_cache.py``), so a request whose prompt starts like one sent there
before (a shared system prompt, the earlier turns of a conversation) skips that
part of its prefill there, and nowhere else. LlumSched does not see the engines'
caches; it remembers where it sent each prompt instead (``PrefixIndex``): per
instance, the keys of the prompts' full blocks, chained as the engine chains them,
least recently sent forgotten first, at most as many as the instance has blocks.
Evictions inside the engine and migrations are not seen, so a remembered prefix
may be gone; a wrong guess costs one prefill, as a miss does without the option.

The pick (``affinity_pick``), over the candidates the filters left:

    freest   = what the policy's scores pick (Llumnix: the highest freeness)
    eligible = candidates with no queue and at most ``slack`` more requests
               (running, queued and just sent) than the least loaded candidate,
               whose remembered prefix is at least ``min_tokens`` longer than freest's
    pick     = the eligible one with the longest remembered prefix (ties: score, id),
               or freest when none is eligible

Why a request-count bound and not freeness: while memory is plentiful every
instance is about equally free, and freeness says nothing of how busy an instance
is in compute, so a popular prefix would pile onto one instance. With the bound it
stays on one instance until that instance holds ``slack`` more requests than the
least loaded one; then a request goes elsewhere, and that instance caches the
prefix too. Under memory pressure queues form, and queued instances are not
eligible, so Llumnix's freeness decides as without the option.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llumnix.core.status import InstanceStatus
from llumnix.kv.prefix_cache import ROOT, chain


@dataclass(frozen=True)
class PrefixOptions:
    slack: int = 4
    """Requests an instance may hold beyond the least loaded candidate and still be
    picked for its cached prefix."""
    min_tokens: int = 64
    """Prefix tokens a pick must save over the freest candidate's."""


def block_keys(prompt: Sequence[int], block_size: int) -> list[bytes]:
    """The keys of the prompt's full blocks, in order (as ``PrefixCache`` keys them)."""
    keys, key = [], ROOT
    for start in range(0, len(prompt) - block_size + 1, block_size):
        key = chain(key, prompt[start:start + block_size])
        keys.append(key)
    return keys


class PrefixIndex:
    """Per instance, the block keys of the prompts sent there, least recently sent first."""

    def __init__(self) -> None:
        self._sent: dict[str, OrderedDict[bytes, None]] = {}

    def matches(self, keys: list[bytes], instance_ids: Iterable[str]) -> dict[str, int]:
        """Per instance with a match: how many leading blocks of ``keys`` were sent there."""
        hits = {}
        for iid in instance_ids:
            sent = self._sent.get(iid)
            if not sent:
                continue
            n = 0
            for k in keys:
                if k not in sent:
                    break
                n += 1
            if n:
                hits[iid] = n
        return hits

    def record(self, instance_id: str, keys: list[bytes], capacity: int) -> None:
        """``keys`` were sent to the instance, which holds at most ``capacity`` blocks. The
        head is marked most recent, so a chain is forgotten from its tail: a lost head would
        make every block after it unreachable (matching stops at the first miss)."""
        sent = self._sent.setdefault(instance_id, OrderedDict())
        for k in reversed(keys):
            sent[k] = None
            sent.move_to_end(k)
        while len(sent) > capacity:
            sent.popitem(last=False)

    def remove(self, instance_id: str) -> None:
        self._sent.pop(instance_id, None)

    def size(self, instance_id: str) -> int:
        return len(self._sent.get(instance_id, ()))


def affinity_pick(cands: list[InstanceStatus], scores: list[float], hits: dict[str, int] | None,
                  options: PrefixOptions) -> InstanceStatus:
    """The candidate to dispatch to (``cands`` sorted by id; the rule in the module doc)."""
    best = max(scores)
    freest = cands[scores.index(best)]  # what max-score picks: the first best
    if not hits:
        return freest
    least = min(s.num_running + s.num_waiting for s in cands)
    base = hits.get(freest.instance_id, 0)
    eligible = [(-n, -v, k) for k, (s, v) in enumerate(zip(cands, scores, strict=True))
                if (n := hits.get(s.instance_id, 0)) > base
                and (n - base) * s.block_size >= options.min_tokens
                and s.num_waiting == 0 and s.num_running <= least + options.slack]
    return cands[min(eligible)[2]] if eligible else freest
