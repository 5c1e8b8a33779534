"""Pick a KV transport by name and open a sender from a source instance actor to a
destination instance actor (``InstanceActor`` exposes the endpoints used here)."""
from __future__ import annotations

from typing import Any

from llumnix.migration.transport import TRANSPORTS, KVSender, TransportOptions


def check_transport(name: str) -> str:
    if name not in TRANSPORTS:
        raise ValueError(f"unknown KV transport {name!r}; choose one of {', '.join(TRANSPORTS)}")
    return name


def connect(name: str, dst_actor: Any, token: bytes, options: TransportOptions | None = None,
            timeout_s: float = 30.0) -> KVSender:
    """A sender to ``dst_actor`` over transport ``name``."""
    import ray

    check_transport(name)
    if name == "tcp":
        from llumnix.migration.tcp_transport import TCPSender

        addr = tuple(ray.get(dst_actor.kv_address.remote(), timeout=timeout_s))
        return TCPSender((str(addr[0]), int(addr[1])), token, options)
    if name == "gloo":
        from llumnix.migration.gloo_transport import GlooSender

        def accept(pair_id: str, offer: dict[str, dict[str, bytes]]) -> dict[str, dict[str, bytes]]:
            # the rendezvous rides on this Ray call (token-authenticated), not on a port
            answer: dict[str, dict[str, bytes]] = ray.get(dst_actor.mig_accept_gloo.remote(pair_id, offer),
                                                          timeout=timeout_s)
            return answer

        return GlooSender(accept, token, options=options)
    from llumnix.migration.ray_transport import RaySender

    return RaySender(dst_actor, options)
