"""An instance's migrations out: its channels to destinations (one per transport and
destination, reopened after a transport error), one named request moved on demand
(benchmarks, admin, PD hand-offs), and a rescheduling round's moves to one destination
while the paper's pairing rule holds (or, for an order that names its request, a rescue's,
that request alone). The destination is another instance actor, reached
through ``RemoteDestination``'s Ray calls."""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from llumnix.core.status import InstanceStatus
from llumnix.migration import reasons
from llumnix.migration.protocol import MigrationConfig, MigrationReport
from llumnix.policy import Llumlet


class RemoteDestination:
    """The Destination protocol over Ray calls to another instance actor."""

    def __init__(self, instance_id: str, actor: Any) -> None:
        self.instance_id = instance_id
        self._actor = actor

    def try_reserve(self, request_id: str, num_blocks: int) -> list[int] | None:
        blocks: list[int] | None = ray.get(self._actor.mig_try_reserve.remote(request_id, num_blocks), timeout=30)
        return blocks

    def try_reserve_with_cache(self, request_id: str, keys: list[bytes]) -> tuple[int, list[int]] | None:
        got: tuple[int, list[int]] | None = ray.get(self._actor.mig_try_reserve_with_cache.remote(request_id, keys),
                                                    timeout=30)
        return got

    def release(self, request_id: str) -> int:
        return int(ray.get(self._actor.mig_release.remote(request_id), timeout=30))

    def install(self, snapshot: Any) -> float:
        return float(ray.get(self._actor.mig_install.remote(snapshot), timeout=30))

    def first_step(self, request_id: str, timeout_s: float) -> tuple[float, float] | None:
        got: tuple[float, float] | None = ray.get(self._actor.mig_first_step.remote(request_id, timeout_s),
                                                  timeout=timeout_s + 30)
        return got


