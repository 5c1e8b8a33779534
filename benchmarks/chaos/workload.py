"""What the soak sends and how it judges an answer: a fixed seeded prompt list, greedy
request bodies (ignore_eos, fixed max_tokens, token ids in the logprobs), one request
over HTTP with a client-side cut, and the token-for-token comparison with a reference."""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

SUBJECTS = ("the Roman empire", "photosynthesis", "a lighthouse keeper", "the stock market", "volcanoes",
            "a chess grandmaster", "the printing press", "coral reefs", "a small bakery", "black holes",
            "the Silk Road", "honey bees", "a night train", "quantum computers", "the Amazon river",
            "an old violin", "glaciers", "a city library", "the first airplanes", "desert foxes")
FORMS = ("Write a short story about {s}.", "Explain to a child how {s} works.",
         "List five surprising facts about {s}, with one sentence each.",
         "Describe {s} as a travel guide would, in detail.", "What would a historian say about {s}?",
         "Compose a letter to a friend about {s} and why it matters.")
NEAR_TIE_NATS = 0.05
"""A divergence where the reference's top two tokens were closer than this (natural-log
probability) is counted as numerics (batch shape changes the float sums), not as a fault."""


def build_prompts(seed: int, n: int) -> list[str]:
    """``n`` distinct prompts, the same for the same seed; some share a long prefix so the
    prefix cache (and its migration) is exercised."""
    rng = random.Random(seed)
    prompts: list[str] = []
    while len(prompts) < n:
        s, f = rng.choice(SUBJECTS), rng.choice(FORMS)
        p = f.format(s=s)
        if rng.random() < 0.3:
            p = ("You are a careful assistant who answers in plain English, without lists unless asked, and "
                 "who keeps every answer under two hundred words. " + p)
        if p not in prompts:
            prompts.append(p)
    return prompts


@dataclass(frozen=True)
class Shape:
    prompt_index: int
    chat: bool
    stream: bool

    @property
    def key(self) -> str:
        """Stream and non-stream answers of one prompt share a reference."""
        return f"{'chat' if self.chat else 'cmpl'}:{self.prompt_index}"


def request_body(model: str, prompt: str, shape: Shape, max_tokens: int) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                            "return_tokens_as_token_ids": True, "stream": shape.stream}
    if shape.stream:
        body["stream_options"] = {"include_usage": True}
    if shape.chat:
        body.update(messages=[{"role": "user", "content": prompt}], logprobs=True, top_logprobs=2)
        return "/v1/chat/completions", body
    body.update(prompt=prompt, logprobs=2)
    return "/v1/completions", body


@dataclass
class Outcome:
    shape: Shape
    sent_s: float
    end_s: float = 0.0
    status: str = "pending"
    """ok | error | cut (the client closed it: not compared)."""
    tokens: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    """Per token: top-1 minus top-2 logprob (what a near tie is judged by)."""
    seconds: list[int] = field(default_factory=list)
    """Per token: the second's id of the top two (the likely token under other numerics)."""
    token_times: list[float] = field(default_factory=list)
    """Per token: when the client read it (a streamed answer's tokens come one by one)."""
    text: str = ""
    finish_reason: str | None = None
    num_usage_tokens: int | None = None
    error: str | None = None
    response_id: str | None = None


def _tid(name: str) -> int:
    return int(name.rsplit(":", 1)[1])


def _take_logprobs(out: Outcome, lp: dict[str, Any] | None, chat: bool) -> None:
    if not lp:
        return
    if chat:
        for e in lp.get("content") or ():
            top = sorted(((a["logprob"], _tid(a["token"])) for a in e.get("top_logprobs") or ()), reverse=True)
            _append(out, _tid(e["token"]), top)
    else:
        for name, top_d in zip(lp["tokens"], lp.get("top_logprobs") or [None] * len(lp["tokens"]), strict=True):
            top = sorted(((v, _tid(k)) for k, v in (top_d or {}).items()), reverse=True)
            _append(out, _tid(name), top)


def _append(out: Outcome, token: int, top: list[tuple[float, int]]) -> None:
    out.tokens.append(token)
    out.token_times.append(time.time())
    if len(top) >= 2:
        out.margins.append(top[0][0] - top[1][0])
        out.seconds.append(top[1][1] if top[0][1] == token else top[0][1])
    else:
        out.margins.append(float("inf"))
        out.seconds.append(-1)


def _take_choice(out: Outcome, choice: dict[str, Any], chat: bool) -> None:
    if chat:
        piece = (choice.get("delta") or choice.get("message") or {}).get("content") or ""
    else:
        piece = choice.get("text") or ""
    out.text += piece
    _take_logprobs(out, choice.get("logprobs"), chat)
    if choice.get("finish_reason"):
        out.finish_reason = choice["finish_reason"]


