"""The fidelity study: one seeded trace on the real cluster and in the simulator.

For each load (light; near saturation, where migrations and preemptions happen) and
each system (infaas++ dispatch without migration, llumnix dispatch with migration),
the same requests (arrival times, prompt token ids, output lengths) are served by:

* the real cluster: 2 instance actors on Ray, LlumSched, the OpenAI gateway (as
  ``llumnix serve`` starts them), driven over HTTP with streamed completions;
* the simulator, with the profile ``llumnix profile`` measured and the same cluster
  settings (blocks, block size, batch limits, thresholds, status and rescheduling
  intervals), and one scheduling config dict for both.

The simulator's clock starts at the engine; a request's real TTFT also holds the
serving path (HTTP, LlumSched's dispatch, the Ray hops in and out, the SSE chunk).
That cost is measured on the idle cluster before each run (probes whose engine step
is found in the instance's step log) and added to the simulated TTFT and end-to-end
latency. Per metric the report gives sim, real and (sim - real) / real.

Modules: ``workload`` (the cluster and the trace), ``real`` (a run on the cluster),
``probes`` (measurements of the idle cluster before a run), ``factors`` (what the probes
and a run's steps say about the machine), ``simulate`` (the run in the simulator),
``compare`` (metrics, errors, goals), ``report`` (table and plot), ``run`` (the command:
``python -m benchmarks.fidelity``).
"""