class MigrationSource:
    def __init__(self, server: Any, llumlet: Llumlet, migration_config: Any, transport: str,
                 transport_options: Any, token: bytes, on_report: Callable[[dict[str, Any]], None]) -> None:
        self.server = server
        self.llumlet = llumlet
        self.migration_config = migration_config
        self.transport = transport
        self.transport_options = transport_options
        self._token = token
        self._on_report = on_report
        """Each migration of a round as it ends (to LlumSched's history, not at the round's end)."""
        self._senders: dict[tuple[str, str], Any] = {}
        self._senders_lock = threading.Lock()  # PD hand-offs run migrations side by side
        self._migrating = threading.Lock()

    def _sender(self, dst_instance_id: str, dst: Any, transport: str | None = None) -> Any:
        from llumnix.migration.transports import connect

        key = (transport or self.transport, dst_instance_id)
        with self._senders_lock:
            if key not in self._senders:
                self._senders[key] = connect(key[0], dst, self._token, self.transport_options)
            return self._senders[key]

    def _drop_if_broken(self, rep: Any, dst_instance_id: str, transport: str | None = None) -> None:
        if not rep.committed and (rep.abort_reason or "").startswith("TransportError"):
            with contextlib.suppress(Exception):  # the channel broke: reconnect next time
                self._senders.pop((transport or self.transport, dst_instance_id)).close()

    def migrate_request(self, request_id: str, dst_instance_id: str, dst: Any,
                        overrides: dict[str, Any] | None = None, transport: str | None = None,
                        exclusive: bool = True) -> dict[str, Any]:
        """Migrate one named request; returns its report. ``exclusive`` False (PD
        hand-offs, several in flight): beside other migrations out of here."""
        from llumnix.migration.driver import migrate

        cfg = dataclasses.replace(self.migration_config, **(overrides or {}))
        with self._migrating if exclusive else contextlib.nullcontext():
            sender = self._sender(dst_instance_id, dst, transport)
            rep = migrate(request_id, self.server, RemoteDestination(dst_instance_id, dst), sender, cfg)
            self._drop_if_broken(rep, dst_instance_id, transport)
        return dataclasses.asdict(rep)

    def migrate_out(self, dst_instance_id: str, dst: Any, overrides: dict[str, Any] | None = None,
                    named: str | None = None) -> list[dict[str, Any]]:
        """Migrate requests to ``dst`` one at a time while the pairing holds (the paper's
        rule, ``policy.rounds.keep_migrating``, as in the simulator); returns the reports.
        ``overrides``: MigrationConfig fields for this round (benchmarks). ``named``: the
        request the order names (a rescue): that one only, if it can still move
        (``policy.rounds.why_not_named``; else the round's one report says why)."""
        marks = {"order_received": time.monotonic()}  # the report's clock: where its start's wait began
        if not self._migrating.acquire(blocking=False):
            return []  # one migration out at a time
        reports: list[dict[str, Any]] = []
        picked: list[str] = []
        try:
            cfg = dataclasses.replace(self.migration_config, **(overrides or {}))
            self._round(dst_instance_id, dst, reports, picked, cfg, marks, named)
            return reports
        except Exception as e:  # noqa: BLE001 - a failed round is reported, never fatal
            for old in self._senders.values():
                with contextlib.suppress(Exception):
                    old.close()
            self._senders.clear()
            return [*reports, {"committed": False, "abort_reason": f"{type(e).__name__}: {e}",
                               "request_id": picked[0] if picked else None,
                               "src_instance_id": self.llumlet.instance_id, "dst_instance_id": dst_instance_id}]
        finally:
            self._migrating.release()

    def _round(self, dst_instance_id: str, dst: Any, reports: list[dict[str, Any]], picked: list[str],
               cfg: MigrationConfig, marks: dict[str, float], named: str | None = None) -> None:
        """The moves of one round, appended to ``reports`` (``picked``: the one under way).
        With ``cfg.merge_boundaries`` the keep-migrating test, the pick and the start happen
        at one source boundary (``driver.migrate_next``); else each at a boundary of its own.
        The first pick and the chain's test are the simulator's (``Llumlet.select_for_order``,
        ``should_keep_migrating``)."""
        from llumnix.migration.driver import migrate, migrate_next

        sender = self._sender(dst_instance_id, dst)
        remote = RemoteDestination(dst_instance_id, dst)
        reads = named is None and self.llumlet.reads_destination
        dst_status = ray.get(dst.status.remote(), timeout=30) if reads else None
        num_in: int | None = None  # after a migration: others coming in at dst (keep migrating?)
        why: list[str] = []  # why a named request could not move
        while True:
            marks["dst_read"] = time.monotonic()

            def pick(d: InstanceStatus | None = dst_status, n: int | None = num_in) -> list[str]:
                now = time.time()
                if n is not None and d is not None and not self.llumlet.should_keep_migrating(now, d, n, named):
                    return []  # after a move: the chain's test (never after a named one)
                ids, no = self.llumlet.select_for_order(now, named, d)
                why[:] = [] if no is None else [no]
                return ids

            if cfg.merge_boundaries:
                got = migrate_next(pick, self.server, remote, sender, cfg, marks=marks)
                picked[:] = [] if got is None else [got.request_id]
            else:
                picked[:] = self.server.call(pick)
                got = migrate(picked[0], self.server, remote, sender, cfg, marks=marks) if picked else None
            if got is None:
                if why:
                    reports.append(self._not_moved(named, dst_instance_id, why[0]))
                    self._on_report(reports[-1])
                return
            rep, marks = got, {"order_received": time.monotonic()}  # the next one's wait begins
            reports.append(dataclasses.asdict(rep))
            self._on_report(reports[-1])
            self._drop_if_broken(rep, dst_instance_id)
            if not rep.committed:
                return
            if named is not None:
                return  # the request it named, and only it
            dst_status, num_in = ray.get([dst.status.remote(), dst.mig_num_reservations.remote()], timeout=30)

    def _not_moved(self, request_id: str | None, dst_instance_id: str, why: str) -> dict[str, Any]:
        """The report of an order whose named request could not move (``why``): nothing
        started on either side, nothing failed."""
        now, text = time.monotonic(), f"rescue order: {why}"
        return dataclasses.asdict(MigrationReport(
            request_id or "", self.llumlet.instance_id, dst_instance_id, committed=False, abort_reason=text,
            num_stages=0, num_blocks=0, num_bytes=0, downtime=None, duration=0.0, start_time=now, end_time=now,
            abort_code=reasons.of_report({"abort_reason": text})))
