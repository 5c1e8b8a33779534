"""ModelExecutor: runs a scheduled batch through the model over its paged KV
cache, and moves KV blocks in and out for migration."""
from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from llumnix.core.batch import NO_TOKEN, ModelOutput, PromptLogprob, ScheduledRequest, SchedulerOutput
from llumnix.model.config import LlamaConfig
from llumnix.model.cuda_graphs import DecodeGraphs, GraphShapes
from llumnix.model.llama import AttnGroup, ForwardBatch, LlamaModel
from llumnix.model.sampler import sample, top_logprobs, top_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROMPT_LOGITS_ROWS = 256
"""Prompt positions whose vocabulary-wide logits are made at once (256 x 49,152 floats is
50 MB for SmolLM2; a 2k-token prompt at once would be 400 MB)."""


def wants_prompt_logprobs(r: ScheduledRequest) -> bool:
    """Prompt logprobs are computed at a request's first prefill only: a recompute after
    a preemption (outputs exist by then) has reported them already."""
    return r.sampling_params.prompt_logprobs is not None and r.start_pos == 0 and r.output_index == 0


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}") from None


def bytes_per_block(config: LlamaConfig, block_size: int, dtype: str | torch.dtype) -> int:
    elem = torch.tensor([], dtype=resolve_dtype(dtype)).element_size()
    return config.num_layers * 2 * block_size * config.kv_size * elem


