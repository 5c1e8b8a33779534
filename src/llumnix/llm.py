"""Offline entry point: one engine with a real model, for `llumnix generate`,
benchmarks, and the instance actors of the serving cluster."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llumnix.core.batch import PromptLogprob, RequestMetrics
from llumnix.core.clock import Clock
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Priority
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.stop import find_stop, stop_floor
from llumnix.engine import EngineCore

if TYPE_CHECKING:
    from llumnix.model.config import LlamaConfig
    from llumnix.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int
    metrics: RequestMetrics | None
    logprobs: list[float] | None = None
    """Per output token, its logprob (``SamplingParams.logprobs`` set)."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per output token, the ``logprobs`` most likely tokens with theirs (``logprobs`` > 0)."""
    prompt_logprobs: list[PromptLogprob] | None = None
    """Per prompt token after the first, (token, logprob, alternatives) (``prompt_logprobs`` set)."""


def finish_text(tokenizer: Tokenizer, token_ids: list[int], params: SamplingParams) -> str:
    """The completion text: decoded, cut before the first stop string (one that ends
    in the text of the ``min_tokens``-th token or later, as the engine rules)."""
    text = tokenizer.decode(token_ids)
    hit = find_stop(text, params.stop, stop_floor(tokenizer, token_ids, params.min_tokens - 1)) if params.stop else None
    return text if hit is None else text[:hit[0]]


CUDA_CONTEXT_BYTES = 512 * 2**20
"""What a process's CUDA context takes outside torch's allocator (an estimate)."""
GRAPH_RESERVE_BYTES = 256 * 2**20
"""Room kept for the decode steps' CUDA graphs (recorded after the KV cache)."""


def activation_bytes(mcfg: LlamaConfig, max_num_batched_tokens: int, max_num_seqs: int, dtype: str,
                     graphs: bool) -> int:
    """An estimate of what one step's activations take beside the weights and the KV
    cache: per token the residual stream, QKV and the MLP's gate/up/down; per sequence
    the logits (float32, with the sampler's copies); plus the CUDA graphs' reserve."""
    elem = 4 if dtype == "float32" else 2
    per_token = (6 * mcfg.hidden_size + 3 * mcfg.intermediate_size) * elem
    per_seq = 3 * mcfg.vocab_size * 4
    return max_num_batched_tokens * per_token + max_num_seqs * per_seq + (GRAPH_RESERVE_BYTES if graphs else 0)


