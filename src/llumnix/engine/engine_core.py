"""EngineCore: schedule, execute, update. Nothing here knows which executor it has."""
from __future__ import annotations

import logging
import pickle
import random
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from llumnix.core.batch import (
    Executor,
    ModelOutput,
    RequestMetrics,
    RequestOutput,
    SchedulerOutput,
    token_output,
)
from llumnix.core.clock import Clock, WallClock
from llumnix.core.config import EngineConfig
from llumnix.core.errors import InvalidRequestError, RequestTooLongError, UnknownRequestError
from llumnix.core.request import Priority, Request, RequestStatus
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.core.stop import Detokenizer, find_stop, stop_floor
from llumnix.engine.migration_ops import MigrationOpsMixin
from llumnix.engine.scheduler import LocalScheduler
from llumnix.engine.status_builder import build_status
from llumnix.kv.kv_manager import KVManager

if TYPE_CHECKING:
    from llumnix.engine.pace import StepPacer

log = logging.getLogger(__name__)

MAX_FAILED_STEPS = 3
"""Steps in a row in which every request failed alone: then the fault is the engine's
(a lost device, a broken model), not the requests', and ``step`` raises."""


class EngineFailedError(RuntimeError):
    """Every request failed in ``MAX_FAILED_STEPS`` steps in a row: the engine is broken."""


