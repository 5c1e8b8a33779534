"""Live migration of a request whose prompt prefix the destination already caches.

Two SmolLM2 engines with prefix caching (sharing the weights) step in their own
threads and migrate over tcp, as `llumnix serve`'s instances do. Each trial migrates a
request of a fresh ``prefix + 32 own tokens`` prompt while it decodes:

* ``cached``: the destination served a request with the same prefix just before (its
  blocks are cached there, evictable), so the migration adopts them by their keys and
  sends the rest;
* ``cold``: the destination has never seen the prefix, so every block travels.

The two alternate per trial (these machines are noisy). Reported per prefix length:
the blocks and bytes sent, the migration's duration (start to commit) and its
downtime. Writes benchmarks/results/migration_prefix.json.

    .venv/bin/python benchmarks/migration_prefix.py [--lengths 512,1024,2048] [--repeats 3]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import Any

from llumnix.bench.machine import machine_info, write_result
from llumnix.core.sampling_params import SamplingParams
from llumnix.llm import LLM

TOKEN = b"migration-prefix"
OWN_TOKENS = 32


def _tokens(n: int, salt: int, vocab: int) -> list[int]:
    return [100 + (i * 7919 + salt * 104729) % (vocab - 200) for i in range(n)]


def _wait(srv: Any, rid: str, n: int, timeout: float = 600.0) -> None:
    """Until ``rid`` has ``n`` output tokens on ``srv`` (or is gone, if ``n`` is 0)."""
    deadline = time.time() + timeout
    while True:
        req = srv.call(lambda: srv.engine.requests.get(rid))
        if (req is None and n == 0) or (req is not None and n and len(req.output_token_ids) >= n):
            return
        if time.time() > deadline:
            raise TimeoutError(f"{rid} on {srv.instance_id}")
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", default="512,1024,2048", help="prefix lengths in tokens")
    ap.add_argument("--repeats", type=int, default=3, help="trials per length and mode")
    ap.add_argument("--out", default="benchmarks/results/migration_prefix.json")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    from llumnix.bench.profile import sibling_servers
    from llumnix.migration import MigrationConfig
    from llumnix.migration.destination import DestinationEndpoint
    from llumnix.migration.driver import migrate
    from llumnix.migration.tcp_transport import KVSender

    llm = LLM(args.model, enable_prefix_caching=True)
    vocab = llm.loaded.config.vocab_size
    servers = sibling_servers(llm, ("src", "dst"))
    src, dst = servers
    endpoint = DestinationEndpoint(dst, TOKEN, reservation_timeout_s=60.0)
    sender = KVSender(endpoint.address, TOKEN)
    decode = SamplingParams(max_tokens=400, ignore_eos=True)  # outlives the migration
    rows: list[dict[str, Any]] = []
    k = 0
    try:
        for n in lengths:
            for rep in range(args.repeats):
                for mode in ("cached", "cold") if rep % 2 == 0 else ("cold", "cached"):
                    k += 1
                    prefix = _tokens(n, k, vocab)
                    if mode == "cached":  # the destination serves the prefix first
                        warm = prefix + _tokens(OWN_TOKENS, 10_000 + k, vocab)
                        dst.call(functools.partial(dst.engine.add_request, f"warm-{k}", warm,
                                                   SamplingParams(max_tokens=1)))
                        _wait(dst, f"warm-{k}", 0)
                    rid = f"mig-{k}"
                    src.call(functools.partial(src.engine.add_request, rid, prefix + _tokens(OWN_TOKENS, k, vocab),
                                               decode))
                    _wait(src, rid, 2)
                    r = migrate(rid, src, endpoint, sender, MigrationConfig())
                    rows.append({"prefix_tokens": n, "mode": mode, "committed": r.committed,
                                 "abort_reason": r.abort_reason, "num_blocks_sent": r.num_blocks,
                                 "num_blocks_adopted": r.num_blocks_cached, "num_bytes": r.num_bytes,
                                 "duration_s": r.duration, "downtime_s": r.downtime, "num_stages": r.num_stages})
                    print(json.dumps(rows[-1]))
                    for srv in servers:
                        srv.call(functools.partial(srv.engine.abort_request, rid))
                        srv.call(srv.engine.check_invariants)
    finally:
        sender.close()
        endpoint.close()
        for srv in servers:
            srv.stop()

    summary = []
    for n in lengths:
        for mode in ("cold", "cached"):
            ok = [r for r in rows if r["prefix_tokens"] == n and r["mode"] == mode and r["committed"]]
            if not ok:
                continue
            summary.append({"prefix_tokens": n, "mode": mode, "trials": len(ok),
                            "blocks_sent": statistics.median(r["num_blocks_sent"] for r in ok),
                            "blocks_adopted": statistics.median(r["num_blocks_adopted"] for r in ok),
                            "mib_sent": statistics.median(r["num_bytes"] for r in ok) / 2**20,
                            "duration_ms": 1e3 * statistics.median(r["duration_s"] for r in ok),
                            "downtime_ms": 1e3 * statistics.median(r["downtime_s"] for r in ok)})
    print("\n| prefix tokens | destination | trials | blocks sent | adopted | MiB sent | duration (ms) | downtime (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['prefix_tokens']} | {s['mode']} | {s['trials']} | {s['blocks_sent']:.0f} | "
              f"{s['blocks_adopted']:.0f} | {s['mib_sent']:.1f} | {s['duration_ms']:.0f} | {s['downtime_ms']:.1f} |")
    out = {"benchmark": "migration_prefix", "model": args.model, "machine": machine_info(),
           "settings": {"lengths": lengths, "repeats": args.repeats, "own_tokens": OWN_TOKENS,
                        "block_size": llm.executor.block_size, "bytes_per_block": llm.executor.bytes_per_block,
                        "transport": "tcp", "migration": "3 stages (default MigrationConfig)"},
           "summary": summary, "trials": rows}
    write_result(args.out, out)


if __name__ == "__main__":
    main()
