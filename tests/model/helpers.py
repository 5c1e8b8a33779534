from __future__ import annotations

from llumnix.core.clock import VirtualClock
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.engine import EngineCore
from llumnix.model import ModelExecutor
from llumnix.model.cuda_graphs import GraphShapes


def real_engine(loaded, num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 16,
                instance_id: str = "m0", prefix_caching: bool = False, chunk: int | None = None,
                graphs: bool | None = None) -> EngineCore:
    """``chunk``: chunked prefill with this token budget per step. ``graphs``: decode steps
    from CUDA graphs (None: on a CUDA model); False on a CUDA model, eager; True on a CPU
    model, the graphs' padded steps run eagerly."""
    config = EngineConfig(cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, watermark=0.0,
                                            enable_prefix_caching=prefix_caching),
                          scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=chunk or 512,
                                                    chunked_prefill=chunk is not None),
                          max_model_len=loaded.config.max_position_embeddings)
    on_cuda = loaded.model.device.type == "cuda"
    shapes = GraphShapes(max_batch=max_num_seqs, max_len=loaded.config.max_position_embeddings)
    use = on_cuda if graphs is None else graphs
    ex = ModelExecutor(loaded.model, num_blocks, block_size, graphs=shapes if use else None, record_graphs=on_cuda)
    return EngineCore(config, ex, num_blocks, clock=VirtualClock(), instance_id=instance_id,
                      eos_token_id=None)


def drain(engine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        engine.check_invariants()
    return out


def first_decode_logits(loaded, graphs: bool):
    """Logits of the first decode step of three requests (contexts 26, 10 and 15 tokens:
    a batch bucket of 4 rows and 8 blocks of 4), eager or through the graphs' bucket."""
    import torch

    from llumnix.core.sampling_params import SamplingParams

    eng = real_engine(loaded, num_blocks=96, graphs=graphs)
    for i, p in enumerate([[5] * 25, [6] * 9, [7] * 14]):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=4))
    eng.step()  # the prefill
    batch = eng.scheduler.schedule()
    assert [r.context_len for r in batch.scheduled] == [26, 10, 15]
    with torch.inference_mode():
        ex = eng.executor
        got = ex.graphs.try_forward(batch.scheduled) if graphs else ex.model.forward(ex._build(batch), ex.kv_cache)
        return got.clone()
