"""KV transfer through Ray's object store: the source puts the gathered blocks
(one gather, one copy into shared memory), the destination actor reads them
zero-copy and scatters them once. Authentication is Ray's: only callers inside
the cluster can invoke the destination actor."""
from __future__ import annotations

import threading
from typing import Any

from llumnix.migration.transport import BulkWorker, KVSource, TransportError, TransportOptions


class RaySender:
    name = "ray"

    def __init__(self, dst_actor: Any, options: TransportOptions | None = None) -> None:
        """``dst_actor`` has ``mig_write_kv(request_id, block_ids, [ref], urgent)`` (``InstanceActor``)."""
        self._actor = dst_actor
        self._options = options or TransportOptions()
        self._worker = BulkWorker(self._options, "kv-bulk-ray")
        self._lock = threading.Lock()

    def send(self, request_id: str, dst_block_ids: list[int], src: KVSource, *, urgent: bool = False) -> bool:
        import numpy as np
        import ray

        def put() -> Any:
            return ray.put(np.frombuffer(src.contiguous(), dtype=np.uint8))

        with self._lock:
            try:
                ref = put() if urgent else self._worker.run(put)
                # The ref rides inside a list so Ray does not fetch it before the call.
                done = self._actor.mig_write_kv.remote(request_id, dst_block_ids, [ref], urgent)
                return bool(ray.get(done, timeout=self._options.timeout_s))
            except (ray.exceptions.RayError, TimeoutError) as e:
                raise TransportError(f"ray KV write failed: {e}") from e

    def close(self) -> None:
        self._worker.close()
