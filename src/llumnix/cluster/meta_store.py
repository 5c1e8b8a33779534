"""Cluster Meta Store (CMS): the latest status of every instance and the members.

In memory by default, inside LlumSched, whose scheduler state is then the view (no copies
on the hot path). With Redis, the store is the cluster's source of truth: every llumlet
writes its own status there (on each load change and at a heartbeat), LlumSched syncs its
view from it and keeps the members there, so a restarted LlumSched resumes from it at
once, and a second gateway reads the same view (``/admin/cluster``, its fallback dispatch)
while LlumSched is away. Statuses are JSON on the wire so any language can read them.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy import FreenessConfig, freeness

log = logging.getLogger(__name__)


def redact_url(url: str) -> str:
    """``url`` without its password (and user name), for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def status_to_json(status: InstanceStatus) -> str:
    d = dataclasses.asdict(status)
    del d["evicted_prefix_keys"], d["step_samples"]  # events of one report, not the instance's state
    return json.dumps(d, separators=(",", ":"))


def status_summary(status: InstanceStatus, fcfg: FreenessConfig, now: float) -> dict[str, Any]:
    """One instance as ``/admin/cluster`` lists it, from its status (LlumSched's view, or
    the store's when a gateway reads it while LlumSched is away)."""
    return {"instance_id": status.instance_id, "freeness": freeness(status, fcfg),
            "num_running": status.num_running, "num_waiting": status.num_waiting,
            "num_used_blocks": status.num_used_blocks, "num_total_blocks": status.num_total_blocks,
            "block_size": status.block_size,
            "is_terminating": status.is_terminating, "is_schedulable": status.is_schedulable,
            "age_s": now - status.timestamp,
            # cumulative since the instance started (Prometheus counters at the gateway)
            "num_preemptions": status.num_preemptions,
            "num_prefix_cache_queries": status.num_prefix_cache_queries,
            "num_prefix_cache_hits": status.num_prefix_cache_hits,
            **status.extra}  # a paced engine's counts (engine/pace.py)


def status_from_json(text: str | bytes) -> InstanceStatus:
    d: dict[str, Any] = json.loads(text)
    known = {f.name for f in dataclasses.fields(InstanceStatus)}
    brief_known = {f.name for f in dataclasses.fields(RequestBrief)}
    for key in ("running", "waiting"):
        d[key] = tuple(RequestBrief(**{k: v for k, v in b.items() if k in brief_known})
                       for b in d.get(key, ()))
    return InstanceStatus(**{k: v for k, v in d.items() if k in known})


class MetaStore(Protocol):
    """Each instance's latest status, and the members: instance id -> a small record
    (its actor's name, where a process that lost its handles finds it again)."""

    def put_status(self, status: InstanceStatus) -> None: ...

    def get_status(self, instance_id: str) -> InstanceStatus | None: ...

    def all_statuses(self) -> dict[str, InstanceStatus]: ...

    def remove(self, instance_id: str) -> None: ...

    def put_member(self, instance_id: str, record: dict[str, Any]) -> None: ...

    def remove_member(self, instance_id: str) -> None: ...

    def members(self) -> dict[str, dict[str, Any]]: ...


class MemoryMetaStore:
    def __init__(self) -> None:
        self._statuses: dict[str, InstanceStatus] = {}
        self._members: dict[str, dict[str, Any]] = {}

    def put_member(self, instance_id: str, record: dict[str, Any]) -> None:
        self._members[instance_id] = dict(record)

    def remove_member(self, instance_id: str) -> None:
        self._members.pop(instance_id, None)

    def members(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self._members.items()}

    def put_status(self, status: InstanceStatus) -> None:
        # A late report must never overwrite a newer one.
        old = self._statuses.get(status.instance_id)
        if old is None or status.timestamp >= old.timestamp:
            self._statuses[status.instance_id] = status

    def get_status(self, instance_id: str) -> InstanceStatus | None:
        return self._statuses.get(instance_id)

    def all_statuses(self) -> dict[str, InstanceStatus]:
        return dict(self._statuses)

    def remove(self, instance_id: str) -> None:
        self._statuses.pop(instance_id, None)


