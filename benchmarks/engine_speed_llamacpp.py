"""llama.cpp's side of ``engine_speed.py`` (issue 48), run by that script in its own
process under the Python that has ``llama-cpp-python`` (``--llama-python``; built once with
``CMAKE_ARGS=-DGGML_NATIVE=OFF``, never in CI), so llama.cpp's threads and torch's never
share a process. It drives llama.cpp's batched ``llama_decode`` directly: B sequences
decoding one token each per call, what llama.cpp's server does with B parallel slots
(llama-cpp-python's own server runs one request at a time, so it cannot show batching).

    speed   {"model", "threads", "batches", "steps", "context", "prefill"} -> decode
            tokens/s per batch size (greedy, the argmax read per sequence each step)
            and prefill tokens/s of one ``prefill``-token prompt
    greedy  {"model", "threads", "prompts": [[ids]], "tokens"} -> each prompt's first
            ``tokens`` greedy tokens (EOS not special: the quality test's ignore_eos)

Reads one JSON object on stdin, writes one on stdout. Needs only numpy and llama_cpp.
"""
from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any

import llama_cpp as lc
import numpy as np


class Runner:
    def __init__(self, model_path: str, threads: int, n_seq: int, n_ctx_per_seq: int) -> None:
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(model_path.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp cannot load {model_path}")
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_seq * n_ctx_per_seq
        cp.n_batch = cp.n_ubatch = max(512, n_seq)
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp cannot make a context")
        self.vocab = lc.llama_n_vocab(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(cp.n_batch, 0, n_seq)

    def clear(self) -> None:
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """``entries``: (token, position, sequence, wants logits)."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        if lc.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")

    def argmax(self, i: int) -> int:
        ptr = lc.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                         shape=(self.vocab,)).argmax())

    def prefill(self, seqs: list[list[int]]) -> list[int]:
        """Each sequence's prompt, 512 tokens a call; the next greedy token of each."""
        nxt = []
        for s, ids in enumerate(seqs):
            for a in range(0, len(ids), 512):
                chunk = ids[a:a + 512]
                self.decode([(t, a + j, s, a + j == len(ids) - 1) for j, t in enumerate(chunk)])
            nxt.append(self.argmax(len(ids) - 1 - (len(ids) - 1) // 512 * 512))
        return nxt

    def steps(self, nxt: list[int], start: list[int], n: int) -> list[list[int]]:
        """``n`` decode steps of every sequence at once; the tokens each produced."""
        out: list[list[int]] = [[] for _ in nxt]
        for k in range(n):
            self.decode([(t, start[s] + k, s, True) for s, t in enumerate(nxt)])
            nxt = [self.argmax(s) for s in range(len(nxt))]
            for s, t in enumerate(nxt):
                out[s].append(t)
        return out


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [100 + (i * 7919 + salt * 104729) % 40000 for i in range(n)]  # as llumnix.bench.engine_bench


def speed(a: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for batch in a["batches"]:
        r = Runner(a["model"], a["threads"], batch, a["context"] + a["steps"] + 8)
        prompts = [_prompt(a["context"], i) for i in range(batch)]
        nxt = r.prefill(prompts)
        t0 = time.perf_counter()
        r.steps(nxt, [a["context"]] * batch, a["steps"])
        out[f"decode_b{batch}"] = batch * a["steps"] / (time.perf_counter() - t0)
    r = Runner(a["model"], a["threads"], 1, a["prefill"] + 8)
    r.prefill([_prompt(8, 99)])  # warm-up
    r.clear()
    t0 = time.perf_counter()
    r.prefill([_prompt(a["prefill"], 7)])
    out[f"prefill_{a['prefill']}"] = a["prefill"] / (time.perf_counter() - t0)
    return out


def greedy(a: dict[str, Any]) -> dict[str, Any]:
    longest = max(len(p) for p in a["prompts"])
    r = Runner(a["model"], a["threads"], 1, longest + a["tokens"] + 8)
    tokens = []
    for ids in a["prompts"]:
        r.clear()
        first = r.prefill([ids])
        tokens.append(first + r.steps(first, [len(ids)], a["tokens"] - 1)[0])
    return {"tokens": tokens}


_QUIET = lc.llama_log_callback(lambda *_: None)  # kept: llama.cpp calls it after llama_log_set returns


def main() -> None:
    lc.llama_log_set(_QUIET, ctypes.c_void_p())
    a = json.load(sys.stdin)
    json.dump({"speed": speed, "greedy": greedy}[a["mode"]](a), sys.stdout)


if __name__ == "__main__":
    main()
