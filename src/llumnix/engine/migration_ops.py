"""The engine operations live migration is built from.

Each keeps the block accounting exact. The engine steps synchronously, so
any call made between two ``step()`` calls happens at a step boundary.

Source side: ``pause_request`` (out of the batch, blocks kept),
``block_table``/``blocks_since``, ``resume_request`` after an abort, and
``remove_request`` once the destination has committed.
Destination side: ``try_reserve_with_cache`` (the first pre-copy stage's reservation,
starting with the blocks this prefix cache already holds), ``try_reserve``,
``release_reservation``, ``install_request`` (with a hook told when the request's
first step here begins: where a migration's downtime ends).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llumnix.core.errors import InvalidRequestError, UnknownRequestError
from llumnix.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from llumnix.core.batch import SchedulerOutput
    from llumnix.core.clock import Clock
    from llumnix.engine.scheduler import LocalScheduler
    from llumnix.kv.kv_manager import KVManager


class MigrationOpsMixin:
    kv: KVManager
    scheduler: LocalScheduler
    requests: dict[str, Request]
    clock: Clock
    _first_step_hooks: dict[str, Callable[[float | None], None]]
    """Installed requests not yet in a step here -> what to tell when one is (or leaves)."""

    def _held(self, request_id: str) -> Request:
        try:
            return self.requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

    # -- source ------------------------------------------------------------
    def pause_request(self, request_id: str) -> None:
        req = self._held(request_id)
        if req.status != RequestStatus.RUNNING:
            raise InvalidRequestError(f"{request_id} is {req.status.name}, not RUNNING")
        self.scheduler.running.remove(req)
        req.status = RequestStatus.PAUSED
        self.scheduler.paused[request_id] = req

    def resume_request(self, request_id: str) -> None:
        req = self._held(request_id)
        if req.status != RequestStatus.PAUSED:
            raise InvalidRequestError(f"{request_id} is {req.status.name}, not PAUSED")
        del self.scheduler.paused[request_id]
        req.status = RequestStatus.RUNNING
        self.scheduler.running.append(req)

    def block_table(self, request_id: str) -> list[int]:
        return list(self.kv.block_table(request_id))

    def blocks_since(self, request_id: str, num_blocks_sent: int, *, full_only: bool = False) -> list[int]:
        """Blocks of the table after the first ``num_blocks_sent``.

        A pre-copy stage runs while the request keeps decoding, so it sends only
        *full* blocks (every slot computed); the block being written to is sent
        by the last stage, once the request is paused::

            table  [b0 b1 b2 | b3 b4 | b5~]      ~ = partially filled
                    stage 1   stage 2  last stage
        """
        table = self.kv.block_table(request_id)
        end = len(table)
        if full_only:
            end = min(end, self._held(request_id).num_computed_tokens // self.kv.block_size)
        return list(table[num_blocks_sent:end])

    def remove_request(self, request_id: str) -> Request:
        """Drop a request that now lives elsewhere; frees its blocks, emits nothing."""
        req = self.requests.pop(request_id, None)
        if req is None:
            raise UnknownRequestError(request_id)
        self.scheduler.remove(req)
        self.kv.free(request_id)
        self.drop_first_step_hook(request_id)
        return req

    # -- destination -----------------------------------------------------------
    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        """Reserve blocks for an incoming request, or None if it would cross the watermark."""
        if request_id in self.requests or not self.kv.can_reserve(num_blocks):
            return None
        return self.kv.reserve(request_id, num_blocks)

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        """Reserve for an incoming request's full blocks, given their keys: the leading
        ones this prefix cache holds are adopted (their KV need not travel), fresh blocks
        are reserved for the rest. Returns (blocks adopted, the fresh ones), or None
        (nothing reserved) if that would cross the watermark."""
        if request_id in self.requests or self.kv.has(request_id):
            return None
        n = self.kv.reserve_cached(request_id, keys)
        rest = len(keys) - n
        if rest and not self.kv.can_reserve(rest):
            self.kv.free(request_id)
            return None
        return n, (self.kv.reserve(request_id, rest) if rest else [])

    def release_reservation(self, request_id: str) -> int:
        if not self.kv.is_reserved(request_id):
            return 0
        return self.kv.free(request_id)

    def install_request(self, req: Request, on_first_step: Callable[[float | None], None] | None = None) -> None:
        """Resume a migrated request here. Its KV must already sit in its reservation.
        ``on_first_step(now)``: called when the first step here that computes it begins
        (with None if it leaves first), the end of its migration's downtime."""
        if req.request_id in self.requests:
            raise InvalidRequestError(f"request {req.request_id} is already here")
        if req.num_computed_tokens == 0:
            self.release_reservation(req.request_id)  # queued: metadata only
            req.num_migrations += 1
            self.requests[req.request_id] = req
            self.scheduler.enqueue(req)
            return
        if not self.kv.is_reserved(req.request_id):
            raise UnknownRequestError(f"no reservation for {req.request_id}")
        need = self.kv.num_blocks_for(req.num_computed_tokens)
        have = self.kv.num_blocks_of(req.request_id)
        if have < need:
            raise InvalidRequestError(f"{req.request_id}: {have} blocks reserved, {need} needed")
        self.kv.commit_reservation(req.request_id)
        req.status = RequestStatus.RUNNING
        req.num_migrations += 1
        self.requests[req.request_id] = req
        self.scheduler.running.append(req)
        if on_first_step is not None:
            self._first_step_hooks[req.request_id] = on_first_step

    def run_first_step_hooks(self, batch: SchedulerOutput) -> None:
        """At the start of a step: tell the installed requests in ``batch`` that they run."""
        now = self.clock.now()
        for rid in batch.request_ids:
            hook = self._first_step_hooks.pop(rid, None)
            if hook is not None:
                hook(now)

    def drop_first_step_hook(self, request_id: str) -> None:
        hook = self._first_step_hooks.pop(request_id, None)
        if hook is not None:
            hook(None)
