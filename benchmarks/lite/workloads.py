"""Seeded traces for the lite-mode benchmark and the client that replays them.

``chats``: multi-turn conversations that share a system prompt; turn t's prompt is the
system prompt plus the conversation so far (fixed assistant replies, so a trace does not
depend on what a run generated). ``sharegpt``: independent prompts and output lengths
with ShareGPT-like long tails (log-normal, capped for a small model's context).
Arrivals are Poisson at the given rate. Every request streams; TTFT is the first chunk
with text, e2e the end of the stream; a request fails on a non-200, an error event or a
stream without ``[DONE]``."""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp

_WORDS = ["river", "stone", "light", "paper", "garden", "window", "music", "number", "market", "winter", "table", "story", "city", "forest", "engine", "signal", "bridge", "cloud", "letter", "planet", "doctor", "station", "field", "colour", "ocean"]


@dataclass(frozen=True)
class Req:
    prompt: str
    max_tokens: int
    arrival_s: float


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def chats(seed: int, rate: float, n: int, convs: int = 6) -> list[Req]:
    rng = random.Random(seed)
    system = "You are a patient assistant who answers briefly. " + _text(rng, 110)
    history = [f"{system}\nUser: {_text(rng, 30)}\nAssistant:" for _ in range(convs)]
    prompts = []
    for i in range(n):
        c = i % convs
        prompts.append(history[c])
        history[c] += f" {_text(rng, 12)}\nUser: {_text(rng, 15)}\nAssistant:"
    return _arrivals(rng, rate, [(p, 16) for p in prompts])


def sharegpt(seed: int, rate: float, n: int) -> list[Req]:
    rng = random.Random(seed)
    items = [(_text(rng, min(500, max(8, int(rng.lognormvariate(4.3, 0.8))))),
              min(64, max(4, int(rng.lognormvariate(3.0, 0.7))))) for _ in range(n)]
    return _arrivals(rng, rate, items)


def _arrivals(rng: random.Random, rate: float, items: list[tuple[str, int]]) -> list[Req]:
    t, out = 0.0, []
    for prompt, max_tokens in items:
        out.append(Req(prompt, max_tokens, t))
        t += rng.expovariate(rate) if rate > 0 else 0.0
    return out


@dataclass
class Result:
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str = ""


async def one(session: aiohttp.ClientSession, url: str, req: Req) -> Result:
    body = {"model": "smollm2", "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0,
            "stream": True}
    t0 = time.perf_counter()
    ttft = None
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                return Result(False, error=f"HTTP {resp.status}")
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return Result(True, ttft if ttft is not None else time.perf_counter() - t0,
                                  time.perf_counter() - t0)
                obj = json.loads(data)
                if "error" in obj:
                    return Result(False, error=str(obj["error"])[:120])
                if ttft is None and any(c.get("text") for c in obj.get("choices", ())):
                    ttft = time.perf_counter() - t0
        return Result(False, error="no [DONE]")
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        return Result(False, error=f"{type(e).__name__}: {e}"[:120])


async def replay(url: str, trace: list[Req], timeout_s: float = 300.0, start: float | None = None) -> list[Result]:
    """Send each request at its arrival time (after ``start``, a perf_counter time; default
    now); wait for all."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter() if start is None else start

        async def at(req: Req) -> Result:
            await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
            return await one(session, url, req)

        return list(await asyncio.gather(*(at(r) for r in trace)))