async def _exchange(client: Any, url: str, path: str, body: dict[str, Any], out: Outcome) -> None:
    chat = out.shape.chat
    if not body["stream"]:
        r = await client.post(url + path, json=body)
        data = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
        if r.status_code != 200 or data is None or "choices" not in data:
            out.status, out.error = "error", f"HTTP {r.status_code}: {_message(data, r.text)}"
            return
        out.response_id = data.get("id")
        _take_choice(out, data["choices"][0], chat)
        out.num_usage_tokens = (data.get("usage") or {}).get("completion_tokens")
        out.status = "ok"
        return
    async with client.stream("POST", url + path, json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            out.status, out.error = "error", f"HTTP {r.status_code}: {_message(None, text)}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.status = "error" if out.error else "ok"
                return
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.error = f"stream error event: {_message(chunk, '')}"
                continue
            out.response_id = out.response_id or chunk.get("id")
            if chunk.get("usage"):
                out.num_usage_tokens = chunk["usage"].get("completion_tokens")
            for choice in chunk.get("choices") or ():
                _take_choice(out, choice, chat)
        out.status, out.error = "error", out.error or "stream ended without [DONE]"


def _message(data: Any, text: str) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message"))[:300]
    return text[:300]


async def send(client: Any, url: str, path: str, body: dict[str, Any], out: Outcome, timeout_s: float,
               cut: asyncio.Event | None = None) -> Outcome:
    """One request, filling ``out`` as the answer comes; when ``cut`` is set first the
    client drops the connection (status cut)."""
    out.sent_s = time.time()
    work = asyncio.ensure_future(_exchange(client, url, path, body, out))
    waits: set[asyncio.Future[Any]] = {work}
    cutter = asyncio.ensure_future(cut.wait()) if cut is not None else None
    if cutter is not None:
        waits.add(cutter)
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            exc = work.exception()
            if exc is not None:
                out.status, out.error = "error", f"client: {type(exc).__name__}: {exc}"[:300]
        elif cutter is not None and cutter in done:
            work.cancel()  # closes the connection: the gateway sees the client leave
            out.status = "error" if out.error else "cut"  # an error set first: the soak gave up on it
        else:
            work.cancel()
            out.status, out.error = "error", f"client timeout after {timeout_s:.0f} s"
    finally:
        if cutter is not None:
            cutter.cancel()
        if not work.done():
            work.cancel()
        await asyncio.gather(work, return_exceptions=True)
    out.end_s = time.time()
    return out


@dataclass(frozen=True)
class Verdict:
    kind: str
    """match | short | long | gap | repeat | near_tie | diverged | text (tokens equal, text not)."""
    index: int = -1
    """First differing token (or -1)."""
    detail: str = ""


def _aligned(got: list[int], ref: list[int], k: int, shift: int) -> bool:
    """got[k:] equals ref[k+shift:] over their overlap, and the overlap is not trivial."""
    a, b = got[k:], ref[k + shift:] if k + shift >= 0 else []
    n = min(len(a), len(b))
    return n >= min(4, len(a)) and n > 0 and a[:n] == b[:n]


def compare(out: Outcome, ref: Outcome, max_tokens: int) -> Verdict:
    got, want = out.tokens, ref.tokens
    if got == want:
        if len(got) != max_tokens:
            return Verdict("short" if len(got) < max_tokens else "long", len(got),
                           f"{len(got)} tokens, the reference too, asked {max_tokens}")
        if out.text != ref.text:
            return Verdict("text", -1, f"{out.text[:80]!r} vs {ref.text[:80]!r}")
        return Verdict("match")
    k = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    if k == len(got):
        return Verdict("short", k, f"{len(got)} of {len(want)} tokens")
    if k == len(want):
        return Verdict("long", k, f"{len(got)} tokens for {len(want)}")
    for d in range(1, 9):
        if _aligned(got, want, k, d):
            return Verdict("gap", k, f"{d} token(s) missing at {k}")
        if d <= k and _aligned(got, want, k, -d):
            return Verdict("repeat", k, f"{d} token(s) repeated at {k}")
    margin = ref.margins[k] if k < len(ref.margins) else float("inf")
    if margin < NEAR_TIE_NATS and got[k] == ref.seconds[k]:
        return Verdict("near_tie", k, f"reference margin {margin:.4f} nats; took its runner-up {got[k]}")
    return Verdict("diverged", k, f"token {got[k]} for {want[k]} (reference margin {margin:.3f} nats)")
