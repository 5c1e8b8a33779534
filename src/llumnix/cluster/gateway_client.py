"""The gateway's cluster client (``ClusterBackend``): dispatch (here, on the statuses
each instance streams on its request channel, with LlumSched's policy; through LlumSched
while no channel is up), send each request on its instance's channel, collect every
request's outputs from whichever instance produces them, in order (``OutputStream``).
Its parts: ``GatewayMembers`` (membership), ``Failover`` (resumes after an instance
dies), ``CmsFallback`` (the shared store's view while LlumSched is away). Every remote
call has a timeout."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from llumnix.cluster.cms_fallback import CmsFallback
from llumnix.cluster.failover import Failover
from llumnix.cluster.gateway_members import GatewayMembers
from llumnix.cluster.link import InstanceLink
from llumnix.cluster.output_stream import PRESENT, OutputStream
from llumnix.core.aio import within
from llumnix.core.batch import RequestOutput
from llumnix.core.errors import InvalidRequestError, LlumnixError, RequestTooLongError
from llumnix.core.evolve import evolve
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest, TokenizerLike, wall_arrival
from llumnix.policy import DispatchRequest, GlobalScheduler
from llumnix.policy.cluster_view import ClusterView
from llumnix.policy.lifecycle import InstanceState, Lifecycles

log = logging.getLogger(__name__)


class ClusterBackend:
    def __init__(self, llumsched: Any, instances: dict[str, Any], info: dict[str, Any],
                 tokenizer: TokenizerLike) -> None:
        self.llumsched = llumsched
        self.instances = dict(instances)
        self.num_configured = len(instances)
        """The instances this gateway started with: /health's target when LlumSched is down."""
        self.model_name = info["model"]
        self.max_model_len = int(info["max_model_len"])
        self.vocab_size = int(info["vocab_size"])
        self._usable_blocks = int(info["num_blocks"]) - int(info["watermark"] * info["num_blocks"])
        self._block_size = int(info["block_size"])
        self.tokenizer = tokenizer
        self.streams: dict[str, OutputStream] = {}
        self.pollers: dict[str, asyncio.Task[None]] = {}
        """Per instance, the task that keeps its request channel open and reads it."""
        self.links: dict[str, InstanceLink] = {}
        self._token = b""
        self.gs: GlobalScheduler | None = None
        """Dispatch state (LlumSched's policy, fed by the channels' statuses): requests are
        dispatched here, with no call to LlumSched on their path."""
        self.unconfirmed: dict[str, str] = {}
        """Requests sent on a channel whose add the instance has not confirmed yet."""
        self.num_local_dispatches = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.dead: set[str] = set()  # actor ids of instances found dead: never polled again
        self.cluster = ClusterView()
        """This gateway's record of each instance (lifecycle from LlumSched's members and
        its own polls; with a token, the statuses its channels bring, roles, pending)."""
        for iid in self.instances:
            self.lifecycle.move(iid, InstanceState.SERVING, time.time())
        self.client_id = uuid.uuid4().hex
        """This gateway's tag on its requests: instances keep one outbox per tag, so
        gateways sharing a cluster never read each other's outputs."""
        self.dispatch_timeout_s = 1.0
        self.call_timeout_s = 10.0
        """Most seconds any call to an instance may take before it counts as failed."""
        self.poll_timeout_s = 10.0
        """An instance whose output poll does not answer twice in a row is treated as dead."""
        self.num_fallback_dispatches = 0
        self.stopping = False
        self.members = GatewayMembers(self)
        self.failover = Failover(self)
        self.cms = CmsFallback(self)

    @property
    def lifecycle(self) -> Lifecycles:
        return self.cluster.lifecycle

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(Exception):  # LlumSched away: dispatch waits for it (or falls back)
            setup = await within(self.llumsched.gateway_setup.remote(), 5.0)
            self._token = setup["token"] or b""
            if self._token:
                self.gs = GlobalScheduler(setup["scheduling"], cluster=self.cluster)
                for iid, role in (setup.get("roles") or {}).items():  # PD: dispatch to the prefill pool
                    self.gs.set_role(iid, role)
        for iid, actor in self.instances.items():
            self.start_poller(iid, actor)
        self.spawn(self.members.watch_members_loop())
        self.spawn(self.members.watch_links_loop())
        with contextlib.suppress(Exception):  # LlumSched away: no shared view until a restart
            url = await within(self.llumsched.cms_url.remote(), 5.0)
            if url not in (None, "memory"):
                from llumnix.cluster.meta_store import RedisMetaStore

                self.cms.store = RedisMetaStore(str(url))

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the pollers and background tasks and wait for them. A cancel can be
        lost: Python 3.11's ``asyncio.wait_for`` returns the result instead of raising
        when its inner call completes in the same loop turn as the cancel (every poll
        completes twice a second), so the loops also check ``stopping`` and a task still
        running is cancelled again. Once ``timeout_s`` is up the rest is left behind."""
        self.stopping = True
        pending = {*self.pollers.values(), *self.tasks}
        deadline = asyncio.get_running_loop().time() + timeout_s
        while pending:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("gateway: %d background task(s) did not stop", len(pending))
                return
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=min(0.5, left))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def start_poller(self, iid: str, actor: Any) -> None:
        if self.stopping:
            return
        run = self._serve_link if self._token else self._poll
        self.pollers[iid] = asyncio.create_task(run(iid, actor), name=f"link-{iid}")

    # -- outputs ----------------------------------------------------------------------
    async def _serve_link(self, iid: str, actor: Any) -> None:
        """Keep ``iid``'s request channel open and read it. A line that breaks is reopened
        (resuming after the last output this gateway has); the instance counts as failed
        when it cannot be reopened, or breaks again before a single frame."""
        link: InstanceLink | None = None
        failures, err = 0, None
        while not self.stopping and failures < 2:
            opened_at = time.monotonic()
            try:
                if link is None:
                    address = await within(actor.channel_address.remote(), self.call_timeout_s)
                    link = InstanceLink(iid, (str(address[0]), int(address[1])), self._token, self.client_id, self)
                await link.open()
                self.links[iid] = link
                self._resend_unconfirmed(iid)
                await link.run()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a broken line; the instance may be dead
                err = e
            self.links.pop(iid, None)
            if self.gs is not None:
                self.gs.set_schedulable(iid, False)  # until its next status says otherwise
            failures = 0 if link is not None and link.last_frame_at > opened_at else failures + 1
            if not self.stopping:
                await asyncio.sleep(0.1 * failures)
        if not self.stopping:
            await self.failover.on_instance_failed(iid, actor, err or ConnectionError(f"the channel to {iid} closed"))

    def on_outputs(self, instance_id: str, outputs: list[RequestOutput]) -> None:
        gs = self.gs
        for out in outputs:
            self._route(instance_id, out)
            if out.is_finished and gs is not None:  # the frame's status (applied first) saw it end
                gs.on_finished(instance_id, out.request_id)

    def on_statuses(self, instance_id: str, statuses: list[InstanceStatus]) -> None:
        if self.gs is None or instance_id not in self.instances or self.lifecycle.is_gone(instance_id):
            return
        for status in statuses:
            self.gs.update_status(status, refresh=False)  # views are rebuilt at the next dispatch

    def on_add_result(self, instance_id: str, request_id: str, error: BaseException | None) -> None:
        self.unconfirmed.pop(request_id, None)
        stream = self.streams.get(request_id)
        if error is None or stream is None or stream.instance_id != instance_id:
            return
        if isinstance(error, InvalidRequestError):
            stream.queue.put_nowait(error)
        else:  # the instance is stopping (or its engine refused): another one takes it
            self.spawn(self.failover.recover(stream, instance_id, error, exclude={instance_id}))

    def _resend_unconfirmed(self, iid: str) -> None:
        """After a reopened line: adds that may have been lost with the old one."""
        for rid, where in list(self.unconfirmed.items()):
            stream = self.streams.get(rid)
            if where == iid and stream is not None:
                self.spawn(self.failover.readd(stream, iid))

    def _dispatch_here(self, request: GenerateRequest) -> str | None:
        """Dispatch on this gateway's statuses and send on the channel (None: no open
        channel, or no status yet: the caller goes through LlumSched)."""
        if self.gs is None or not self.links:
            return None
        now = time.time()
        iid = self.gs.dispatch(DispatchRequest(request.request_id, len(request.prompt_token_ids), request.priority,
                                               wall_arrival(request, now), request.prompt_token_ids,
                                               request.slo_class), now)
        link = self.links.get(iid) if iid is not None else None
        if link is None or not link.is_open:
            return None
        self.unconfirmed[request.request_id] = link.instance_id
        link.add(request)
        self.num_local_dispatches += 1
        return link.instance_id

    async def _poll(self, iid: str, actor: Any) -> None:
        misses = 0
        acked = 0  # the instance keeps our outputs until a poll acknowledges them
        while not self.stopping:
            try:
                acked, outs = await within(actor.poll_outputs.remote(0.5, self.client_id, acked),
                                           self.poll_timeout_s)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                misses += 1
                if misses < 2:
                    continue
                err: BaseException = TimeoutError(f"no output poll answered in {2 * self.poll_timeout_s:.0f} s")
            except Exception as e:  # noqa: BLE001 - the actor died, or its engine loop did
                if type(e).__name__ == "ActorUnavailableError" and misses < 2:
                    misses += 1  # Ray says "temporarily": one more try before giving up on it
                    await asyncio.sleep(0.5)
                    continue
                err = e
            else:
                misses = 0
                for out in outs:
                    self._route(iid, out)
                continue
            await self.failover.on_instance_failed(iid, actor, err)
            return

    def _route(self, iid: str, out: RequestOutput) -> None:
        stream = self.streams.get(out.request_id)
        if stream is None or out.epoch < stream.request.epoch:
            # Nobody waits for it (the client left, or the stream ended in an error), or
            # it is a copy fenced off by a resume: stop it rather than let it run on.
            if not out.is_finished and out.request_id not in self.failover.reaping:
                self.failover.reaping.add(out.request_id)
                self.spawn(self.failover.reap(iid, out.request_id))
            return
        if not stream.is_recovering:
            stream.instance_id = iid  # where it lives now (it may have migrated here)
        stream.offer(out)

    # -- requests ---------------------------------------------------------------------
    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        if num_prompt_tokens + 1 > self.max_model_len:
            raise RequestTooLongError(f"the prompt has {num_prompt_tokens} tokens; this model's context is "
                                      f"{self.max_model_len} tokens including at least one output token",
                                      "prompt")
        most = min(num_prompt_tokens + params.max_tokens, self.max_model_len)
        if -(-most // self._block_size) > self._usable_blocks:
            raise RequestTooLongError(f"the request needs up to {most} tokens of KV cache but an instance "
                                      f"holds {self._usable_blocks * self._block_size}", "max_tokens")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        params = request.params
        if params.seed is None:  # a seed chosen here makes a resumed request draw what the lost one would have
            params = evolve(params, seed=random.getrandbits(63))
        request = evolve(request, params=params, client=self.client_id)
        stream = self.streams[request.request_id] = OutputStream(request)
        try:
            iid = self._dispatch_here(request)
            added: Any = PRESENT
            if iid is None:
                iid, added = await self._submit(request)
            if iid is None:
                raise LlumnixError("no instance is available to serve the request")
            if iid not in self.instances:
                await self.members.refresh()  # just started by auto-scaling
            stream.instance_id = iid
            if added is None:
                await self.add(stream, iid)
            elif added is not PRESENT:
                self.spawn(self.failover.confirm_added(stream, iid, added))
            carry: RequestOutput | BaseException | None = None
            while True:
                item = carry if carry is not None else await stream.queue.get()
                carry = None
                if isinstance(item, BaseException):
                    raise item
                # Outputs that queued up while this consumer was busy go out as one
                # (a stream falls behind under load; one chunk is cheaper than several).
                while not item.is_finished and not stream.queue.empty():
                    nxt = stream.queue.get_nowait()
                    if isinstance(nxt, BaseException):
                        carry = nxt
                        break
                    item = item.then(nxt)
                yield item
                if item.is_finished:
                    return
        finally:
            self.streams.pop(request.request_id, None)
            self.unconfirmed.pop(request.request_id, None)

    async def add(self, stream: OutputStream, iid: str) -> None:
        """Send the request to ``iid`` ourselves (when LlumSched did not forward it)."""
        try:
            await within(self.instances[iid].add_request.remote(stream.request), self.call_timeout_s)
        except asyncio.CancelledError:
            raise
        except InvalidRequestError:
            raise
        except Exception as e:  # noqa: BLE001 - dead or stopping: another instance takes it
            await self.failover.recover(stream, iid, e, exclude={iid})

    async def _submit(self, request: GenerateRequest) -> tuple[str | None, Any]:
        """LlumSched dispatches and forwards (one call): the instance id and the forwarded
        add's ObjectRef. If it does not answer within a second (dead or restarting) the
        gateway places the request itself (ref None): where a forward got through before
        ``admit_by`` it stays (``PRESENT``), else by the gateway's own round-robin."""
        rid = request.request_id
        admit_by = time.time() + self.dispatch_timeout_s / 2
        try:
            sub = await within(self.llumsched.submit.remote(
                dataclasses.replace(request, admit_by=admit_by), wall_arrival(request)),
                self.dispatch_timeout_s)
            if sub is None:
                # Nothing schedulable in LlumSched's view. Just after a restart that view can
                # be empty for a moment: where this gateway knows live instances, it places
                # the request itself rather than fail it.
                if not any(self.lifecycle.state(i) == InstanceState.SERVING for i in self.instances):
                    return None, None
                raise LookupError("LlumSched has no schedulable instance in its view")
            iid, refs = sub
            if self.lifecycle.is_gone(iid):
                raise LookupError(f"LlumSched chose {iid}, which this gateway found dead")
            return iid, (refs[0] if refs else None)
        except Exception as e:  # noqa: BLE001 - any LlumSched failure means: use the fallback
            log.warning("LlumSched unavailable (%s); the gateway places %s itself", type(e).__name__, rid)
            await asyncio.sleep(max(0.0, admit_by - time.time()))
            where = await self.failover.locate(rid, exclude=set())  # a forward that made it in time
            if where is not None:
                return where, PRESENT
            self.num_fallback_dispatches += 1
            picked = await self.cms.pick()
            if picked is not None:
                self.cms.num_dispatches += 1
                return picked, None
            takes = self.gs.takes_prefill if self.gs is not None else (lambda iid: True)
            ids = [i for i in sorted(self.instances)
                   if self.lifecycle.state(i) != InstanceState.TERMINATING and takes(i)] or sorted(self.instances)
            if not ids:
                return None, None
            return ids[self.num_fallback_dispatches % len(ids)], None

    async def abort(self, request_id: str) -> None:
        """Abort wherever the request is: where it was last seen first, then everywhere
        (it may have just migrated, or be mid-migration)."""
        stream = self.streams.get(request_id)
        iid = stream.instance_id if stream else None
        order = sorted(self.instances, key=lambda i: i != iid)
        for i in order:
            actor = self.instances.get(i)
            if actor is None:
                continue
            try:
                if await within(actor.abort.remote(request_id), 5.0):
                    return
            except Exception:  # noqa: BLE001 - an unreachable instance frees nothing anyway
                continue

    # -- admin ------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """Readiness (``GatewayMembers.health``)."""
        return await self.members.health()

    async def cluster_info(self) -> dict[str, Any]:
        try:
            info = dict(await within(self.llumsched.cluster_info.remote(), 5.0))
            info["source"] = "llumsched"
        except Exception:
            if self.cms.store is None:
                raise
            info = await self.cms.info()  # LlumSched away: the shared view, read here
        return self._with_gateway(info)

    async def watch_cluster(self, seen: Any, timeout_s: float) -> tuple[Any, dict[str, Any]]:
        """``cluster_info`` once LlumSched's view differs from its version ``seen``, or after
        ``timeout_s`` (``cluster_pulse.py``); with that version. The gateway's long polls."""
        seen, info = await within(self.llumsched.watch_cluster.remote(seen, timeout_s), timeout_s + 5.0)
        return seen, self._with_gateway({**info, "source": "llumsched"})

    def _with_gateway(self, info: dict[str, Any]) -> dict[str, Any]:
        self._add_dispatch_info(info)
        info["gateway"] = {"num_fallback_dispatches": self.num_fallback_dispatches,
                           "num_local_dispatches": self.num_local_dispatches,
                           "channels": sorted(self.links),
                           "num_cms_dispatches": self.cms.num_dispatches,
                           "num_resumed": self.failover.num_resumed,
                           "num_failed_instances": self.failover.num_failed_instances,
                           "num_retired_instances": self.failover.num_retired_instances,
                           "instances": sorted(self.instances)}
        return info

    def _add_dispatch_info(self, info: dict[str, Any]) -> None:
        """Dispatch happens here: this gateway's count joins LlumSched's (its dispatches
        while no channel was up), and prefix affinity's memory is this gateway's."""
        info["num_dispatched"] = int(info.get("num_dispatched", 0)) + self.num_local_dispatches
        if self.gs is not None and self.gs.slo is not None:  # the slo policy's predictor is this gateway's
            info["slo_predictor"] = self.gs.slo.step_error()
        index = self.gs.prefix_index if self.gs is not None else None
        if index is None:
            return
        for inst in info.get("instances", []):
            iid = inst["instance_id"]
            inst["prefix_blocks_sent"] = index.size(iid)
            inst["prefix_blocks_forgotten"] = index.num_forgotten.get(iid, 0)

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        if instance_id not in self.instances:
            raise InvalidRequestError(f"no instance {instance_id!r}", "instance_id")
        return await within(self.llumsched.drain.remote(instance_id), 15.0)

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        if instance_id not in self.instances:
            raise InvalidRequestError(f"no instance {instance_id!r}", "instance_id")
        return await within(self.llumsched.undrain.remote(instance_id), 15.0)
