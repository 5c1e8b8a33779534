"""The gateway's membership: LlumSched's members followed with a long-polling watch
(instances started by auto-scaling or replacing a lost one, drains, PD roles) into the
gateway's instances, lifecycles and dispatch view; and the watch on silent channels."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from llumnix.cluster.output_stream import actor_key
from llumnix.core.aio import within
from llumnix.policy.lifecycle import InstanceState

if TYPE_CHECKING:
    from llumnix.cluster.gateway_client import ClusterBackend

log = logging.getLogger(__name__)


class GatewayMembers:
    def __init__(self, backend: ClusterBackend) -> None:
        self._b = backend
        self.link_silence_s = 20.0
        """A channel silent this long (instances send a status every second) is reopened."""
        self.membership_interval_s = 1.0
        """The retry interval of the membership watch while LlumSched does not answer."""
        self.membership_wait_s = 30.0
        """How long one membership watch waits for a change before asking again."""

    async def watch_members_loop(self) -> None:
        """Follow LlumSched's members as they change (instances started by auto-scaling or
        replacing a lost one, drains, PD roles): one long-polling call at a time, so an
        idle gateway makes a Ray call each ``membership_wait_s``, not each second."""
        seen: Any = None
        while not self._b.stopping:
            try:
                seen, members = await within(
                    self._b.llumsched.watch_members.remote(list(self._b.instances), seen, self.membership_wait_s),
                    self.membership_wait_s + 5.0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - LlumSched down or restarting: keep what we know
                seen = None
                await asyncio.sleep(self.membership_interval_s)
                continue
            self.apply(members)

    async def watch_links_loop(self) -> None:
        """Reopen a channel that has been silent for ``link_silence_s`` (an instance pushes
        a status each second even while idle, so silence means a broken line)."""
        while not self._b.stopping:
            await asyncio.sleep(min(1.0, self.link_silence_s / 4))
            now = time.monotonic()
            for link in list(self._b.links.values()):
                if now - link.last_frame_at > self.link_silence_s:
                    log.warning("gateway: the channel to %s is silent; reopening it", link.instance_id)
                    link.close()

    async def refresh(self) -> None:
        """Learn the members now (an instance dispatch named that this gateway does not
        know yet); a restarting LlumSched leaves the known set as it is."""
        try:
            members = await within(self._b.llumsched.members.remote(list(self._b.instances)), 2.0)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - LlumSched down or restarting: keep what we know
            return
        self.apply(members)

    def apply(self, members: dict[str, dict[str, Any]]) -> None:
        now, lc, s_ = time.time(), self._b.lifecycle, InstanceState
        for iid, m in members.items():
            handle = m["handle"]
            if iid not in self._b.instances and handle is not None and actor_key(handle) not in self._b.dead:
                log.info("gateway: new instance %s", iid)
                self._b.instances[iid] = handle
                lc.restart(iid, now)
                self._b.start_poller(iid, handle)
            if iid not in self._b.instances:
                continue
            lc.move(iid, s_.TERMINATING if m["is_terminating"] else s_.SERVING, now)
            if self._b.gs is not None:
                (self._b.gs.mark_terminating if m["is_terminating"] else self._b.gs.unmark_terminating)(iid)
                self._b.gs.set_role(iid, m.get("role", "mixed"))  # PD roles, changed by adaptive PD
        # A terminating instance that is no longer a member was stopped by scale-in; its
        # poller ends when the stopped actor answers with an error (see ``Failover.on_instance_failed``).
        for iid in lc.ids(s_.TERMINATING):
            if iid not in members:
                lc.move(iid, s_.RETIRED, now, "no longer a member")

    async def health(self) -> dict[str, Any]:
        """Readiness: "ok" only while as many instances serve (alive, schedulable, not
        draining) as the cluster is configured to keep; "degraded" below that (a lost
        instance not yet replaced, a drain), "drained" when none serves but some answer
        (every one drained or starting: an operator's doing, not a failure),
        "unavailable" when none answers. ``draining`` lists the instances that answer
        but take no new requests, ``dead`` those that do not answer. Without LlumSched
        the gateway compares with the instances it started with."""
        async def alive(actor: Any) -> bool:
            try:
                return bool(await within(actor.health.remote(), 2.0))
            except Exception:  # noqa: BLE001 - an unreachable instance is unhealthy
                return False

        ids = list(self._b.instances)
        states = dict(zip(ids, await asyncio.gather(*(alive(self._b.instances[i]) for i in ids)), strict=True))
        try:
            cap = await within(self._b.llumsched.capacity.remote(), 2.0)
            target, listed, replacing = int(cap["target"]), set(cap["serving"]), list(cap["replacing"])
        except Exception:  # noqa: BLE001 - LlumSched down or restarting: judge from here
            target, listed, replacing = self._b.num_configured, set(self._b.lifecycle.ids(InstanceState.SERVING)), []
        serving = sorted(i for i in listed if states.get(i))
        draining = sorted(i for i, ok in states.items() if ok and i not in listed)
        dead = sorted(i for i, ok in states.items() if not ok)
        status = ("ok" if len(serving) >= target else "degraded") if serving else (
            "drained" if draining else "unavailable")
        return {"status": status, "instances": states, "serving": serving, "target": target,
                "replacing": replacing, "draining": draining, "dead": dead}
