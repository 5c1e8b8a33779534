"""Latency profiles measured on a real engine (`llumnix profile` writes them).

Schema ``llumnix-sim-profile/1`` (JSON; seconds, tokens, bytes)::

    {
      "schema": "llumnix-sim-profile/1",
      "model": "SmolLM2-135M-Instruct",        # free text, for the record
      "device": "cpu",                          # free text, for the record
      "block_size": 16,                         # tokens per KV block the profile was taken with
      "prefill": {                              # one prefill step, by tokens in the batch
        "num_tokens": [16, 64, 256, 1024],      # strictly increasing
        "latency_s":  [0.01, 0.02, 0.06, 0.25]
      },
      "decode": {                               # one decode step, on a grid
        "batch_sizes":    [1, 8, 32],           # strictly increasing
        "context_tokens": [0, 4096, 16384],     # total context tokens in the batch, increasing
        "latency_s": [[...], [...], [...]]      # latency_s[i][j]: batch_sizes[i], context_tokens[j]
      },
      "kv": {"bytes_per_block": 589824},
      "migration": {
        "bandwidth_bytes_per_s": 1.2e9,         # fused copy between instances
        "stage_overhead_s": 0.002,              # per stage: reservation round trip + launch
        "last_stage_overhead_s": 0.001,         # the last stage's, if different (optional)
        "commit_s": 0.004,                      # last stage: install + free (optional, default 0)
        "commit_per_block_s": 0.0,              # ... plus this per block of the request (optional)
        "blocking_bandwidth_bytes_per_s": null, # unfused copy of a one-stage migration (optional)
        "decode_slowdown": 1.02                 # decode factor while copying (optional, default 1)
      },
      "contention": {                           # optional: instances sharing a host (CPU)
        "neighbor_factor": {"prefill": 1.0, "decode": 1.18}   # step time x this while another
      }                                         # instance is mid-step (sim/latency.py)
    }

Between knots latency is linear (bilinear on the decode grid); past the last knot
it is extrapolated linearly along the last segment, never downward; below the first
it is the first value. A prefill batch of several sequences is looked up by its
total tokens.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llumnix.core.errors import LlumnixError
from llumnix.sim.latency import NO_CONTENTION, MigrationCost, NeighborContention, interp_clamped

SCHEMA = "llumnix-sim-profile/1"


class ProfileError(LlumnixError):
    """A profile file is missing or does not follow the schema."""


@dataclass(frozen=True)
class TableLatencyModel:
    prefill_tokens: tuple[float, ...]
    prefill_s: tuple[float, ...]
    decode_batch: tuple[float, ...]
    decode_context: tuple[float, ...]
    decode_s: tuple[tuple[float, ...], ...]
    migration: MigrationCost
    contention: NeighborContention = NO_CONTENTION
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0

    def prefill_time(self, seq_lens: Sequence[int]) -> float:
        return interp_clamped(self.prefill_tokens, self.prefill_s, sum(seq_lens))

    def decode_time(self, batch_size: int, num_context_tokens: int) -> float:
        rows = [interp_clamped(self.decode_context, row, num_context_tokens) for row in self.decode_s]
        return interp_clamped(self.decode_batch, rows, batch_size)


def _increasing(name: str, xs: Any) -> tuple[float, ...]:
    if not isinstance(xs, list) or not xs or not all(isinstance(x, int | float) for x in xs):
        raise ProfileError(f"profile field {name} must be a non-empty list of numbers")
    if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        raise ProfileError(f"profile field {name} must be strictly increasing")
    return tuple(float(x) for x in xs)


def _numbers(name: str, xs: Any, n: int) -> tuple[float, ...]:
    if not isinstance(xs, list) or len(xs) != n or not all(isinstance(x, int | float) and x >= 0 for x in xs):
        raise ProfileError(f"profile field {name} must be a list of {n} non-negative numbers")
    return tuple(float(x) for x in xs)


def profile_from_dict(d: dict[str, Any]) -> TableLatencyModel:
    if d.get("schema") != SCHEMA:
        raise ProfileError(f"profile schema must be {SCHEMA!r}, got {d.get('schema')!r}")
    try:
        pre, dec, kv, mig = d["prefill"], d["decode"], d["kv"], d["migration"]
        tokens = _increasing("prefill.num_tokens", pre["num_tokens"])
        prefill = _numbers("prefill.latency_s", pre["latency_s"], len(tokens))
        batch = _increasing("decode.batch_sizes", dec["batch_sizes"])
        ctx = _increasing("decode.context_tokens", dec["context_tokens"])
        grid = dec["latency_s"]
        if not isinstance(grid, list) or len(grid) != len(batch):
            raise ProfileError("profile field decode.latency_s must have one row per batch size")
        rows = tuple(_numbers(f"decode.latency_s[{i}]", r, len(ctx)) for i, r in enumerate(grid))
        bpb = int(kv["bytes_per_block"])
        knots = (0.0, 1e6)
        commit = float(mig.get("commit_s", 0.0))
        per_block = float(mig.get("commit_per_block_s", 0.0))
        cost = MigrationCost(
            bytes_per_block=bpb, bandwidth=float(mig["bandwidth_bytes_per_s"]),
            stage_overhead_s=float(mig.get("stage_overhead_s", 0.0)),
            last_stage_overhead_s=(None if mig.get("last_stage_overhead_s") is None
                                   else float(mig["last_stage_overhead_s"])),
            commit_knots_blocks=knots, commit_knots_s=(commit, commit + per_block * knots[1]),
            blocking_bandwidth=(None if mig.get("blocking_bandwidth_bytes_per_s") is None
                                else float(mig["blocking_bandwidth_bytes_per_s"])),
            decode_slowdown=float(mig.get("decode_slowdown", 1.0)),
        )
        nf = (d.get("contention") or {}).get("neighbor_factor") or {}
        contention = NeighborContention(prefill=float(nf.get("prefill", 1.0)), decode=float(nf.get("decode", 1.0)))
    except KeyError as e:
        raise ProfileError(f"profile is missing field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ProfileError(f"profile has a malformed value: {e}") from None
    if bpb <= 0 or cost.bandwidth <= 0:
        raise ProfileError("profile kv.bytes_per_block and migration.bandwidth_bytes_per_s must be > 0")
    if contention.prefill <= 0 or contention.decode <= 0:
        raise ProfileError("profile contention.neighbor_factor values must be > 0")
    return TableLatencyModel(tokens, prefill, batch, ctx, rows, cost, contention)


def load_profile(path: str | Path) -> TableLatencyModel:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"profile file {str(p)!r} not found")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"profile {str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ProfileError(f"profile {str(p)!r} must hold a JSON object")
    return profile_from_dict(d)