# Compare-and-set by timestamp inside Redis, so concurrent writers keep the newest.
_PUT_IF_NEWER = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local t = cjson.decode(old)['timestamp']
  if t > tonumber(ARGV[3]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class RedisMetaStore:
    """Statuses in one Redis hash: ``{prefix}:status`` maps instance id to JSON. Every
    operation times out (``timeout_s``); a caller on a latency path writes through a
    ``StoreWriter`` instead of waiting on Redis."""

    def __init__(self, url: str, prefix: str = "llumnix", timeout_s: float = 1.0) -> None:
        import redis

        self.url = redact_url(url)
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._key = f"{prefix}:status"
        self._members_key = f"{prefix}:members"
        self._put = self._redis.register_script(_PUT_IF_NEWER)

    def ping(self) -> bool:
        return bool(self._redis.ping())

    def put_status(self, status: InstanceStatus) -> None:
        self._put(keys=[self._key], args=[status.instance_id, status_to_json(status), status.timestamp])

    def get_status(self, instance_id: str) -> InstanceStatus | None:
        raw = self._redis.hget(self._key, instance_id)
        return None if raw is None else status_from_json(raw)

    def all_statuses(self) -> dict[str, InstanceStatus]:
        raw = self._redis.hgetall(self._key)
        return {k.decode() if isinstance(k, bytes) else k: status_from_json(v) for k, v in raw.items()}

    def remove(self, instance_id: str) -> None:
        self._redis.hdel(self._key, instance_id)

    def put_member(self, instance_id: str, record: dict[str, Any]) -> None:
        self._redis.hset(self._members_key, instance_id, json.dumps(record, separators=(",", ":")))

    def remove_member(self, instance_id: str) -> None:
        self._redis.hdel(self._members_key, instance_id)

    def members(self) -> dict[str, dict[str, Any]]:
        raw = self._redis.hgetall(self._members_key)
        return {k.decode() if isinstance(k, bytes) else k: json.loads(v) for k, v in raw.items()}


def make_meta_store(url: str | None) -> MemoryMetaStore | RedisMetaStore:
    """None or 'memory' -> in-process; 'redis://host:port[/db]' -> Redis."""
    if url is None or url == "memory":
        return MemoryMetaStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisMetaStore(url)
    raise ValueError(f"--cms must be 'memory' or a redis:// URL, not {redact_url(url)!r}")


class StoreWriter:
    """Writes to a remote store from a thread of its own, so no caller waits on it: the
    newest status of each instance (and removals) wait in a map, coalesced, until the
    store takes them. While the store is unreachable (hung, restarting) the newest ones
    are kept and written once it is back; one log line when it goes, one when it is back.

    A restarted Redis comes back empty: the statuses pushed after that rewrite it."""

    def __init__(self, store: RedisMetaStore, retry_s: float = 0.5) -> None:
        self.store = store
        self.retry_s = retry_s
        self._pending: dict[str, InstanceStatus | None] = {}  # None: remove the instance
        self._pending_members: dict[str, dict[str, Any] | None] = {}  # None: remove the member
        self._members: dict[str, dict[str, Any]] = {}  # every member this writer keeps in the store
        self.member_refresh_s = 5.0
        self._members_written_at = 0.0
        self._cv = threading.Condition()
        self.is_reachable = True
        self.num_written = 0
        self.num_failures = 0
        self._closed = False
        self._busy = False  # a batch is being written
        threading.Thread(target=self._run, daemon=True, name="cms-writer").start()

    def put_status(self, status: InstanceStatus) -> None:
        with self._cv:
            old = self._pending.get(status.instance_id)
            if old is None or status.timestamp >= old.timestamp:
                self._pending[status.instance_id] = status
            self._cv.notify()

    def remove(self, instance_id: str) -> None:
        with self._cv:
            self._pending[instance_id] = None
            self._cv.notify()

    def put_member(self, instance_id: str, record: dict[str, Any]) -> None:
        with self._cv:
            self._members[instance_id] = dict(record)
            self._pending_members[instance_id] = dict(record)
            self._cv.notify()

    def remove_member(self, instance_id: str) -> None:
        with self._cv:
            self._members.pop(instance_id, None)
            self._pending_members[instance_id] = None
            self._cv.notify()

    def _rewrite_members(self) -> None:
        """Membership records are written once, so a Redis restarted (empty) in between
        would lose them: they are written again when the store comes back and every
        ``member_refresh_s``. (Statuses need nothing: every push rewrites its own.)"""
        with self._cv:
            for iid, record in self._members.items():
                self._pending_members.setdefault(iid, dict(record))

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every pending write is in the store (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while (self._pending or self._pending_members or self._busy) and time.monotonic() < deadline:
                self._cv.wait(0.05)
            return not (self._pending or self._pending_members or self._busy)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            if self._members and time.monotonic() - self._members_written_at > self.member_refresh_s:
                self._members_written_at = time.monotonic()
                self._rewrite_members()
            with self._cv:
                while not self._pending and not self._pending_members and not self._closed:
                    self._cv.wait(self.member_refresh_s if self._members else None)
                    if self._members and time.monotonic() - self._members_written_at > self.member_refresh_s:
                        break
                if self._closed:
                    return
                batch, self._pending = self._pending, {}
                members, self._pending_members = self._pending_members, {}
                self._busy = True
            try:
                for iid, record in list(members.items()):
                    if record is None:
                        self.store.remove_member(iid)
                    else:
                        self.store.put_member(iid, record)
                    del members[iid]
                for iid, status in list(batch.items()):
                    if status is None:
                        self.store.remove(iid)
                    else:
                        self.store.put_status(status)
                    del batch[iid]
                    self.num_written += 1
            except Exception as e:  # noqa: BLE001 - any Redis failure: keep the newest, retry
                with self._cv:
                    for iid, record in members.items():  # unwritten, and nothing newer came
                        self._pending_members.setdefault(iid, record)
                self._on_failure(batch, e)
                with self._cv:
                    self._busy = False
                time.sleep(self.retry_s)
                continue
            if not self.is_reachable:
                self.is_reachable = True
                log.warning("meta store %s is reachable again; statuses are written again", self.store.url)
                self._rewrite_members()
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def _on_failure(self, batch: dict[str, InstanceStatus | None], e: Exception) -> None:
        self.num_failures += 1
        with self._cv:
            for iid, status in batch.items():  # a newer one that arrived meanwhile wins
                self._pending.setdefault(iid, status)
        if self.is_reachable:
            self.is_reachable = False
            log.warning("meta store %s is unreachable (%s); scheduling goes on from this process's view and "
                        "the newest statuses are written when it is back", self.store.url, type(e).__name__)
