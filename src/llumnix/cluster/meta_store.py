"""Cluster Meta Store: the latest status of every instance, for LlumSched to read.

In-process by default; Redis when several gateways or schedulers must share one
view. Statuses are JSON on the wire so any language can read them.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol

from llumnix.core.status import InstanceStatus, RequestBrief


def status_to_json(status: InstanceStatus) -> str:
    d = dataclasses.asdict(status)
    del d["evicted_prefix_keys"]  # an event of one report, not the instance's state
    return json.dumps(d, separators=(",", ":"))


def status_from_json(text: str | bytes) -> InstanceStatus:
    d: dict[str, Any] = json.loads(text)
    known = {f.name for f in dataclasses.fields(InstanceStatus)}
    brief_known = {f.name for f in dataclasses.fields(RequestBrief)}
    for key in ("running", "waiting"):
        d[key] = tuple(RequestBrief(**{k: v for k, v in b.items() if k in brief_known})
                       for b in d.get(key, ()))
    return InstanceStatus(**{k: v for k, v in d.items() if k in known})


class MetaStore(Protocol):
    def put_status(self, status: InstanceStatus) -> None: ...

    def get_status(self, instance_id: str) -> InstanceStatus | None: ...

    def all_statuses(self) -> dict[str, InstanceStatus]: ...

    def remove(self, instance_id: str) -> None: ...


class MemoryMetaStore:
    def __init__(self) -> None:
        self._statuses: dict[str, InstanceStatus] = {}

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
    """Statuses in one Redis hash: ``{prefix}:status`` maps instance id to JSON."""

    def __init__(self, url: str, prefix: str = "llumnix") -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._key = f"{prefix}:status"
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


def make_meta_store(url: str | None) -> MemoryMetaStore | RedisMetaStore:
    """None or 'memory' -> in-process; 'redis://host:port[/db]' -> Redis."""
    if url is None or url == "memory":
        return MemoryMetaStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisMetaStore(url)
    raise ValueError(f"--cms must be 'memory' or a redis:// URL, not {url!r}")