class EngineCore(MigrationOpsMixin):
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        num_blocks: int,
        *,
        clock: Clock | None = None,
        instance_id: str = "instance-0",
        eos_token_id: int | None = None,
        detokenizer: Detokenizer | None = None,
        seed: int = 0,
        pacer: StepPacer | None = None,
    ) -> None:
        self.config = config
        self.pacer = pacer
        """Holds every step to a latency model's time (``engine/pace.py``); None: unpaced."""
        self.executor = executor
        self.clock = clock or WallClock()
        self.instance_id = instance_id
        self.eos_token_id = eos_token_id
        self.detokenizer = detokenizer
        self.kv = KVManager(num_blocks, config.cache.block_size, config.cache.watermark,
                            prefix_caching=config.cache.enable_prefix_caching)
        self.scheduler = LocalScheduler(config.scheduler, self.kv, self.clock.now)
        self.requests: dict[str, Request] = {}
        self.step_id = 0
        self.last_step_was_prefill = False
        """Whether the last ``step()`` ran a prefill batch (for step logs)."""
        self.last_batch: SchedulerOutput | None = None
        """The last ``step()``'s batch (its shape feeds the latency predictor: ``Llumlet.on_step``)."""
        self._rng = random.Random(seed)
        self.num_failed_requests = 0
        """Requests ended with an error because a step failed on them."""
        self._failed_steps_in_row = 0
        self._first_step_hooks: dict[str, Callable[[float | None], None]] = {}
        self.slo_classes_of: dict[int, str] = {}
        """Per priority, the SLO class of a request that names none (``set_objectives``)."""
        self.waiting_briefs: tuple[int, frozenset[str], tuple[RequestBrief, ...], float] | None = None
        """The last status's queue briefs, with the queue version and the migrating ids
        they were built for (``status_builder``)."""

    # -- requests ------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        priority: int = Priority.NORMAL,
        arrival_time: float | None = None,
        client: str = "",
        epoch: int = 0,
        slo_class: str = "",
    ) -> Request:
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        self.check_admissible(len(prompt_token_ids), sampling_params)
        seed = sampling_params.seed
        req = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=sampling_params,
            arrival_time=self.clock.now() if arrival_time is None else arrival_time,
            priority=int(priority),
            seed=self._rng.getrandbits(63) if seed is None else seed,
            eos_token_id=self.eos_token_id,
            client=client,
            epoch=epoch,
            slo_class=slo_class or self.slo_classes_of.get(int(priority), ""),
        )
        self.requests[request_id] = req
        self.scheduler.enqueue(req)
        return req

    def check_admissible(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Reject what could never be served, instead of queueing it forever."""
        if num_prompt_tokens < 1:
            raise InvalidRequestError("the prompt is empty", "prompt")
        max_len = self.config.max_model_len
        if num_prompt_tokens + 1 > max_len:
            raise RequestTooLongError(
                f"the prompt has {num_prompt_tokens} tokens; this model's context is "
                f"{max_len} tokens including at least one output token", "prompt")
        most = min(num_prompt_tokens + params.max_tokens, max_len)
        usable = self.kv.num_total_blocks - self.kv.num_watermark_blocks
        if self.kv.num_blocks_for(most) > usable:
            raise RequestTooLongError(
                f"the request needs up to {most} tokens of KV cache but this instance holds "
                f"{usable * self.kv.block_size}; lower max_tokens or the prompt", "max_tokens")

    def abort_request(self, request_id: str) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.remove(req)
        self.kv.free(request_id)
        self.drop_first_step_hook(request_id)
        req.status = RequestStatus.FINISHED_ABORTED
        req.finish_time = self.clock.now()
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step. A step that raises fails only the requests it concerns: each ends
        with finish reason ``"error"`` and its blocks freed; the rest of the batch goes on."""
        pacer = self.pacer
        started = pacer.begin() if pacer is not None else 0.0
        batch = self.schedule()
        if batch.is_empty:
            if pacer is not None:
                pacer.idle()
            return []
        self.last_step_was_prefill = batch.is_prefill
        self.last_batch = batch
        try:
            output = self.executor.execute(batch)
        except Exception as exc:  # noqa: BLE001 - isolated below, never the loop's end
            outputs = self._isolate(batch, exc)
            if all(o.finish_reason == "error" for o in outputs):
                self._failed_steps_in_row += 1
                if self._failed_steps_in_row >= MAX_FAILED_STEPS:
                    raise EngineFailedError(f"every request failed in {MAX_FAILED_STEPS} steps in a row; "
                                            f"last: {type(exc).__name__}: {exc}") from exc
            else:
                self._failed_steps_in_row = 0
            if pacer is not None:
                pacer.idle()
            return outputs
        self._failed_steps_in_row = 0
        if pacer is None:
            return self.update(batch, output)
        pacer.pace(batch, started)
        outputs = self.update(batch, output)
        if not self.scheduler.running and not self.scheduler.waiting:
            pacer.idle()  # the simulator's instance goes idle here too
        return outputs

    def _isolate(self, batch: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        """Find the entries a failed step concerns by running each half of the batch on
        its own (bisection: a few extra steps for one bad request in a large batch), and
        fail those alone. Running an entry again is safe: it writes its KV at its own
        slots from its own tokens, and its draw is a function of (seed, output index)."""
        if batch.num_entries == 1:
            return [self._fail(batch.scheduled[0].request_id, exc)]
        outputs: list[RequestOutput] = []
        for half in batch.halves():
            try:
                output = self.executor.execute(half)
            except Exception as e:  # noqa: BLE001 - narrowed further
                outputs += self._isolate(half, e)
            else:
                outputs += self.update(half, output)
        return outputs

    def _fail(self, request_id: str, exc: Exception) -> RequestOutput:
        req = self.requests[request_id]
        log.error("engine %s: the step failed on request %s; ending it with an error",
                  self.instance_id, request_id, exc_info=exc)
        self.abort_request(request_id)
        req.status = RequestStatus.FINISHED_ERROR
        self.num_failed_requests += 1
        return RequestOutput(request_id, [], req.num_output_tokens, "error", client=req.client, epoch=req.epoch,
                             error=f"the engine failed on this request ({type(exc).__name__})")

    def set_objectives(self, limits: Mapping[str, tuple[float, float]], order: str = "deadline",
                       classes_of: Mapping[int, str] | None = None) -> None:
        """Per SLO class (TTFT, TPOT) objectives the queue serves (``LocalScheduler.set_objectives``);
        ``classes_of``: per priority, the class a request added later that names none gets."""
        self.slo_classes_of = dict(classes_of or {})
        self.scheduler.set_objectives(limits, order)

    def schedule(self) -> SchedulerOutput:
        batch = self.scheduler.schedule()
        if self._first_step_hooks:  # a migrated request may rejoin a batch: its downtime ends
            self.run_first_step_hooks(batch)
        return batch

    def update(self, batch: SchedulerOutput, output: ModelOutput) -> list[RequestOutput]:
        self.step_id += 1
        now = self.clock.now()
        decode = batch.decode
        if decode is not None and output.logprobs is None and output.prompt_logprobs is None:
            return self._update_decode(decode.requests, output.sampled_token_ids, now)
        return self._update_entries(batch, output, now)

    def _update_decode(self, scheduled: list[Request], tokens: list[int], now: float) -> list[RequestOutput]:
        """``_update_entries`` for a decode step without logprobs (most steps): every entry
        computed its last token and sampled one, so the loop has no chunk test, no entry
        index and no logprobs. Each request's fields are set as there, in the same order
        (``tests/engine/test_decode_batch.py`` holds the two paths equal)."""
        outputs: list[RequestOutput] = []
        add = outputs.append
        requests = self.requests
        running = RequestStatus.RUNNING
        kv = self.kv if self.kv.prefix is not None else None
        max_len = self.config.max_model_len
        length = RequestStatus.FINISHED_LENGTH
        for r, token in zip(scheduled, tokens, strict=True):
            rid = r.request_id
            req = requests.get(rid)
            if req is None or req.status != running:
                continue  # aborted or paused while the step ran
            out_ids = req.output_token_ids
            n_prompt = len(req.prompt_token_ids)
            n_out = len(out_ids) + 1  # with the new token
            req.num_computed_tokens = n_prompt + n_out - 1  # not the new token
            if kv is not None:
                kv.cache_computed(rid, req.prompt_token_ids, out_ids, req.num_computed_tokens)
            out_ids.append(token)
            if req.first_token_time is None:
                req.first_token_time = now
            if req.preempted_at is not None:
                req.preemption_loss += now - req.preempted_at
                req.preempted_at = None
            params = req.sampling_params
            if req.can_stop_on_token and n_out >= params.min_tokens and (
                    (token == req.eos_token_id and not params.ignore_eos) or token in params.stop_token_set
                    or params.stop):
                status = self._check_stop(req, token)
            elif n_out >= params.max_tokens or n_prompt + n_out >= max_len:
                status = length
            else:
                status = None
            if status is None:
                add(token_output(rid, token, n_out, None, req.stop_reason, None, req.client, req.epoch))
            else:
                metrics = self._finish(req, status, now)
                add(token_output(rid, token, n_out, status.finish_reason, req.stop_reason, metrics, req.client,
                                 req.epoch))
        return outputs

    def _update_entries(self, batch: SchedulerOutput, output: ModelOutput, now: float) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        add = outputs.append
        logprobs = output.logprobs
        prompt_lps = output.prompt_logprobs
        requests = self.requests
        running = RequestStatus.RUNNING
        caching = self.kv.prefix is not None
        max_len = self.config.max_model_len
        length = RequestStatus.FINISHED_LENGTH
        # A decode step's entries all sample; its DecodeBatch is read without building them.
        entries = None if batch.decode is not None else batch.scheduled
        for i, (rid, token) in enumerate(zip(batch.request_ids, output.sampled_token_ids, strict=True)):
            req = requests.get(rid)
            if req is None or req.status != running:
                continue  # aborted or paused while the step ran
            if entries is not None and not entries[i].sample:  # a prefill chunk short of the sequence's end
                req.num_computed_tokens = entries[i].context_len
                if caching:
                    self.kv.cache_computed(req.request_id, req.prompt_token_ids, req.output_token_ids,
                                           req.num_computed_tokens)
                continue
            out_ids = req.output_token_ids
            n_prompt = len(req.prompt_token_ids)
            n_out = len(out_ids) + 1  # with the new token
            req.num_computed_tokens = n_prompt + n_out - 1  # not the new token
            if caching:
                self.kv.cache_computed(req.request_id, req.prompt_token_ids, out_ids, req.num_computed_tokens)
            out_ids.append(token)
            lp = top = None
            if logprobs is not None:
                lp, top = self._logprobs_of(req, output, i)
            if req.first_token_time is None:
                req.first_token_time = now
            if req.preempted_at is not None:
                req.preemption_loss += now - req.preempted_at
                req.preempted_at = None
            params = req.sampling_params
            # Most tokens can end their request only by its length (no EOS, stop id or
            # stop string can match): checked here; the rest in _check_stop (same outcome).
            if req.can_stop_on_token and n_out >= params.min_tokens and (
                    (token == req.eos_token_id and not params.ignore_eos) or token in params.stop_token_set
                    or params.stop):
                status = self._check_stop(req, token)
            elif n_out >= params.max_tokens or n_prompt + n_out >= max_len:
                status = length
            else:
                status = None
            if status is None:
                ro = RequestOutput(req.request_id, [token], n_out, None, lp, req.stop_reason,
                                   None, req.client, req.epoch, top)
            else:
                metrics = self._finish(req, status, now)
                ro = RequestOutput(req.request_id, [token], n_out, status.finish_reason,
                                   lp, req.stop_reason, metrics, req.client, req.epoch, top)
            if prompt_lps is not None:
                ro.prompt_logprobs = prompt_lps[i]
            add(ro)
        return outputs

    @staticmethod
    def _logprobs_of(req: Request, output: ModelOutput, i: int) -> tuple[list[float], list[Any] | None]:
        """Entry ``i``'s sampled-token logprob (kept on the request) and its alternatives."""
        assert output.logprobs is not None
        lp = [output.logprobs[i]]
        req.output_logprobs.extend(lp)
        num_top = req.sampling_params.logprobs
        top = [output.top_logprobs[i][:num_top]] if output.top_logprobs is not None and num_top else None
        return lp, top

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        n_out = len(req.output_token_ids)  # the new token included
        if n_out < params.min_tokens:
            pass  # nothing but the length ends it yet
        elif token == req.eos_token_id and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        elif token in params.stop_token_set:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        elif params.stop and self.detokenizer is not None:
            tail = max(len(s) for s in params.stop) + 4
            window = req.output_token_ids[-tail:]
            # A stop string must end in the text of the min_tokens-th token or later.
            floor = stop_floor(self.detokenizer, window, params.min_tokens - 1 - (n_out - len(window)))
            hit = find_stop(self.detokenizer.decode(window), params.stop, floor)
            if hit is not None:
                req.stop_reason = hit[1]
                return RequestStatus.FINISHED_STOPPED
        if n_out >= params.max_tokens or len(req.prompt_token_ids) + n_out >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, req: Request, status: RequestStatus, now: float) -> RequestMetrics:
        req.status = status
        req.finish_time = now
        self.scheduler.running.remove(req)
        self.kv.free(req.request_id)
        del self.requests[req.request_id]
        return RequestMetrics(
            arrival_time=req.arrival_time, first_scheduled_time=req.first_scheduled_time,
            first_token_time=req.first_token_time, finish_time=now,
            num_prompt_tokens=req.num_prompt_tokens, num_output_tokens=req.num_output_tokens,
            num_preemptions=req.num_preemptions, preemption_loss=req.preemption_loss,
            priority=req.priority, num_cached_tokens=req.num_cached_tokens,
            instance_id=self.instance_id, num_migrations=req.num_migrations,
        )

    # -- introspection ---------------------------------------------------------
    def get_request(self, request_id: str) -> Request:
        try:
            return self.requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

    def get_status(self, *, migrating: Collection[str] = (), **fields: Any) -> InstanceStatus:
        """The status snapshot; see ``build_status`` for the arguments."""
        return build_status(self, migrating, fields)

    def snapshot(self, migrating: Collection[str], fields: dict[str, Any]) -> InstanceStatus:
        """``get_status`` with its arguments as they are (``Llumlet``'s one call a report:
        no keywords to spread into a new dict)."""
        return build_status(self, migrating, fields)

    def take_evicted_prefix_keys(self) -> list[bytes]:
        """Prefix-cache keys this engine evicted since the last call (``Llumlet.push``)."""
        return self.kv.take_evicted_keys()

    def shared_blocks(self, request_ids: Collection[str]) -> dict[str, int]:
        """Per request, the blocks of its table other requests hold too (prefix caching)."""
        return {rid: self.kv.num_shared_blocks_of(rid) for rid in request_ids}

    def running_near_end(self, num_tokens: int) -> set[str]:
        """Running requests with fewer than ``num_tokens`` output tokens left (a
        migration's selection skips them: they would end before it commits)."""
        return {r.request_id for r in self.scheduler.running
                if r.sampling_params.max_tokens - len(r.output_token_ids) < num_tokens}

    def snapshot_request(self, request_id: str) -> Request:
        """A detached copy of the request: the wire form migration sends. A pickle round
        trip, not ``copy.deepcopy``: the same copy, about 5x faster on long token lists
        (4k tokens: 0.19 ms against 1.0 ms), and it is taken inside the migration's
        downtime."""
        snap: Request = pickle.loads(pickle.dumps(self.get_request(request_id), pickle.HIGHEST_PROTOCOL))
        return snap

    def check_invariants(self) -> None:
        self.kv.check_invariants()
        sched = self.scheduler
        queued = sched.waiting + sched.running + list(sched.paused.values())
        ids = [r.request_id for r in queued]
        assert len(ids) == len(set(ids)), "a request is in two queues"
        assert set(ids) == set(self.requests), "queues and the request table disagree"
        for r in sched.waiting:
            assert r.status == RequestStatus.WAITING
            assert not self.kv.has(r.request_id) or self.kv.is_reserved(r.request_id)
        for r in sched.running + list(sched.paused.values()):
            assert r.status in (RequestStatus.RUNNING, RequestStatus.PAUSED)
            have = self.kv.num_blocks_of(r.request_id)
            assert have >= self.kv.num_blocks_for(r.num_computed_tokens), (
                f"{r.request_id} has {have} blocks for {r.num_computed_tokens} computed tokens")
        live = {r.request_id for r in sched.running} | set(sched.paused)
        for rid in self.kv.reserved_ids():
            assert rid not in live, f"{rid} is both live and reserved"
