"""The gateway's view of a Ray cluster: dispatch (here, on the statuses each
instance streams on its request channel, with LlumSched's policy; through
LlumSched while no channel is up), send each request on its instance's channel,
collect every request's outputs from whichever instance produces them, in order.

Fault tolerance lives here, where the streams are: when an instance dies, each
request it held is resumed on a healthy instance from its prompt plus the tokens
already released to the client (a recompute), so the client's stream goes on
without a gap or a repeat. Every remote call has a timeout.
"""
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

from llumnix.cluster.link import InstanceLink
from llumnix.core.batch import RequestOutput
from llumnix.core.errors import InvalidRequestError, LlumnixError, RequestFailedError, RequestTooLongError
from llumnix.core.evolve import evolve
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import InstanceStatus
from llumnix.core.wire import GenerateRequest, TokenizerLike
from llumnix.policy import DispatchRequest, GlobalScheduler
from llumnix.policy.lifecycle import InstanceState, Lifecycles

log = logging.getLogger(__name__)


class _Stream:
    """One request's outputs, released strictly in token order: a late output from a
    previous instance and an early one from the next cannot swap or repeat."""

    def __init__(self, request: GenerateRequest) -> None:
        self.request = request
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.next_index = 1  # the number of the next token to release (1 = the first)
        self.held: dict[int, RequestOutput] = {}
        self.token_ids: list[int] = []
        """Every token released so far: what a resumed request continues from."""
        self.instance_id: str | None = None
        self.is_finished = False
        self.is_recovering = False
        self.num_resumes = 0

    def offer(self, out: RequestOutput) -> None:
        if self.is_finished:
            return
        if out.finish_reason == "error":
            # The engine ended it after every token it had released (outputs come in order).
            self.is_finished = True
            self.held.clear()
            self.queue.put_nowait(RequestFailedError(out.error or "the engine failed on this request"))
            return
        first = out.num_output_tokens - len(out.new_token_ids) + 1  # its first token's number
        if first < self.next_index:
            return  # a duplicate
        self.held[first] = out  # one token, or several merged (a final-only request's)
        while self.next_index in self.held:
            o = self.held.pop(self.next_index)
            self.queue.put_nowait(o)
            self.token_ids.extend(o.new_token_ids)
            self.next_index += len(o.new_token_ids)
            if o.is_finished:
                self.is_finished = True
                self.held.clear()
                return


_PRESENT = object()
"""``_submit``: the request is already on the instance; nothing to add."""


def request_id_live(streams: dict[str, _Stream], stream: _Stream) -> bool:
    """The stream is still the one registered for its request (the client is there)."""
    return streams.get(stream.request.request_id) is stream


