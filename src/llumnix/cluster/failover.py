"""The gateway's failover: an instance that dies (or is stopped with a stream still on
it) has each request it held resumed on a healthy instance from its prompt plus the tokens
already released to the client (a recompute), so the client's stream goes on without a
gap or a repeat; adds lost with a broken line or a dead LlumSched are found or resent;
copies no stream wants (a left client, a fenced-off epoch) are stopped."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from llumnix.cluster.output_stream import OutputStream, actor_key, is_live
from llumnix.core.aio import within
from llumnix.core.errors import InvalidRequestError, LlumnixError, RequestFailedError
from llumnix.core.wire import GenerateRequest, wall_arrival
from llumnix.policy import DispatchRequest
from llumnix.policy.lifecycle import InstanceState

if TYPE_CHECKING:
    from llumnix.cluster.gateway_client import ClusterBackend

log = logging.getLogger(__name__)


class Failover:
    def __init__(self, backend: ClusterBackend) -> None:
        self._b = backend
        self.max_resumes = 1
        """Resumes after an instance failure; a request whose second instance dies too is
        ended with an error rather than risk taking down a third (it may be the cause)."""
        self.num_resumed = 0
        self.num_failed_instances = 0
        self.num_retired_instances = 0
        self.num_reaped = 0
        """Request copies stopped because no stream wanted their outputs (``reap``)."""
        self.reaping: set[str] = set()

    async def on_instance_failed(self, iid: str, actor: Any, err: BaseException) -> None:
        if self._b.instances.get(iid) is not actor:
            return
        import ray

        del self._b.instances[iid]
        self._b.pollers.pop(iid, None)
        self._b.links.pop(iid, None)
        if self._b.gs is not None:
            self._b.gs.remove_instance(iid)
        self._b.dead.add(actor_key(actor))
        planned = self._b.lifecycle.state(iid) in (InstanceState.TERMINATING, InstanceState.RETIRED)
        if not planned:
            self._b.lifecycle.move(iid, InstanceState.FAILED, time.time(), type(err).__name__)
        else:
            # Scale-in (or a drain) empties an instance by migration and then stops it: a
            # planned end, unless a stream of ours is still there. A stream whose request
            # migrated may not have had an output from its new home yet: look for it.
            on_it = [s for s in self._b.streams.values() if s.instance_id == iid and not s.is_finished]
            homes = await asyncio.gather(*(self.locate(s.request.request_id, {iid}) for s in on_it))
            for stream, home in zip(on_it, homes, strict=True):
                if home is not None and stream.instance_id == iid:
                    stream.instance_id = home
            if all(home is not None for home in homes):
                log.info("gateway: instance %s retired (drained and stopped)", iid)
                self._b.lifecycle.move(iid, InstanceState.RETIRED, time.time())
                self.num_retired_instances += 1
                return
            self._b.lifecycle.move(iid, InstanceState.FAILED, time.time(), "stopped with a stream on it")
        log.warning("gateway: instance %s failed (%s: %s); resuming its requests elsewhere",
                    iid, type(err).__name__, err)
        self.num_failed_instances += 1
        with contextlib.suppress(Exception):  # a wedged one must not produce duplicates later
            ray.kill(actor)  # type: ignore[arg-type]
        with contextlib.suppress(Exception):  # LlumSched down: its own health check finds out
            await within(self._b.llumsched.remove_instance.remote(iid, f"gateway: {err}"), 2.0)
        for stream in list(self._b.streams.values()):
            if stream.instance_id == iid and not stream.is_finished:
                self._b.spawn(self.recover(stream, iid, err))

    async def recover(self, stream: OutputStream, lost_iid: str, err: BaseException,
                       exclude: set[str] | None = None) -> None:
        """Resume ``stream``'s request on a healthy instance, from its prompt plus the
        tokens already released; if none can take it, end the stream with an error."""
        if stream.instance_id != lost_iid or stream.is_recovering or stream.is_finished:
            return
        rid = stream.request.request_id
        stream.is_recovering = True
        try:
            where = await self.locate(rid, exclude={lost_iid, *(exclude or ())})
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
                actor = self._b.instances.get(iid)
                if actor is None:
                    continue
                stream.instance_id = iid
                try:
                    await within(actor.resume_request.remote(stream.request, tokens),
                                 self._b.call_timeout_s)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - try the next instance
                    last = e
                    continue
                if tokens:
                    self.num_resumed += 1
                    log.warning("gateway: request %s resumed on %s after %d tokens", rid, iid, len(tokens))
                if rid not in self._b.streams:  # the client left meanwhile
                    await self._b.abort(rid)
                return
            raise LlumnixError(f"instance {lost_iid} failed ({type(err).__name__}) and no other instance could "
                               f"take the request" + (f" ({type(last).__name__})" if last else ""))
        except LlumnixError as e:
            stream.queue.put_nowait(e)
        finally:
            stream.is_recovering = False

    async def locate(self, request_id: str, exclude: set[str]) -> str | None:
        """The live instance that holds ``request_id``, if any."""
        ids = [i for i in self._b.instances if i not in exclude]

        async def has(iid: str) -> bool:
            try:
                n = await within(self._b.instances[iid].num_output_tokens.remote(request_id), 2.0)
            except Exception:  # noqa: BLE001 - an unreachable instance does not hold it for us
                return False
            return int(n) >= 0

        found = await asyncio.gather(*(has(i) for i in ids))
        return next((i for i, ok in zip(ids, found, strict=True) if ok), None)

    async def _targets(self, request: GenerateRequest, exclude: set[str]) -> list[str]:
        """Where to resume: LlumSched's choice first, then every other live instance
        (terminating ones last: better a draining instance than an error)."""
        live = [i for i in sorted(self._b.instances) if i not in exclude]
        first = None
        with contextlib.suppress(Exception):
            first = await within(self._b.llumsched.dispatch.remote(DispatchRequest(
                request.request_id, len(request.prompt_token_ids), request.priority,
                wall_arrival(request), request.prompt_token_ids)), self._b.dispatch_timeout_s)
        rest = sorted(live, key=lambda i: (self._b.lifecycle.state(i) == InstanceState.TERMINATING, i))
        return ([first] if first in live else []) + [i for i in rest if i != first]

    async def confirm_added(self, stream: OutputStream, iid: str, added: Any) -> None:
        """Wait, off the request's critical path, for the add that LlumSched forwarded; a
        failed one is handled as if the gateway had sent it."""
        try:
            await within(added, self._b.call_timeout_s)
        except asyncio.CancelledError:
            raise
        except InvalidRequestError as e:
            stream.queue.put_nowait(e)
        except Exception as e:  # noqa: BLE001 - dead, stopping, or LlumSched died holding the ref
            if not is_live(self._b.streams, stream):
                return
            import ray

            if isinstance(e, ray.exceptions.ObjectLostError) and iid in self._b.instances:
                # LlumSched, the ref's owner, died: the add may or may not have reached a
                # healthy instance. Find the request; else add it there ourselves.
                where = await self.locate(stream.request.request_id, exclude=set())
                if where is not None:
                    stream.instance_id = where
                else:
                    await self._b.add(stream, iid)
                return
            await self.recover(stream, iid, e, exclude={iid})

    async def readd(self, stream: OutputStream, iid: str) -> None:
        """An add sent on a channel that broke before the instance confirmed it: find the
        request (it may have arrived), else send it again."""
        if self._b.unconfirmed.get(stream.request.request_id) != iid or not is_live(self._b.streams, stream):
            return
        where = await self.locate(stream.request.request_id, exclude=set())
        if where is not None:
            stream.instance_id = where
            self._b.unconfirmed.pop(stream.request.request_id, None)
            return
        link = self._b.links.get(iid)
        if link is not None and link.is_open:
            link.add(stream.request)
        else:
            await self._b.add(stream, iid)

    async def reap(self, iid: str, request_id: str) -> None:
        actor = self._b.instances.get(iid)
        try:
            if actor is not None and await within(actor.abort.remote(request_id), 5.0):
                self.num_reaped += 1
                log.warning("gateway: stopped an orphaned or fenced-off copy of %s on %s", request_id, iid)
        except Exception:  # noqa: BLE001 - unreachable: nothing to stop there
            pass
        finally:
            self.reaping.discard(request_id)