def num_blocks_for_bytes(config: LlamaConfig, block_size: int, dtype: str | torch.dtype,
                         nbytes: int) -> int:
    return max(1, nbytes // bytes_per_block(config, block_size, dtype))


def _spread(reqs: list[ScheduledRequest], tokens: list[int], logprobs: list[float] | None,
            top: list[list[tuple[int, float]]] | None
            ) -> tuple[list[int], list[float] | None, list[list[tuple[int, float]]] | None]:
    """The sampling entries' results placed at their entries, ``NO_TOKEN`` (logprob 0, no
    alternatives) at the others."""
    it = iter(range(len(tokens)))
    where = [next(it) if r.sample else -1 for r in reqs]
    return ([tokens[j] if j >= 0 else NO_TOKEN for j in where],
            None if logprobs is None else [logprobs[j] if j >= 0 else 0.0 for j in where],
            None if top is None else [top[j] if j >= 0 else [] for j in where])


class ModelExecutor:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                 graphs: GraphShapes | None = None, record_graphs: bool = True) -> None:
        """``graphs``: replay decode steps of these shapes from CUDA graphs (``record_graphs``
        False runs the same padded steps eagerly, to test them without a GPU)."""
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        # The cache lives where the weights live, in their precision, unless told otherwise.
        self.device = model.device if device is None else torch.device(device)
        self.dtype = model.dtype if dtype is None else resolve_dtype(dtype)
        # One tensor for every layer's K and V: a block's KV across layers is
        # kv_cache[:, :, block], so migration moves a block list in one gather. Graphs
        # keep one scratch block beyond the pool for their padding rows.
        # Everything that reads or writes blocks by id works on the whole (contiguous)
        # storage; ``kv_cache`` is the pool's view, without the scratch block.
        self._storage = torch.zeros(cfg.num_layers, 2, num_blocks + (graphs is not None), block_size,
                                    cfg.num_kv_heads, cfg.head_dim, dtype=self.dtype, device=self.device)
        self.kv_cache = self._storage if graphs is None else self._storage[:, :, :num_blocks]
        self.graphs: DecodeGraphs | None = None
        if graphs is not None:
            if record_graphs and self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
            with torch.inference_mode():
                self.graphs = DecodeGraphs(model, self._storage, block_size, graphs, record=record_graphs)

    # -- Executor -------------------------------------------------------------
    def execute(self, batch: SchedulerOutput) -> ModelOutput:
        t0 = time.perf_counter()
        reqs = batch.scheduled
        with torch.inference_mode():
            scored = [i for i, r in enumerate(reqs) if wants_prompt_logprobs(r)]
            prompt_lps: list[list[PromptLogprob] | None] | None = None
            logits = None if self.graphs is None or scored else self.graphs.try_forward(reqs)
            if scored:
                spans = self._prompt_spans(reqs, scored)
                rows = torch.cat([torch.arange(a, b, device=self.device) for a, b in spans.values()])
                logits, hidden = self.model.forward_rows(self._build(batch), self._storage, rows)
                prompt_lps = self._prompt_logprobs(reqs, spans, hidden)
            elif logits is None:  # not a decode step that a graph covers
                logits = self.model.forward(self._build(batch), self._storage)
            # Logits exist for the entries that sample (a prefill chunk short of its
            # sequence's end samples nothing).
            samplers = reqs if len(logits) == len(reqs) else [r for r in reqs if r.sample]
            want_lp = any(r.sampling_params.logprobs is not None for r in samplers)
            tokens, logprobs = sample(logits, samplers, want_lp) if samplers else ([], None)
            num_top = max((r.sampling_params.logprobs or 0) for r in samplers) if want_lp else 0
            top = top_logprobs(logits, num_top) if num_top else None
            if samplers is not reqs:
                tokens, logprobs, top = _spread(reqs, tokens, logprobs, top)
        return ModelOutput(sampled_token_ids=tokens, logprobs=logprobs, top_logprobs=top,
                           elapsed=time.perf_counter() - t0, prompt_logprobs=prompt_lps)

    @staticmethod
    def _prompt_spans(reqs: list[ScheduledRequest], scored: list[int]) -> dict[int, tuple[int, int]]:
        """For each scored request, the rows of the flattened batch whose next token is a
        prompt token: its first token through its second-to-last."""
        starts, pos = [], 0
        for r in reqs:
            starts.append(pos)
            pos += len(r.token_ids)
        return {i: (starts[i], starts[i] + len(reqs[i].token_ids) - 1) for i in scored}

    def _prompt_logprobs(self, reqs: list[ScheduledRequest], spans: dict[int, tuple[int, int]],
                         hidden: torch.Tensor) -> list[list[PromptLogprob] | None]:
        """Logprob of each prompt token after the first, from the hidden states of the
        tokens before it; the vocabulary-wide logits are made PROMPT_LOGITS_ROWS at a time."""
        out: list[list[PromptLogprob] | None] = [None] * len(reqs)
        at = 0
        for i, (a, b) in spans.items():
            r = reqs[i]
            targets = torch.tensor(r.token_ids[1:], dtype=torch.long, device=self.device)
            k = r.sampling_params.prompt_logprobs or 0
            scored: list[PromptLogprob] = []
            for s in range(0, b - a, PROMPT_LOGITS_ROWS):
                e = min(b - a, s + PROMPT_LOGITS_ROWS)
                lp = self.model.logits(hidden[at + s:at + e]).float().log_softmax(-1)
                chosen = lp.gather(1, targets[s:e].unsqueeze(1)).squeeze(1).tolist()
                tops: list[list[tuple[int, float]]] | list[None] = top_of(lp, k) if k else [None] * (e - s)
                scored += zip(r.token_ids[1 + s:1 + e], chosen, tops, strict=True)
            out[i] = scored
            at += b - a
        return out

    def _build(self, batch: SchedulerOutput) -> ForwardBatch:
        reqs = batch.scheduled
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_idx: list[int] = []
        starts: list[int] = []
        for r in reqs:
            starts.append(len(ids))
            ids += r.token_ids
            table = r.block_ids
            for p in range(r.start_pos, r.context_len):
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            if r.sample:
                last_idx.append(len(ids) - 1)
        starts.append(len(ids))
        # Attention groups: runs of one-token entries (decodes) and of longer ones
        # (prefills, chunks), so a step that mixes them pads no decode to a chunk's length.
        groups: list[AttnGroup] = []
        a = 0
        for i in range(1, len(reqs) + 1):
            if i == len(reqs) or (len(reqs[i].token_ids) == 1) != (len(reqs[a].token_ids) == 1):
                groups.append(self._group(reqs[a:i], slice(starts[a], starts[i]), positions[starts[a]:starts[i]]))
                a = i
        return ForwardBatch(input_ids=self._t(ids), positions=self._t(positions), slot_mapping=self._t(slots),
                            last_idx=self._t(last_idx), groups=groups)

    def _t(self, x: Any) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=self.device)

    def _group(self, reqs: list[ScheduledRequest], rows: slice, positions: list[int]) -> AttnGroup:
        bs, dev, t = self.block_size, self.device, self._t
        q_lens = [len(r.token_ids) for r in reqs]
        ctx_lens = [r.context_len for r in reqs]
        fresh = len(reqs) == 1 and reqs[0].start_pos == 0
        b, q_len, max_ctx = len(reqs), max(q_lens), max(ctx_lens)
        n_blocks = -(-max_ctx // bs)
        tables = t([r.block_ids[:n_blocks] + [0] * (n_blocks - min(len(r.block_ids), n_blocks))
                    for r in reqs])
        mask = tok_b = tok_i = None
        if not fresh and (q_len > 1 or len(set(ctx_lens)) > 1):
            key_pos = torch.arange(max_ctx, device=dev)
            # Padded query rows get position 0 so they attend to one real key (no NaN rows).
            q_pos = torch.zeros(b, q_len, dtype=torch.long, device=dev)
            if q_len > 1:
                tok_b = t([i for i, n in enumerate(q_lens) for _ in range(n)])
                tok_i = t([j for n in q_lens for j in range(n)])
                q_pos[tok_b, tok_i] = t(positions)
            else:
                q_pos[:, 0] = t(ctx_lens) - 1
            mask = (key_pos.view(1, 1, -1) <= q_pos.unsqueeze(-1)) \
                & (key_pos.view(1, 1, -1) < t(ctx_lens).view(-1, 1, 1))
            mask = mask.unsqueeze(1)
        return AttnGroup(rows=rows, block_tables=tables, ctx_len=max_ctx, mask=mask, tok_b=tok_b, tok_i=tok_i,
                         q_len=q_len, fresh_causal=fresh)

    # -- KVBlockIO --------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        return self.kv_cache[:, :, 0].numel() * self.kv_cache.element_size()

    def gather_blocks_tensor(self, block_ids: list[int]) -> torch.Tensor:
        """The blocks fused into one contiguous tensor [layers, 2, n, block, kv_heads, head_dim]."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        return self._storage.index_select(2, idx)

    def scatter_blocks_tensor(self, block_ids: list[int], data: torch.Tensor) -> None:
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        self._storage.index_copy_(2, idx, data.to(self.device, self.dtype))

    def gather_blocks(self, block_ids: list[int]) -> memoryview:
        fused = self.gather_blocks_tensor(block_ids).cpu().contiguous()
        return fused.view(torch.uint8).numpy().data.cast("B")

    def scatter_blocks(self, block_ids: list[int], data: bytes | memoryview | bytearray) -> None:
        shape = list(self.kv_cache.shape)
        shape[2] = len(block_ids)
        expected = len(block_ids) * self.bytes_per_block
        if len(data) != expected:
            raise ValueError(f"KV buffer has {len(data)} bytes, {expected} expected")
        # A read-only buffer (Ray's object store) is only read here: no copy. Copying it
        # into a bytearray held the GIL for the whole payload, stalling the engine's loop.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the buffer is not writable
            raw = torch.frombuffer(data, dtype=torch.uint8)
        self.scatter_blocks_tensor(block_ids, raw.view(self.dtype).view(shape))
