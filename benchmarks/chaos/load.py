"""Driving the gateway: the reference answers, the capacity ramp (closed loop), and the
open-loop soak load, all from one seeded stream of request shapes."""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.chaos.workload import Outcome, Shape, request_body, send

CAPACITY_RULE = ("closed-loop ramp over concurrency levels: at each level that many workers send back-to-back "
                 "streamed requests (the soak's prompts and endpoints, max_tokens fixed) for one window; the "
                 "level's throughput is the output tokens the clients received in the window's last two thirds "
                 "(the first third is warm-up) per second, divided by max_tokens (requests/s); the ramp stops at "
                 "the first level whose throughput is below 1.1 x the best so far (saturation), and capacity is "
                 "the best throughput seen; the soak then sends Poisson arrivals at load_fraction x capacity")
WARMUP_FRACTION = 1 / 3


@dataclass
class Driver:
    url: str
    model: str
    prompts: list[str]
    max_tokens: int
    timeout_s: float
    rng: random.Random
    client: Any
    in_flight: dict[int, tuple[Outcome, asyncio.Event]] = field(default_factory=dict)

    def next_shape(self, stream: bool | None = None) -> Shape:
        shape = Shape(self.rng.randrange(len(self.prompts)), self.rng.random() < 0.5, self.rng.random() < 0.5)
        return shape if stream is None else Shape(shape.prompt_index, shape.chat, stream)

    async def one(self, shape: Shape) -> Outcome:
        path, body = request_body(self.model, self.prompts[shape.prompt_index], shape, self.max_tokens)
        out, cut = Outcome(shape, sent_s=time.time()), asyncio.Event()
        self.in_flight[id(out)] = (out, cut)
        try:
            return await send(self.client, self.url, path, body, out, self.timeout_s, cut)
        finally:
            self.in_flight.pop(id(out), None)

    def give_up(self, reason: str) -> int:
        """End every request still in flight as an error with ``reason`` (hung ones)."""
        for out, cut in self.in_flight.values():
            out.error = reason
            cut.set()
        return len(self.in_flight)

    def cuttable(self) -> list[asyncio.Event]:
        """Requests in flight that a client cut would leave mid-way: streams that have
        tokens, and answers not streamed (the gateway cannot tell those are half done)."""
        return [cut for out, cut in self.in_flight.values() if out.tokens or not out.shape.stream]

    async def references(self, concurrency: int = 2) -> dict[str, Outcome]:
        """Every (prompt, endpoint) once, not streamed, before any load or fault."""
        shapes = [Shape(i, chat, False) for i in range(len(self.prompts)) for chat in (False, True)]
        sem = asyncio.Semaphore(concurrency)

        async def ref(shape: Shape) -> Outcome:
            async with sem:
                out = await self.one(shape)
                if out.status != "ok":  # one more try: a reference is needed for every key
                    out = await self.one(shape)
                return out

        outs = await asyncio.gather(*(ref(s) for s in shapes))
        return {o.shape.key: o for o in outs}

    async def ramp(self, levels: list[int], window_s: float, log: Any) -> tuple[float, list[dict[str, Any]],
                                                                                 list[Outcome]]:
        best, rows, outs = 0.0, [], []
        for level in levels:
            t0 = time.time()
            end = t0 + window_s
            done: list[Outcome] = []

            async def worker(end: float, done: list[Outcome]) -> None:
                while time.time() < end:
                    done.append(await self.one(self.next_shape(stream=True)))

            await asyncio.gather(*(worker(end, done) for _ in range(level)))
            start = t0 + WARMUP_FRACTION * window_s
            tokens = sum(start <= t <= end for o in done for t in o.token_times)
            rps = tokens / (end - start) / self.max_tokens
            row = {"concurrency": level, "tokens_in_window": tokens, "requests_per_s": round(rps, 4),
                   "num_requests": len(done), "errors": sum(o.status == "error" for o in done),
                   "seconds": round(time.time() - t0, 1)}
            rows.append(row)
            outs += done
            log(f"ramp: concurrency {level}: {rps:.3f} req/s ({tokens} tokens in {end - start:.0f} s)")
            row["saturated"] = rps < 1.1 * best
            if row["saturated"]:
                break
            best = max(best, rps)
        return max(best, max(r["requests_per_s"] for r in rows)), rows, outs

    async def open_loop(self, rate_rps: float, duration_s: float, max_in_flight: int,
                        is_idle: Any = None, idle_s: float = 30.0) -> tuple[list[Outcome], int]:
        """Poisson arrivals for ``duration_s``; arrivals beyond ``max_in_flight`` are not
        sent (counted). Returns when every sent request has ended; once arrivals stop,
        requests still open while ``is_idle()`` (the cluster holds no request) has been
        true for ``idle_s`` are hung: they are ended as errors saying so."""
        tasks: list[asyncio.Task[Outcome]] = []
        skipped = 0
        t_end = time.monotonic() + duration_s
        max_requests = int(rate_rps * duration_s * 3) + 10
        while len(tasks) + skipped < max_requests:
            await asyncio.sleep(self.rng.expovariate(rate_rps))
            if time.monotonic() >= t_end:
                break
            shape = self.next_shape()
            if len(self.in_flight) >= max_in_flight:
                skipped += 1
                continue
            tasks.append(asyncio.create_task(self.one(shape)))
        idle_since = None
        while is_idle is not None and not all(t.done() for t in tasks):
            await asyncio.sleep(5.0)
            if not await is_idle():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= idle_s:
                self.give_up(f"hung: no answer while the cluster held no request for {idle_s:.0f} s")
                break
        return list(await asyncio.gather(*tasks)), skipped
