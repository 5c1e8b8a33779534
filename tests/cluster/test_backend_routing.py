"""ClusterBackend's output routing without Ray: streams take their own outputs, and a
copy nobody should be running (fenced off by a resume, or orphaned) is stopped."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")  # the backend module imports it

from llumnix.cluster.gateway_client import ClusterBackend  # noqa: E402
from llumnix.cluster.output_stream import OutputStream  # noqa: E402
from llumnix.core.batch import RequestOutput  # noqa: E402
from llumnix.core.sampling_params import SamplingParams  # noqa: E402
from llumnix.core.wire import GenerateRequest  # noqa: E402


class _Remote:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        async def call():
            return self._fn(*args)
        return call()


class FakeInstance:
    def __init__(self, holds: set[str]) -> None:
        self.holds = holds
        self.aborted: list[str] = []
        self.abort = _Remote(self._abort)

    def _abort(self, rid: str) -> bool:
        self.aborted.append(rid)
        found = rid in self.holds
        self.holds.discard(rid)
        return found


INFO = {"model": "m", "max_model_len": 64, "vocab_size": 100, "num_blocks": 16, "watermark": 0.0,
        "block_size": 4}


def _backend(instances):
    return ClusterBackend(None, instances, INFO, tokenizer=None)


def _out(rid, n, epoch=0, finished=False):
    return RequestOutput(rid, [n], n, "length" if finished else None, client="gw", epoch=epoch)


def test_outputs_of_a_fenced_off_copy_are_dropped_and_the_copy_is_stopped():
    async def main():
        a, b = FakeInstance({"r"}), FakeInstance({"r"})
        be = _backend({"a": a, "b": b})
        req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
        stream = be.streams["r"] = OutputStream(req)
        be._route("a", _out("r", 1))
        # "a" failed; the gateway resumed the request on "b" (a new epoch), but a migration
        # from "a" had committed a copy elsewhere just before: its epoch-0 outputs arrive late
        stream.request = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw",
                                         epoch=1)
        stream.instance_id = "b"
        be._route("b", _out("r", 2, epoch=1))
        be._route("a", _out("r", 2, epoch=0))
        be._route("a", _out("r", 3, epoch=0))  # one stop is asked for, not one per output
        await asyncio.gather(*be.tasks)
        got = [stream.queue.get_nowait().num_output_tokens for _ in range(stream.queue.qsize())]
        return got, a, b, be

    got, a, b, be = asyncio.run(main())
    assert got == [1, 2]  # the stale copy's token 2 was not released, nor its token 3
    assert a.aborted == ["r"] and b.aborted == [] and be.failover.num_reaped == 1


def test_outputs_nobody_waits_for_stop_their_request():
    async def main():
        a = FakeInstance({"gone", "done"})
        be = _backend({"a": a})
        be._route("a", _out("gone", 5))  # its client left (its stream is gone)
        be._route("a", _out("done", 8, finished=True))  # finished: nothing to stop
        await asyncio.gather(*be.tasks)
        return a, be

    a, be = asyncio.run(main())
    assert a.aborted == ["gone"] and be.failover.num_reaped == 1


class PollOnce:
    """An instance whose output poll the test answers by hand."""

    def __init__(self) -> None:
        self.polls: list[asyncio.Future] = []
        self.poll_outputs = self

    def remote(self, *args):
        fut = asyncio.get_running_loop().create_future()
        self.polls.append(fut)
        return fut


def test_stop_ends_a_poller_whose_cancel_raced_with_its_poll_answer():
    """Python 3.11's wait_for returns the inner result instead of raising when the cancel
    and the answer land in the same loop turn; the poller then polls again. stop() must
    still end it (CI hung 30 s in the gateway's shutdown on this)."""
    async def main():
        inst = PollOnce()
        be = _backend({"a": inst})
        be.members.membership_interval_s = 3600
        be.llumsched = None
        be.start_poller("a", inst)
        while not inst.polls:
            await asyncio.sleep(0)
        inst.polls[0].set_result((0, []))  # the answer and the cancel in the same turn
        await asyncio.wait_for(be.stop(timeout_s=5), 5)
        return be.pollers["a"]

    poller = asyncio.run(main())
    assert poller.done()


class StoppedInstance:
    """An instance actor that has stopped: its output poll raises, as the real one does."""

    def __init__(self, iid: str) -> None:
        self.poll_outputs = _Remote(self._stopped)
        self.iid = iid

    def _stopped(self, *args):
        raise RuntimeError(f"instance {self.iid} stopped: None")


class LiveInstance:
    """A serving instance that holds the requests in ``holds``."""

    def __init__(self, holds: set[str]) -> None:
        self.num_output_tokens = _Remote(lambda rid: 3 if rid in holds else -1)


class FakeLlumSched:
    def __init__(self, members: dict) -> None:
        self._members = members
        self.removed: list[str] = []
        # as LlumSchedActor.members: no handle for the instances the caller knows
        self.members = _Remote(lambda known=None: {i: {**m, "handle": None if i in (known or ()) else m["handle"]}
                                                   for i, m in self._members.items()})
        self.remove_instance = _Remote(lambda iid, why: self.removed.append(iid))


def test_an_instance_that_scale_in_stopped_is_retired_not_counted_as_failed():
    """Scale-in drains an instance and stops it once empty; the gateway's poller then
    sees the stopped actor. That is a planned end: no failure is counted or logged and
    LlumSched is not asked to remove it again. An instance that stops while serving (or
    without being drained) is still a failure and its streams are resumed elsewhere."""
    async def main():
        a, b, c = StoppedInstance("a"), StoppedInstance("b"), StoppedInstance("c")
        d = LiveInstance({"m"})
        sched = FakeLlumSched({"a": {"handle": a, "is_terminating": True},
                               "b": {"handle": b, "is_terminating": False},
                               "c": {"handle": c, "is_terminating": True},
                               "d": {"handle": d, "is_terminating": False}})
        be = _backend({"a": a, "b": b, "c": c, "d": d})
        be.llumsched = sched
        await be.members.refresh()
        del sched._members["a"]  # scale-in stopped "a"
        await be.members.refresh()
        # "m" migrated from "a" to "d" and "a" stopped before "d" sent an output for it
        moved = GenerateRequest("m", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
        be.streams["m"] = OutputStream(moved)
        be.streams["m"].instance_id = "a"
        await be._poll("a", a)
        counts_after_a = (be.failover.num_retired_instances, be.failover.num_failed_instances, list(sched.removed),
                          be.streams["m"].instance_id)
        # "c" is draining but a stream of ours still lives there: it must be resumed
        req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
        be.streams["r"] = OutputStream(req)
        be.streams["r"].instance_id = "c"
        be.failover.max_resumes = 0  # end the resume at once: the test checks which path was taken
        await be._poll("c", c)
        await asyncio.gather(*be.tasks)
        counts_after_c = (be.failover.num_retired_instances, be.failover.num_failed_instances, list(sched.removed))
        await be._poll("b", b)  # not draining: a failure
        return counts_after_a, counts_after_c, be, sched

    after_a, after_c, be, sched = asyncio.run(main())
    assert after_a == (1, 0, [], "d")
    assert after_c == (1, 1, ["c"])
    assert (be.failover.num_retired_instances, be.failover.num_failed_instances, sched.removed) == (1, 2, ["c", "b"])
    assert sorted(be.instances) == ["d"]
    err = be.streams["r"].queue.get_nowait()
    assert "instance c failed" in str(err)


def test_an_error_output_ends_only_its_stream_with_a_request_failed_error():
    from llumnix.core.errors import RequestFailedError

    async def main():
        be = _backend({"a": FakeInstance({"r", "s"})})
        streams = {}
        for rid in ("r", "s"):
            req = GenerateRequest(rid, [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
            streams[rid] = be.streams[rid] = OutputStream(req)
        be._route("a", _out("r", 1))
        be._route("a", _out("s", 1))
        be._route("a", RequestOutput("r", [], 1, "error", client="gw", error="the engine failed (RuntimeError)"))
        be._route("a", _out("s", 2))
        be._route("a", _out("r", 2))  # nothing after the error is released
        return {rid: [s.queue.get_nowait() for _ in range(s.queue.qsize())] for rid, s in streams.items()}

    got = asyncio.run(main())
    assert [o.num_output_tokens for o in got["r"][:-1]] == [1]
    assert isinstance(got["r"][-1], RequestFailedError) and "RuntimeError" in str(got["r"][-1])
    assert [o.num_output_tokens for o in got["s"]] == [1, 2]


def test_a_request_whose_second_instance_dies_is_not_resumed_a_third_time():
    async def main():
        be = _backend({"b": FakeInstance(set())})
        req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
        stream = be.streams["r"] = OutputStream(req)
        stream.instance_id = "a"
        stream.num_resumes = 1  # it was resumed once already, after its first instance died
        be.instances["b"].num_output_tokens = _Remote(lambda rid: -1)
        await be.failover.recover(stream, "a", RuntimeError("Traceback ... /home/ray pid=123 10.0.0.7"))
        return stream.queue.get_nowait()

    err = asyncio.run(main())
    assert "not resumed again" in str(err) and "Traceback" not in str(err) and "10.0.0.7" not in str(err)


def test_the_fallback_from_the_shared_view_never_picks_a_stale_draining_or_dead_instance():
    import time

    from llumnix.core.status import InstanceStatus, RequestBrief

    now = time.time()

    def st(iid, used, age=0.0, **kw):
        running = (RequestBrief(f"{iid}-r", 0, used, 16 * used, now, True),)
        return InstanceStatus(iid, now - age, 100, used, 1, 16, 8, running=running, **kw)

    class Store:
        def __init__(self, statuses):
            self.statuses = statuses

        def all_statuses(self):
            return dict(self.statuses)

    async def pick(statuses, dead=(), roles=None):
        be = _backend({k: FakeInstance(set()) for k in ("a", "b", "c", "d")})
        be.cms.store = Store({s.instance_id: s for s in statuses})
        for iid in dead:
            be.lifecycle.move(iid, InstanceState.FAILED, now)
        if roles:
            from llumnix.policy import GlobalScheduler

            be.gs = GlobalScheduler(None, cluster=be.cluster)
            for iid, role in roles.items():
                be.gs.set_role(iid, role)
        return await be.cms.pick()

    from llumnix.policy.lifecycle import InstanceState

    assert asyncio.run(pick([st("a", 90), st("b", 10), st("c", 50)])) == "b"  # the freest
    assert asyncio.run(pick([st("a", 90), st("b", 10, age=5.0)])) == "a"  # b's entry is stale
    assert asyncio.run(pick([st("a", 90), st("b", 10, is_terminating=True)])) == "a"  # b drains
    assert asyncio.run(pick([st("a", 90), st("b", 10)], dead=["b"])) == "a"  # b's actor died
    assert asyncio.run(pick([st("b", 10, age=5.0)])) is None  # nothing fresh: round-robin instead
    # PD: a decode instance takes no new request, however free
    assert asyncio.run(pick([st("a", 90), st("b", 10)], roles={"a": "prefill", "b": "decode"})) == "a"


def test_llumsched_dying_with_the_forwarded_add_does_not_fail_a_healthy_instance():
    """Issue 28's soak: LlumSched died 0.3 s after dispatch; the forwarded add's ref died
    with it (OwnerDiedError), and the gateway took that for the instance failing, excluded
    it, and ended the request with an error although the instance was serving."""
    import ray.exceptions

    class Healthy:
        def __init__(self, holds):
            self.holds, self.added = set(holds), []
            self.num_output_tokens = _Remote(lambda rid: 0 if rid in self.holds else -1)
            self.add_request = _Remote(lambda req: (self.added.append(req.request_id), self.holds.add(req.request_id)))

    async def lost():
        raise ray.exceptions.OwnerDiedError("ff" * 14, None, "")

    async def main(holds):
        inst = Healthy(holds)
        be = _backend({"a": inst})
        req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
        stream = be.streams["r"] = OutputStream(req)
        stream.instance_id = "a"
        await be.failover.confirm_added(stream, "a", lost())
        return inst, stream

    inst, stream = asyncio.run(main(set()))  # the add never arrived: the gateway adds it there
    assert inst.added == ["r"] and stream.queue.empty() and stream.instance_id == "a"
    inst, stream = asyncio.run(main({"r"}))  # it arrived: nothing more to do
    assert inst.added == [] and stream.queue.empty() and stream.instance_id == "a"


def test_a_llumsched_with_an_empty_view_does_not_fail_a_request_the_gateway_can_place():
    """The soak: a request 1.3 s after a LlumSched restart got 'no instance is available'
    from the new incarnation, whose view was still empty, though two instances served."""
    class EmptyView:
        submit = _Remote(lambda req, arrival=None: None)

    async def main(states):
        be = _backend({"a": FakeInstance(set()), "b": FakeInstance(set())})
        be.llumsched = EmptyView()
        be.dispatch_timeout_s = 0.05
        for iid, state in states.items():
            be.lifecycle.move(iid, state, 0.0)
        be.failover.locate = lambda rid, exclude: asyncio.sleep(0, None)
        req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8), 0, 0.0, client="gw")
        return await be._submit(req)

    from llumnix.policy.lifecycle import InstanceState

    iid, added = asyncio.run(main({}))
    assert iid in ("a", "b") and added is None  # placed by the gateway
    assert asyncio.run(main({"a": InstanceState.FAILED, "b": InstanceState.FAILED})) == (None, None)


class _Link:
    def __init__(self, iid):
        self.instance_id, self.is_open, self.sent = iid, True, []

    def add(self, request):
        self.sent.append(request)


def test_outputs_that_queue_up_behind_a_busy_consumer_go_out_as_one():
    """A stream's consumer that falls behind gets what queued as one output (tokens,
    logprobs in order, the last one's finish), so it writes one chunk, not several."""
    from llumnix.core.status import InstanceStatus
    from llumnix.policy import GlobalScheduler

    async def main():
        be = _backend({"a": object()})
        be.gs = GlobalScheduler(cluster=be.cluster)
        be.on_statuses("a", [InstanceStatus("a", 0.0, 16, 16, 4, 16, 1)])
        be.links = {"a": _Link("a")}
        req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=8, seed=1), 0, 0.0)
        gen = be.generate(req)
        first = asyncio.ensure_future(gen.__anext__())
        for _ in range(50):  # until generate has sent the request and waits for outputs
            await asyncio.sleep(0)
            if be.links["a"].sent:
                break
        lp = lambda x: [x]  # noqa: E731
        be.on_outputs("a", [RequestOutput("r", [7], 1, new_logprobs=lp(-0.1), client=be.client_id)])
        o1 = await first
        assert o1.new_token_ids == [7]
        # Three more arrive before the consumer asks again: one output, in order.
        be.on_outputs("a", [RequestOutput("r", [8], 2, new_logprobs=lp(-0.2), client=be.client_id),
                            RequestOutput("r", [9], 3, new_logprobs=lp(-0.3), client=be.client_id),
                            RequestOutput("r", [10], 4, "length", new_logprobs=lp(-0.4), client=be.client_id)])
        o2 = await gen.__anext__()
        assert (o2.new_token_ids, o2.num_output_tokens, o2.finish_reason) == ([8, 9, 10], 4, "length")
        assert o2.new_logprobs == [-0.2, -0.3, -0.4]
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        assert [r.request_id for r in be.links["a"].sent] == ["r"]

    asyncio.run(main())


def test_a_merged_output_is_released_in_order_between_single_ones():
    """A final-only request that migrated: the source sends its tokens 1-3 as one output
    when the request leaves it; the destination's tokens 4 and 5 may come first."""
    stream = OutputStream(GenerateRequest("r", [1], SamplingParams(max_tokens=5), 0, 0.0, client="gw", final_only=True))
    stream.offer(_out("r", 4))
    stream.offer(RequestOutput("r", [1, 2, 3], 3, None, client="gw"))  # the source's, merged
    stream.offer(_out("r", 5, finished=True))
    stream.offer(RequestOutput("r", [1, 2, 3], 3, None, client="gw"))  # a duplicate
    got = [stream.queue.get_nowait() for _ in range(stream.queue.qsize())]
    assert [o.new_token_ids for o in got] == [[1, 2, 3], [4], [5]] and stream.token_ids == [1, 2, 3, 4, 5]
    assert stream.is_finished