def kv_bytes_for_utilization(device: str, utilization: float, reserve_bytes: int) -> int:
    """vLLM's ``--gpu-memory-utilization``: of the device's memory, the share this instance
    may use, less what it already holds (weights, CUDA context) and ``reserve_bytes``
    (activations, graphs); never more than is free now (other processes' memory)."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    held = torch.cuda.memory_reserved(torch.device(device)) + CUDA_CONTEXT_BYTES
    budget = min(int(total * utilization) - held, free) - reserve_bytes
    if budget <= 0:
        raise InvalidRequestError(
            f"gpu_memory_utilization {utilization:g} leaves no room for a KV cache: of the "
            f"{total * utilization / 2**30:.1f} GiB it allows, the weights and CUDA context take "
            f"{held / 2**30:.1f} GiB and activations {reserve_bytes / 2**30:.1f} GiB "
            f"({free / 2**30:.1f} GiB free on {device})", "gpu_memory_utilization")
    return budget


class LLM:
    def __init__(self, model: str = "smollm2", *, device: str = "cpu", dtype: str = "float32",
                 kv_cache_bytes: int = 512 * 2**20, num_blocks: int | None = None,
                 block_size: int = 16, max_num_seqs: int = SchedulerConfig.max_num_seqs,
                 max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens,
                 max_model_len: int | None = None, instance_id: str = "instance-0",
                 clock: Clock | None = None, seed: int = 0, enable_prefix_caching: bool = False,
                 chunked_prefill: bool = False, cuda_graphs: bool | None = None,
                 gpu_memory_utilization: float | None = None, weight_format: str = "fp32",
                 pace: dict[str, Any] | None = None) -> None:
        """``weight_format``: fp32 (the weights as loaded, exact), or bf16, int8, int4, auto
        packed for the CPU weight-only kernels, or w8a8 (int8 activations too) (``llumnix.model.quant``).
        ``cuda_graphs``: replay decode steps from CUDA graphs (None: on a CUDA device).
        ``gpu_memory_utilization`` (CUDA only; vLLM's): size the KV cache from the device's
        memory instead of ``kv_cache_bytes`` (``kv_bytes_for_utilization``).
        ``pace`` ({model, scale}: ``config.sections.PaceConfig``): hold every step to that
        latency model's time (``engine/pace.py``; evaluation only)."""
        from llumnix.model import ModelExecutor, load_model, num_blocks_for_bytes
        from llumnix.model.cuda_graphs import GraphShapes

        on_cuda = str(device).startswith("cuda")
        if cuda_graphs and not on_cuda:
            raise InvalidRequestError(f"CUDA graphs need a CUDA device, not {device!r}", "cuda_graphs")
        self.loaded = load_model(model, device=device, dtype=dtype, weight_format=weight_format)
        self.tokenizer = self.loaded.tokenizer
        mcfg = self.loaded.config
        use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        if num_blocks is None:
            if gpu_memory_utilization is not None and on_cuda:
                reserve = activation_bytes(mcfg, max_num_batched_tokens, max_num_seqs, dtype, use_graphs)
                kv_cache_bytes = kv_bytes_for_utilization(device, gpu_memory_utilization, reserve)
            num_blocks = num_blocks_for_bytes(mcfg, block_size, dtype, kv_cache_bytes)
        self.config = EngineConfig(
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                              enable_prefix_caching=enable_prefix_caching),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      chunked_prefill=chunked_prefill),
            max_model_len=max_model_len or mcfg.max_position_embeddings,
        )
        shapes = GraphShapes(max_batch=max_num_seqs, max_len=self.config.max_model_len) if use_graphs else None
        self.executor = ModelExecutor(self.loaded.model, num_blocks, block_size, device=device,
                                      dtype=dtype, graphs=shapes)
        pacer = None
        if pace is not None:
            from llumnix.engine.pace import StepPacer, pace_model

            pacer = StepPacer(pace_model(pace["model"], pace.get("scale", 1.0)))
        self.engine = EngineCore(self.config, self.executor, num_blocks, clock=clock,
                                 instance_id=instance_id, eos_token_id=self.tokenizer.eos_token_id,
                                 detokenizer=self.tokenizer, seed=seed, pacer=pacer)
        self._ids = itertools.count()

    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        if chat:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(prompt)

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams, *,
                 chat: bool = False, priority: int = Priority.NORMAL) -> list[Completion]:
        """Run prompts to completion in one continuous batch; results in input order."""
        order: list[str] = []
        prompt_lens: dict[str, int] = {}
        vocab = self.loaded.config.vocab_size
        if any(t >= vocab for t, _ in params.logit_bias):
            raise InvalidRequestError(f"logit_bias keys must be token ids below {vocab}", "logit_bias")
        for p in prompts:
            ids = p if isinstance(p, list) else self.encode_prompt(p, chat=chat)
            if any(not 0 <= t < vocab for t in ids):
                raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, ids, params, priority=priority)
            order.append(rid)
            prompt_lens[rid] = len(ids)
        tokens: dict[str, list[int]] = {rid: [] for rid in order}
        lps: dict[str, list[float]] = {rid: [] for rid in order}
        tops: dict[str, list[list[tuple[int, float]]]] = {rid: [] for rid in order}
        prompt_lps: dict[str, list[PromptLogprob]] = {}
        done: dict[str, tuple[str, RequestMetrics | None]] = {}
        while len(done) < len(order):
            for out in self.engine.step():
                rid = out.request_id
                tokens[rid] += out.new_token_ids
                lps[rid] += out.new_logprobs or ()
                tops[rid] += out.new_top_logprobs or ()
                if out.prompt_logprobs is not None:
                    prompt_lps[rid] = out.prompt_logprobs
                if out.finish_reason is not None:
                    done[rid] = (out.finish_reason, out.metrics)
        want_lp, want_top = params.logprobs is not None, bool(params.logprobs)
        return [Completion(rid, finish_text(self.tokenizer, tokens[rid], params), tokens[rid],
                           done[rid][0], prompt_lens[rid], done[rid][1],
                           lps[rid] if want_lp else None, tops[rid] if want_top else None,
                           prompt_lps.get(rid)) for rid in order]