def _actor_key(actor: Any) -> str:
    key = getattr(actor, "_actor_id", None)
    return key.hex() if key is not None else str(id(actor))


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
        self._streams: dict[str, _Stream] = {}
        self._pollers: dict[str, asyncio.Task[None]] = {}
        """Per instance, the task that keeps its request channel open and reads it."""
        self._links: dict[str, InstanceLink] = {}
        self._token = b""
        self.gs: GlobalScheduler | None = None
        """Dispatch state (LlumSched's policy, fed by the channels' statuses): requests are
        dispatched here, with no call to LlumSched on their path."""
        self._unconfirmed: dict[str, str] = {}
        """Requests sent on a channel whose add the instance has not confirmed yet."""
        self.num_local_dispatches = 0
        self.link_silence_s = 20.0
        """A channel silent this long (instances send a status every second) is reopened."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dead: set[str] = set()  # actor ids of instances found dead: never polled again
        self.lifecycle = Lifecycles()
        """This gateway's view of each instance's state (LlumSched's members, its own polls)."""
        for iid in self.instances:
            self.lifecycle.move(iid, InstanceState.SERVING, time.time())
        """Terminating instances LlumSched no longer lists: scale-in stopped them once empty."""
        self.client_id = uuid.uuid4().hex
        """This gateway's tag on its requests: instances keep one outbox per tag, so
        gateways sharing a cluster never read each other's outputs."""
        self.dispatch_timeout_s = 1.0
        self.call_timeout_s = 10.0
        """Most seconds any call to an instance may take before it counts as failed."""
        self.poll_timeout_s = 10.0
        """An instance whose output poll does not answer twice in a row is treated as dead."""
        self.membership_interval_s = 1.0
        """The retry interval of the membership watch while LlumSched does not answer."""
        self.membership_wait_s = 30.0
        """How long one membership watch waits for a change before asking again."""
        self.max_resumes = 1
        """Resumes after an instance failure; a request whose second instance dies too is
        ended with an error rather than risk taking down a third (it may be the cause)."""
        self.num_fallback_dispatches = 0
        self.num_resumed = 0
        self.num_failed_instances = 0
        self.num_retired_instances = 0
        self.num_reaped = 0
        """Request copies stopped because no stream wanted their outputs (see ``_route``)."""
        self._reaping: set[str] = set()
        self._stopping = False
        self.cms: Any = None
        """The shared meta store (Redis) when the cluster has one: the view this gateway
        falls back on while LlumSched is away."""
        self.cms_staleness_s = 2.0
        self.num_cms_dispatches = 0

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(Exception):  # LlumSched away: dispatch waits for it (or falls back)
            setup = await asyncio.wait_for(self.llumsched.gateway_setup.remote(), 5.0)
            self._token = setup["token"] or b""
            if self._token:
                self.gs = GlobalScheduler(setup["scheduling"])
                for iid, role in (setup.get("roles") or {}).items():  # PD: dispatch to the prefill pool
                    self.gs.set_role(iid, role)
        for iid, actor in self.instances.items():
            self._start_poller(iid, actor)
        self._spawn(self._watch_members_loop())
        self._spawn(self._watch_links_loop())
        with contextlib.suppress(Exception):  # LlumSched away: no shared view until a restart
            url = await asyncio.wait_for(self.llumsched.cms_url.remote(), 5.0)
            if url not in (None, "memory"):
                from llumnix.cluster.meta_store import RedisMetaStore

                self.cms = RedisMetaStore(str(url))

    async def _cms_statuses(self) -> dict[str, InstanceStatus]:
        """The shared meta store's view ({} without one, or while it is unreachable)."""
        if self.cms is None:
            return {}
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.cms.all_statuses), 2.0)
        except Exception:  # noqa: BLE001 - no view: the callers fall back further
            return {}

    async def _cms_pick(self) -> str | None:
        """Fallback dispatch from the shared view: the freest instance this gateway can
        reach whose status is fresh, schedulable and not terminating, and that takes new
        requests under PD (not a decode instance; None without a view)."""
        from llumnix.policy import FreenessConfig, freeness

        now = time.time()
        takes = self.gs.takes_prefill if self.gs is not None else (lambda iid: True)
        fresh = [s for iid, s in (await self._cms_statuses()).items()
                 if iid in self.instances and not self.lifecycle.is_gone(iid) and s.is_schedulable
                 and not s.is_terminating and now - s.timestamp <= self.cms_staleness_s and takes(iid)]
        if not fresh:
            return None
        cfg = FreenessConfig()
        return max(fresh, key=lambda s: (freeness(s, cfg), s.instance_id)).instance_id

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the pollers and background tasks and wait for them. A cancel can be
        lost: Python 3.11's ``asyncio.wait_for`` returns the result instead of raising
        when its inner call completes in the same loop turn as the cancel (every poll
        completes twice a second), so the loops also check ``_stopping`` and a task still
        running is cancelled again. Once ``timeout_s`` is up the rest is left behind."""
        self._stopping = True
        pending = {*self._pollers.values(), *self._tasks}
        deadline = asyncio.get_running_loop().time() + timeout_s
        while pending:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("gateway: %d background task(s) did not stop", len(pending))
                return
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=min(0.5, left))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_poller(self, iid: str, actor: Any) -> None:
        if self._stopping:
            return
        run = self._serve_link if self._token else self._poll
        self._pollers[iid] = asyncio.create_task(run(iid, actor), name=f"link-{iid}")

    async def _watch_members_loop(self) -> None:
        """Follow LlumSched's members as they change (instances started by auto-scaling or
        replacing a lost one, drains, PD roles): one long-polling call at a time, so an
        idle gateway makes a Ray call each ``membership_wait_s``, not each second."""
        seen: Any = None
        while not self._stopping:
            try:
                seen, members = await asyncio.wait_for(
                    self.llumsched.watch_members.remote(list(self.instances), seen, self.membership_wait_s),
                    self.membership_wait_s + 5.0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - LlumSched down or restarting: keep what we know
                seen = None
                await asyncio.sleep(self.membership_interval_s)
                continue
            self._apply_members(members)

    async def _watch_links_loop(self) -> None:
        """Reopen a channel that has been silent for ``link_silence_s`` (an instance pushes
        a status each second even while idle, so silence means a broken line)."""
        while not self._stopping:
            await asyncio.sleep(min(1.0, self.link_silence_s / 4))
            now = time.monotonic()
            for link in list(self._links.values()):
                if now - link.last_frame_at > self.link_silence_s:
                    log.warning("gateway: the channel to %s is silent; reopening it", link.instance_id)
                    link.close()

    async def refresh_members(self) -> None:
        """Learn the members now (an instance dispatch named that this gateway does not
        know yet); a restarting LlumSched leaves the known set as it is."""
        try:
            members = await asyncio.wait_for(self.llumsched.members.remote(list(self.instances)), 2.0)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - LlumSched down or restarting: keep what we know
            return
        self._apply_members(members)

    def _apply_members(self, members: dict[str, dict[str, Any]]) -> None:
        now, lc, s_ = time.time(), self.lifecycle, InstanceState
        for iid, m in members.items():
            handle = m["handle"]
            if iid not in self.instances and handle is not None and _actor_key(handle) not in self._dead:
                log.info("gateway: new instance %s", iid)
                self.instances[iid] = handle
                lc.restart(iid, now)
                self._start_poller(iid, handle)
            if iid not in self.instances:
                continue
            lc.move(iid, s_.TERMINATING if m["is_terminating"] else s_.SERVING, now)
            if self.gs is not None:
                (self.gs.mark_terminating if m["is_terminating"] else self.gs.unmark_terminating)(iid)
                self.gs.set_role(iid, m.get("role", "mixed"))  # PD roles, changed by adaptive PD
        # A terminating instance that is no longer a member was stopped by scale-in; its
        # poller ends when the stopped actor answers with an error (see _on_instance_failed).
        for iid in lc.ids(s_.TERMINATING):
            if iid not in members:
                lc.move(iid, s_.RETIRED, now, "no longer a member")

    # -- outputs ----------------------------------------------------------------------
    async def _serve_link(self, iid: str, actor: Any) -> None:
        """Keep ``iid``'s request channel open and read it. A line that breaks is reopened
        (resuming after the last output this gateway has); the instance counts as failed
        when it cannot be reopened, or breaks again before a single frame."""
        link: InstanceLink | None = None
        failures, err = 0, None
        while not self._stopping and failures < 2:
            opened_at = time.monotonic()
            try:
                if link is None:
                    address = await asyncio.wait_for(actor.channel_address.remote(), self.call_timeout_s)
                    link = InstanceLink(iid, (str(address[0]), int(address[1])), self._token, self.client_id, self)
                await link.open()
                self._links[iid] = link
                self._resend_unconfirmed(iid)
                await link.run()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a broken line; the instance may be dead
                err = e
            self._links.pop(iid, None)
            if self.gs is not None:
                self.gs.set_schedulable(iid, False)  # until its next status says otherwise
            failures = 0 if link is not None and link.last_frame_at > opened_at else failures + 1
            if not self._stopping:
                await asyncio.sleep(0.1 * failures)
        if not self._stopping:
            await self._on_instance_failed(iid, actor, err or ConnectionError(f"the channel to {iid} closed"))

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
        self._unconfirmed.pop(request_id, None)
        stream = self._streams.get(request_id)
        if error is None or stream is None or stream.instance_id != instance_id:
            return
        if isinstance(error, InvalidRequestError):
            stream.queue.put_nowait(error)
        else:  # the instance is stopping (or its engine refused): another one takes it
            self._spawn(self._recover(stream, instance_id, error, exclude={instance_id}))

    def _resend_unconfirmed(self, iid: str) -> None:
        """After a reopened line: adds that may have been lost with the old one."""
        for rid, where in list(self._unconfirmed.items()):
            stream = self._streams.get(rid)
            if where == iid and stream is not None:
                self._spawn(self._readd(stream, iid))

    def _dispatch_here(self, request: GenerateRequest) -> str | None:
        """Dispatch on this gateway's statuses and send on the channel (None: no open
        channel, or no status yet: the caller goes through LlumSched)."""
        if self.gs is None or not self._links:
            return None
        iid = self.gs.dispatch(DispatchRequest(request.request_id, len(request.prompt_token_ids), request.priority,
                                               request.arrival_time, request.prompt_token_ids, request.slo_class),
                               time.time())
        link = self._links.get(iid) if iid is not None else None
        if link is None or not link.is_open:
            return None
        self._unconfirmed[request.request_id] = link.instance_id
        link.add(request)
        self.num_local_dispatches += 1
        return link.instance_id

    async def _poll(self, iid: str, actor: Any) -> None:
        misses = 0
        acked = 0  # the instance keeps our outputs until a poll acknowledges them
        while not self._stopping:
            try:
                acked, outs = await asyncio.wait_for(actor.poll_outputs.remote(0.5, self.client_id, acked),
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
            await self._on_instance_failed(iid, actor, err)
            return

    def _route(self, iid: str, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None or out.epoch < stream.request.epoch:
            # Nobody waits for it (the client left, or the stream ended in an error), or
            # it is a copy fenced off by a resume: stop it rather than let it run on.
            if not out.is_finished and out.request_id not in self._reaping:
                self._reaping.add(out.request_id)
                self._spawn(self._reap(iid, out.request_id))
            return
        if not stream.is_recovering:
            stream.instance_id = iid  # where it lives now (it may have migrated here)
        stream.offer(out)

    async def _on_instance_failed(self, iid: str, actor: Any, err: BaseException) -> None:
        if self.instances.get(iid) is not actor:
            return
        import ray

        del self.instances[iid]
        self._pollers.pop(iid, None)
        self._links.pop(iid, None)
        if self.gs is not None:
            self.gs.remove_instance(iid)
        self._dead.add(_actor_key(actor))
        planned = self.lifecycle.state(iid) in (InstanceState.TERMINATING, InstanceState.RETIRED)
        if not planned:
            self.lifecycle.move(iid, InstanceState.FAILED, time.time(), type(err).__name__)
        else:
            # Scale-in (or a drain) empties an instance by migration and then stops it: a
            # planned end, unless a stream of ours is still there. A stream whose request
            # migrated may not have had an output from its new home yet: look for it.
            on_it = [s for s in self._streams.values() if s.instance_id == iid and not s.is_finished]
            homes = await asyncio.gather(*(self._locate(s.request.request_id, {iid}) for s in on_it))
            for stream, home in zip(on_it, homes, strict=True):
                if home is not None and stream.instance_id == iid:
                    stream.instance_id = home
            if all(home is not None for home in homes):
                log.info("gateway: instance %s retired (drained and stopped)", iid)
                self.lifecycle.move(iid, InstanceState.RETIRED, time.time())
                self.num_retired_instances += 1
                return
            self.lifecycle.move(iid, InstanceState.FAILED, time.time(), "stopped with a stream on it")
        log.warning("gateway: instance %s failed (%s: %s); resuming its requests elsewhere",
                    iid, type(err).__name__, err)
        self.num_failed_instances += 1
        with contextlib.suppress(Exception):  # a wedged one must not produce duplicates later
            ray.kill(actor)  # type: ignore[arg-type]
        with contextlib.suppress(Exception):  # LlumSched down: its own health check finds out
            await asyncio.wait_for(self.llumsched.remove_instance.remote(iid, f"gateway: {err}"), 2.0)
        for stream in list(self._streams.values()):
            if stream.instance_id == iid and not stream.is_finished:
                self._spawn(self._recover(stream, iid, err))

    async def _recover(self, stream: _Stream, lost_iid: str, err: BaseException,
                       exclude: set[str] | None = None) -> None:
        """Resume ``stream``'s request on a healthy instance, from its prompt plus the
        tokens already released; if none can take it, end the stream with an error."""
        if stream.instance_id != lost_iid or stream.is_recovering or stream.is_finished:
            return
        rid = stream.request.request_id
        stream.is_recovering = True
        try:
            where = await self._locate(rid, exclude={lost_iid, *(exclude or ())})
            if where is not None:  # it had migrated away just before
                stream.instance_id = where
                return
            if stream.num_resumes >= self.max_resumes:
                raise RequestFailedError(f"instance {lost_iid} failed ({type(err).__name__}) after the request "
                                         f"was resumed {stream.num_resumes} time(s); it is not resumed again")
            stream.num_resumes += 1
            stream.held.clear()  # whatever the lost instance left unreleased is recomputed
            # A new epoch: outputs of the old one now come only from a copy that should not exist.
            stream.request = dataclasses.replace(stream.request, epoch=stream.request.epoch + 1)
            tokens = list(stream.token_ids)
            last: BaseException | None = None
            for iid in await self._targets(stream.request, exclude={lost_iid, *(exclude or ())}):
                actor = self.instances.get(iid)
                if actor is None:
                    continue
                stream.instance_id = iid
                try:
                    await asyncio.wait_for(actor.resume_request.remote(stream.request, tokens),
                                           self.call_timeout_s)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - try the next instance
                    last = e
                    continue
                if tokens:
                    self.num_resumed += 1
                    log.warning("gateway: request %s resumed on %s after %d tokens", rid, iid, len(tokens))
                if rid not in self._streams:  # the client left meanwhile
                    await self.abort(rid)
                return
            raise LlumnixError(f"instance {lost_iid} failed ({type(err).__name__}) and no other instance could "
                               f"take the request" + (f" ({type(last).__name__})" if last else ""))
        except LlumnixError as e:
            stream.queue.put_nowait(e)
        finally:
            stream.is_recovering = False

    async def _locate(self, request_id: str, exclude: set[str]) -> str | None:
        """The live instance that holds ``request_id``, if any."""
        ids = [i for i in self.instances if i not in exclude]

        async def has(iid: str) -> bool:
            try:
                n = await asyncio.wait_for(self.instances[iid].num_output_tokens.remote(request_id), 2.0)
            except Exception:  # noqa: BLE001 - an unreachable instance does not hold it for us
                return False
            return int(n) >= 0

        found = await asyncio.gather(*(has(i) for i in ids))
        return next((i for i, ok in zip(ids, found, strict=True) if ok), None)

    async def _targets(self, request: GenerateRequest, exclude: set[str]) -> list[str]:
        """Where to resume: LlumSched's choice first, then every other live instance
        (terminating ones last: better a draining instance than an error)."""
        live = [i for i in sorted(self.instances) if i not in exclude]
        first = None
        with contextlib.suppress(Exception):
            first = await asyncio.wait_for(self.llumsched.dispatch.remote(DispatchRequest(
                request.request_id, len(request.prompt_token_ids), request.priority,
                request.arrival_time, request.prompt_token_ids)), timeout=self.dispatch_timeout_s)
        rest = sorted(live, key=lambda i: (self.lifecycle.state(i) == InstanceState.TERMINATING, i))
        return ([first] if first in live else []) + [i for i in rest if i != first]

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
        stream = self._streams[request.request_id] = _Stream(request)
        try:
            iid = self._dispatch_here(request)
            added: Any = _PRESENT
            if iid is None:
                iid, added = await self._submit(request)
            if iid is None:
                raise LlumnixError("no instance is available to serve the request")
            if iid not in self.instances:
                await self.refresh_members()  # just started by auto-scaling
            stream.instance_id = iid
            if added is None:
                await self._add(stream, iid)
            elif added is not _PRESENT:
                self._spawn(self._confirm_added(stream, iid, added))
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
            self._streams.pop(request.request_id, None)
            self._unconfirmed.pop(request.request_id, None)

    async def _add(self, stream: _Stream, iid: str) -> None:
        """Send the request to ``iid`` ourselves (when LlumSched did not forward it)."""
        try:
            await asyncio.wait_for(self.instances[iid].add_request.remote(stream.request), self.call_timeout_s)
        except asyncio.CancelledError:
            raise
        except InvalidRequestError:
            raise
        except Exception as e:  # noqa: BLE001 - dead or stopping: another instance takes it
            await self._recover(stream, iid, e, exclude={iid})

    async def _confirm_added(self, stream: _Stream, iid: str, added: Any) -> None:
        """Wait, off the request's critical path, for the add that LlumSched forwarded; a
        failed one is handled as if the gateway had sent it."""
        try:
            await asyncio.wait_for(added, self.call_timeout_s)
        except asyncio.CancelledError:
            raise
        except InvalidRequestError as e:
            stream.queue.put_nowait(e)
        except Exception as e:  # noqa: BLE001 - dead, stopping, or LlumSched died holding the ref
            if not request_id_live(self._streams, stream):
                return
            import ray

            if isinstance(e, ray.exceptions.ObjectLostError) and iid in self.instances:
                # LlumSched, the ref's owner, died: the add may or may not have reached a
                # healthy instance. Find the request; else add it there ourselves.
                where = await self._locate(stream.request.request_id, exclude=set())
                if where is not None:
                    stream.instance_id = where
                else:
                    await self._add(stream, iid)
                return
            await self._recover(stream, iid, e, exclude={iid})

    async def _readd(self, stream: _Stream, iid: str) -> None:
        """An add sent on a channel that broke before the instance confirmed it: find the
        request (it may have arrived), else send it again."""
        if self._unconfirmed.get(stream.request.request_id) != iid or not request_id_live(self._streams, stream):
            return
        where = await self._locate(stream.request.request_id, exclude=set())
        if where is not None:
            stream.instance_id = where
            self._unconfirmed.pop(stream.request.request_id, None)
            return
        link = self._links.get(iid)
        if link is not None and link.is_open:
            link.add(stream.request)
        else:
            await self._add(stream, iid)

    async def _submit(self, request: GenerateRequest) -> tuple[str | None, Any]:
        """LlumSched dispatches and forwards (one call): the instance id and the forwarded
        add's ObjectRef. If it does not answer within a second (dead or restarting) the
        gateway places the request itself (ref None): where a forward got through before
        ``admit_by`` it stays (``_PRESENT``), else by the gateway's own round-robin."""
        rid = request.request_id
        admit_by = time.time() + self.dispatch_timeout_s / 2
        try:
            sub = await asyncio.wait_for(self.llumsched.submit.remote(
                dataclasses.replace(request, admit_by=admit_by)), timeout=self.dispatch_timeout_s)
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
            where = await self._locate(rid, exclude=set())  # a forward that made it in time
            if where is not None:
                return where, _PRESENT
            self.num_fallback_dispatches += 1
            picked = await self._cms_pick()
            if picked is not None:
                self.num_cms_dispatches += 1
                return picked, None
            takes = self.gs.takes_prefill if self.gs is not None else (lambda iid: True)
            ids = [i for i in sorted(self.instances)
                   if self.lifecycle.state(i) != InstanceState.TERMINATING and takes(i)] or sorted(self.instances)
            if not ids:
                return None, None
            return ids[self.num_fallback_dispatches % len(ids)], None

    async def _reap(self, iid: str, request_id: str) -> None:
        actor = self.instances.get(iid)
        try:
            if actor is not None and await asyncio.wait_for(actor.abort.remote(request_id), 5.0):
                self.num_reaped += 1
                log.warning("gateway: stopped an orphaned or fenced-off copy of %s on %s", request_id, iid)
        except Exception:  # noqa: BLE001 - unreachable: nothing to stop there
            pass
        finally:
            self._reaping.discard(request_id)

    async def abort(self, request_id: str) -> None:
        """Abort wherever the request is: where it was last seen first, then everywhere
        (it may have just migrated, or be mid-migration)."""
        stream = self._streams.get(request_id)
        iid = stream.instance_id if stream else None
        order = sorted(self.instances, key=lambda i: i != iid)
        for i in order:
            actor = self.instances.get(i)
            if actor is None:
                continue
            try:
                if await asyncio.wait_for(actor.abort.remote(request_id), 5.0):
                    return
            except Exception:  # noqa: BLE001 - an unreachable instance frees nothing anyway
                continue

    # -- admin ------------------------------------------------------------------------
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
                return bool(await asyncio.wait_for(actor.health.remote(), 2.0))
            except Exception:  # noqa: BLE001 - an unreachable instance is unhealthy
                return False

        ids = list(self.instances)
        states = dict(zip(ids, await asyncio.gather(*(alive(self.instances[i]) for i in ids)), strict=True))
        try:
            cap = await asyncio.wait_for(self.llumsched.capacity.remote(), 2.0)
            target, listed, replacing = int(cap["target"]), set(cap["serving"]), list(cap["replacing"])
        except Exception:  # noqa: BLE001 - LlumSched down or restarting: judge from here
            target, listed, replacing = self.num_configured, set(self.lifecycle.ids(InstanceState.SERVING)), []
        serving = sorted(i for i in listed if states.get(i))
        draining = sorted(i for i, ok in states.items() if ok and i not in listed)
        dead = sorted(i for i, ok in states.items() if not ok)
        status = ("ok" if len(serving) >= target else "degraded") if serving else (
            "drained" if draining else "unavailable")
        return {"status": status, "instances": states, "serving": serving, "target": target,
                "replacing": replacing, "draining": draining, "dead": dead}

    async def cluster_info(self) -> dict[str, Any]:
        try:
            info = dict(await asyncio.wait_for(self.llumsched.cluster_info.remote(), 5.0))
            info["source"] = "llumsched"
        except Exception:
            if self.cms is None:
                raise
            info = await self._cms_info()  # LlumSched away: the shared view, read here
        self._add_dispatch_info(info)
        info["gateway"] = {"num_fallback_dispatches": self.num_fallback_dispatches,
                           "num_local_dispatches": self.num_local_dispatches,
                           "channels": sorted(self._links),
                           "num_cms_dispatches": self.num_cms_dispatches,
                           "num_resumed": self.num_resumed,
                           "num_failed_instances": self.num_failed_instances,
                           "num_retired_instances": self.num_retired_instances,
                           "instances": sorted(self.instances)}
        return info

    def _add_dispatch_info(self, info: dict[str, Any]) -> None:
        """Dispatch happens here: this gateway's count joins LlumSched's (its dispatches
        while no channel was up), and prefix affinity's memory is this gateway's."""
        info["num_dispatched"] = int(info.get("num_dispatched", 0)) + self.num_local_dispatches
        index = self.gs.prefix_index if self.gs is not None else None
        if index is None:
            return
        for inst in info.get("instances", []):
            iid = inst["instance_id"]
            inst["prefix_blocks_sent"] = index.size(iid)
            inst["prefix_blocks_forgotten"] = index.num_forgotten.get(iid, 0)

    async def _cms_info(self) -> dict[str, Any]:
        from llumnix.cluster.meta_store import status_summary
        from llumnix.policy import FreenessConfig

        cfg, now = FreenessConfig(), time.time()
        statuses = await self._cms_statuses()
        return {"source": "cms", "instances": [status_summary(s, cfg, now)
                                               for s in sorted(statuses.values(), key=lambda s: s.instance_id)]}

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        if instance_id not in self.instances:
            raise InvalidRequestError(f"no instance {instance_id!r}", "instance_id")
        return await asyncio.wait_for(self.llumsched.drain.remote(instance_id), 15.0)

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        if instance_id not in self.instances:
            raise InvalidRequestError(f"no instance {instance_id!r}", "instance_id")
        return await asyncio.wait_for(self.llumsched.undrain.remote(instance_id), 15.0)
