"""Why do requests queue in a Figure 11 run: fragmentation or a full cluster?

The paper's Figure 5 method: sample every instance at regular times and, for each one
whose head-of-line queued request does not fit its free blocks (blocked), ask whether
that request would fit another instance as it is (fragmentation that dispatch or
migration could avoid), would fit only the sum of the cluster's free blocks (spread
too thin: de-fragmentation would have to move running requests), or not even that
(the cluster is full: no scheduler helps).

    .venv/bin/python benchmarks/sim/fragmentation.py                       # M-M and L-L top rates
    .venv/bin/python benchmarks/sim/fragmentation.py M-M:7.4 S-L:4.1      # chosen points

Runs INFaaS++ and Llumnix with `figure11.yaml`'s settings (its latency model, seed 0),
samples every 0.5 s of simulated time, prints a line per run and writes
results/fragmentation/metrics.json.
"""
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from llumnix.bench.machine import machine_info
from llumnix.sim.config import load_config
from llumnix.sim.latency import get_latency_model
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.runner import plan
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import make_trace

HERE = Path(__file__).resolve().parent
SAMPLE_EVERY_S = 0.5


class SampledSimulator(Simulator):
    """The simulator, counting blocked instances at every sample time."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.counts = {"samples": 0, "instance_samples": 0, "blocked": 0, "fits_another": 0,
                       "fits_cluster_sum": 0, "cluster_full": 0, "gateway_queued": 0}
        self._next_sample = SAMPLE_EVERY_S

    def on_status_round(self, ev):
        if self.clock.now() >= self._next_sample and not self.is_done:
            self._next_sample += SAMPLE_EVERY_S
            self._sample()
        return super().on_status_round(ev)

    def _sample(self) -> None:
        c = self.counts
        insts = [i for i in self.cluster.instances.values() if i.is_up]
        total_free = sum(i.engine.kv.num_free_blocks for i in insts)
        c["samples"] += 1
        c["instance_samples"] += len(insts)
        c["gateway_queued"] += len(self.gateway)
        for inst in insts:
            head = inst.engine.scheduler.head_of_line
            if head is None or inst.engine.kv.can_allocate(head.num_tokens):
                continue
            c["blocked"] += 1
            need = inst.engine.kv.num_blocks_for(head.num_tokens)
            if any(o is not inst and o.engine.kv.can_allocate(head.num_tokens) for o in insts):
                c["fits_another"] += 1
            elif total_free >= need:
                c["fits_cluster_sum"] += 1
            else:
                c["cluster_full"] += 1


def _run(spec):
    trace = make_trace(spec.trace, spec.rate, spec.seed)
    sim = SampledSimulator(spec.cluster, get_latency_model(spec.latency_model),
                           make_policy(spec.system, spec.cluster, seed=spec.seed), trace)
    out = sim.run()
    c = sim.counts
    blocked = max(1, c["blocked"])
    return {"trace": spec.trace.name, "rate": spec.rate, "system": spec.system.name,
            "latency_model": spec.latency_model, "prefill": out["prefill"], "kv_usage_mean": out["kv_usage_mean"],
            "blocked_share": c["blocked"] / max(1, c["instance_samples"]),
            "of_blocked": {k: c[k] / blocked for k in ("fits_another", "fits_cluster_sum", "cluster_full")},
            "gateway_queued_mean": c["gateway_queued"] / max(1, c["samples"]), "counts": c}


def main() -> None:
    cfg = load_config(HERE / "figure11.yaml")
    points = [(p.split(":")[0], float(p.split(":")[1])) for p in sys.argv[1:]] or [("M-M", 7.8), ("L-L", 3.0)]
    specs = [s for s in plan(cfg) if (s.trace.name, float(s.rate)) in points and s.system.name != "round-robin"]
    t0 = time.time()
    with ProcessPoolExecutor(2) as pool:
        records = list(pool.map(_run, specs))
    for r in records:
        o = r["of_blocked"]
        print(f"{r['trace']} {r['rate']:g} {r['system']:<9} P99 prefill {r['prefill']['p99']:7.1f} s  "
              f"KV in use {r['kv_usage_mean']:.0%}  blocked {r['blocked_share']:.1%} of instance-samples; "
              f"of those: fits another instance {o['fits_another']:.0%}, only the cluster's sum "
              f"{o['fits_cluster_sum']:.0%}, cluster full {o['cluster_full']:.0%}")
    out = HERE / "results" / "fragmentation"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "metrics.json"
    old = json.loads(path.read_text())["records"] if path.is_file() else []
    keep = [r for r in old if not any(r["trace"] == n["trace"] and r["rate"] == n["rate"] and
                                      r["system"] == n["system"] and r.get("latency_model") == n["latency_model"]
                                      for n in records)]
    path.write_text(json.dumps({"config": "figure11.yaml", "seed": 0, "sample_every_s": SAMPLE_EVERY_S,
                                "machine": machine_info(with_torch=False), "wall_s": time.time() - t0,
                                "records": keep + records}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
