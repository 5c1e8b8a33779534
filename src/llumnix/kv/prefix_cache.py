"""Automatic prefix caching: full KV blocks found by their content, shared between
requests, and kept after the last request lets go of them until the space is needed.

A block's key is a hash chained over every token up to its end::

    key(block i) = blake2b(key(block i - 1) || tokens of block i)

so two sequences share block i exactly when they agree on all tokens up to its end
(a 128-bit digest: a false match is as likely as a random collision of two such
hashes). Only full blocks are keyed, and only once their KV is computed (the engine
calls ``KVManager.cache_computed`` after each step), so a hit never reads a slot a
running prefill is still writing. A request never writes into a keyed block: it
holds its prefix's blocks read-only and writes from the first position after them.

Keyed blocks carry a count of the tables that hold them; at zero they are
*evictable*: free for admission and freeness (they can be taken back at any time),
but still found by a lookup until an allocation takes them, least recently released
first. Blocks that are not keyed belong to exactly one table, as without the cache.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence

ROOT = b""
"""The key before the first block."""


def block_tokens(prompt: Sequence[int], output: Sequence[int], i: int, block_size: int) -> Sequence[int]:
    """Tokens of block ``i`` of the sequence prompt + output, without joining the two."""
    start, end, n = i * block_size, (i + 1) * block_size, len(prompt)
    if end <= n:
        return prompt[start:end]
    if start >= n:
        return output[start - n:end - n]
    return [*prompt[start:], *output[:end - n]]


def chain(parent: bytes, tokens: Sequence[int]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))  # 4 bytes per token, little-endian
    return h.digest()


def iter_keys(prompt: Sequence[int], output: Sequence[int], num_blocks: int, block_size: int) -> Iterator[bytes]:
    """The keys of the first ``num_blocks`` full blocks of prompt + output, in order,
    each hashed only when asked for (a lookup stops at its first miss)."""
    key = ROOT
    for i in range(num_blocks):
        key = chain(key, block_tokens(prompt, output, i, block_size))
        yield key


def sequence_keys(prompt: Sequence[int], output: Sequence[int], num_blocks: int, block_size: int) -> list[bytes]:
    """``iter_keys``, all of them."""
    return list(iter_keys(prompt, output, num_blocks, block_size))


class PrefixCache:
    def __init__(self, block_size: int, eviction_log: int = 0) -> None:
        self.block_size = block_size
        self.evicted: deque[bytes] = deque(maxlen=eviction_log)
        """Keys of the blocks evicted since the last ``take_evicted``, oldest first, at
        most ``eviction_log`` of them (the oldest are dropped): for a router that remembers
        where it sent each prefix, the ones an instance no longer holds."""
        self.by_key: dict[bytes, int] = {}
        self.key_of: dict[int, bytes] = {}
        self.refs: dict[int, int] = {}
        """Keyed block -> number of tables holding it (0: evictable)."""
        self.evictable: OrderedDict[int, None] = OrderedDict()
        """Keyed blocks no table holds, least recently released first."""
        self.progress: dict[str, tuple[int, bytes]] = {}
        """Request -> (its leading blocks already keyed or matched, the key of the last)."""
        self.num_queried_tokens = 0
        """Tokens of the sequences admitted with a lookup (the hit rate's denominator)."""
        self.num_hit_tokens = 0
        """Of those, tokens whose KV came from the cache."""
        self.num_extra_holds = 0
        """Holds of keyed blocks beyond each block's first: sum over blocks of (refs - 1)
        where refs >= 1. Summing every table's length counts shared blocks that many
        times more than the pool does."""

    def match(self, prompt: Sequence[int], output: Sequence[int]) -> tuple[list[int], bytes]:
        """The cached blocks that hold this sequence's leading tokens, longest run first
        to last, and the key of the last. At least the last token is left to compute:
        its step makes the logits of the next one."""
        return self.match_keys(self.lookup_keys(prompt, output))

    def lookup_keys(self, prompt: Sequence[int], output: Sequence[int]) -> Iterator[bytes]:
        """The keys a lookup of this sequence walks (lazily hashed): its full blocks but
        one token, which is always computed."""
        return iter_keys(prompt, output, (len(prompt) + len(output) - 1) // self.block_size, self.block_size)

    def match_keys(self, keys: Iterable[bytes]) -> tuple[list[int], bytes]:
        """``match`` for a sequence given by its block keys (``iter_keys``; a migration
        destination gets them from the source, where the tokens are)."""
        blocks: list[int] = []
        key = ROOT
        for k in keys:
            b = self.by_key.get(k)
            if b is None:
                break
            blocks.append(b)
            key = k
        return blocks, key

    def num_evictable_in(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.refs[b] == 0)

    def acquire(self, request_id: str, num_tokens: int, blocks: list[int], key: bytes) -> None:
        """A new table for ``num_tokens`` tokens starts with these matched blocks
        (``num_tokens`` 0: a migration's, which the admission hit rate leaves out)."""
        if num_tokens:
            self.num_queried_tokens += num_tokens
            self.num_hit_tokens += len(blocks) * self.block_size
        for b in blocks:
            if self.refs[b] == 0:
                del self.evictable[b]
            else:
                self.num_extra_holds += 1
            self.refs[b] += 1
        self.progress[request_id] = (len(blocks), key)

    def release(self, request_id: str, table: list[int]) -> list[int]:
        """A table lets go: its keyed blocks lose a holder (evictable at none); returns
        the blocks that are not keyed, for the pool. A table's blocks become evictable
        last first, so its tail is evicted before its head: evicting a head would leave
        every block after it unreachable (a lookup stops at the first miss)."""
        self.progress.pop(request_id, None)
        unkeyed = []
        for b in reversed(table):
            n = self.refs.get(b)
            if n is None:
                unkeyed.append(b)
            elif n == 1:
                self.refs[b] = 0
                self.evictable[b] = None
            else:
                self.refs[b] = n - 1
                self.num_extra_holds -= 1
        unkeyed.reverse()
        return unkeyed

    def evict(self) -> int:
        """Forget the least recently released block; returns it, for the pool."""
        b, _ = self.evictable.popitem(last=False)
        key = self.key_of.pop(b)
        del self.by_key[key]
        del self.refs[b]
        self.evicted.append(key)
        return b

    def take_evicted(self) -> list[bytes]:
        """The keys evicted since the last call and not cached again since, each once,
        oldest first; forgets them. A block evicted and then computed again (a request
        that needed it after all) is held: reporting it would make a router forget the
        prefix just where it is."""
        keys = list(dict.fromkeys(k for k in self.evicted if k not in self.by_key))
        self.evicted.clear()
        return keys

    def add(self, request_id: str, table: list[int], prompt: Sequence[int], output: Sequence[int],
            num_computed: int) -> None:
        """Key the table's full blocks whose KV is computed and not keyed yet. A block
        whose content another block already holds stays unkeyed (this table's own)."""
        done, key = self.progress.get(request_id, (0, ROOT))
        full = min(num_computed // self.block_size, len(table))
        for i in range(done, full):
            key = chain(key, block_tokens(prompt, output, i, self.block_size))
            b = table[i]
            if key not in self.by_key and b not in self.key_of:
                self.by_key[key] = b
                self.key_of[b] = key
                self.refs[b] = 1
        if full > done:
            self.progress[request_id] = (full, key)

    def check_invariants(self, holders: dict[int, int]) -> None:
        """``holders``: block -> number of tables that hold it."""
        assert len(self.by_key) == len(self.key_of) == len(self.refs), "cache maps disagree"
        assert all(self.key_of[b] == k for k, b in self.by_key.items()), "cache maps disagree"
        for b, n in self.refs.items():
            assert holders.get(b, 0) == n, f"block {b}: {n} holders counted, {holders.get(b, 0)} tables"
            assert (n == 0) == (b in self.evictable), f"block {b}: evictable iff no holder"
        for b, n in holders.items():
            assert n == 1 or b in self.refs, f"unkeyed block {b} is in {n} tables"
        assert self.num_extra_holds == sum(n - 1 for n in self.refs.values() if n), "extra holds miscounted"
