"""The cluster both sides run and the seeded trace they serve."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llumnix.bench.profile import synthetic_prompt
from llumnix.sim.workloads import Trace


@dataclass(frozen=True)
class Load:
    name: str
    rate: float
    """Requests per second (Poisson)."""
    num_requests: int


@dataclass(frozen=True)
class FidelitySetup:
    """The cluster both sides run and the trace they serve."""

    model: str = "smollm2"
    num_instances: int = 2
    num_blocks: int = 48
    """KV blocks per instance: small, so the heavy load fills them (migrations, preemptions)."""
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    watermark: float = 0.01
    status_interval_s: float = 0.05
    """The instances' periodic status push (cluster/instance.py)."""
    reschedule_interval_s: float = 0.5
    """LlumSched's migration rounds."""
    migrate_out_threshold: float = 3.0
    threads_per_instance: int = 1
    prompt_tokens: tuple[int, int] = (16, 96)
    """Prompt lengths, uniform in [lo, hi]."""
    output_tokens: tuple[int, int] = (8, 48)
    """Output lengths, uniform in [lo, hi] (EOS ignored)."""
    seed: int = 0
    loads: tuple[Load, ...] = (Load("light", 0.25, 30), Load("medium", 0.5, 50), Load("heavy", 0.65, 65),
                               Load("saturated", 1.8, 90))
    """Fixed rates. light/medium/heavy were sized on a loaded machine (heavy then ran at
    ~90% utilisation); on a quiet one heavy neither migrates nor preempts, and
    ``saturated`` (about 90% of a quiet machine's capacity for this trace) is the
    near-saturation point."""
    systems: tuple[str, ...] = ("infaas++", "llumnix")

    def scheduling(self, system: str) -> dict[str, Any]:
        """The SchedulingConfig dict of a system, the same on both sides."""
        return {"dispatch": {"policy": system},
                "rescheduling": {"enabled": system == "llumnix", "out_threshold": self.migrate_out_threshold,
                                 "in_threshold": self.migrate_out_threshold}}


# -- the trace ----------------------------------------------------------------------------
def make_trace(setup: FidelitySetup, load: Load) -> Trace:
    rng = np.random.default_rng([setup.seed, int(load.rate * 1000), load.num_requests])
    gaps = rng.exponential(1.0 / load.rate, load.num_requests)
    gaps[0] = 0.5
    prompts = rng.integers(setup.prompt_tokens[0], setup.prompt_tokens[1] + 1, load.num_requests)
    outputs = rng.integers(setup.output_tokens[0], setup.output_tokens[1] + 1, load.num_requests)
    return Trace(load.name, load.rate, setup.seed, np.cumsum(gaps), prompts, outputs,
                 np.zeros(load.num_requests, dtype=np.int64))


def prompt_ids(i: int, n: int, vocab: int) -> list[int]:
    """Prompt ``i`` of ``n`` token ids: ordinary vocabulary, no two alike."""
    return synthetic_prompt(n, i + 1, vocab)

