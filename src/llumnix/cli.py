"""`llumnix` command line. Errors print one line and exit 2, never a traceback."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llumnix.bench.machine import RESULTS_DIR
from llumnix.core.errors import LlumnixError


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="'smollm2' (the packaged SmolLM2-135M-Instruct GGUF), a .gguf file, "
                        "or a Hugging Face directory (config.json + *.safetensors + tokenizer.json)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay decode steps from CUDA graphs (default: on with a CUDA device)")


def _cmd_generate(args: argparse.Namespace) -> int:
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.llm import LLM

    _set_threads(args.threads)
    params = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            stop=tuple(args.stop or ()), presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty,
                            repetition_penalty=args.repetition_penalty)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs)
    (out,) = llm.generate([args.prompt], params, chat=args.chat)
    print(out.text)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from llumnix.cluster.serve import main_serve

    return main_serve(args)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from llumnix.cluster.serve import main_gateway

    return main_gateway(args)


def _cmd_simulate(args: argparse.Namespace) -> int:
    if args.live:
        given = [f for f, v in (("--out", args.out), ("--seeds", args.seeds), ("--resume", args.resume)) if v]
        if given:
            raise LlumnixError(f"{given[0]} does not apply with --live (one point, watched, nothing written)")
        from llumnix.sim.config import load_config
        from llumnix.sim.live_server import main_live

        return main_live(load_config(args.config, args.set or []), args.speed, args.host, args.port)
    from llumnix.sim.runner import main_simulate

    return main_simulate(args.config, args.set or [], args.seeds, args.out, args.resume)


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "engine":
        from llumnix.bench.engine_bench import main_engine_bench

        return main_engine_bench(args)
    if args.what == "migration":
        from llumnix.bench.migration_bench import main_migration_bench

        return main_migration_bench(args)
    if args.what == "serve":
        from llumnix.bench.serve_bench import main_serve_bench

        return main_serve_bench(args)
    if args.what == "cluster":
        from llumnix.bench.cluster_bench import main_cluster_bench

        return main_cluster_bench(args)
    raise LlumnixError(f"unknown benchmark {args.what!r}")


def _cmd_top(args: argparse.Namespace) -> int:
    from llumnix.top import main_top

    return main_top(args)


def _cmd_profile(args: argparse.Namespace) -> int:
    from llumnix.bench.profile import main_profile

    return main_profile(args)


def _set_threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def _add_bench_parser(sub: Any) -> None:
    b = sub.add_parser("bench", help="run a committed benchmark",
                       description="engine: one engine's prefill and decode speed; migration: live migration "
                       "against blocking copy and recompute by sequence length; serve: a load generator for any "
                       "OpenAI endpoint; cluster: the real cluster, system against system (about 15 minutes; "
                       f"see its group below). Each writes JSON (and a plot) to --out, default ./{RESULTS_DIR}/.")
    b.add_argument("what", choices=["engine", "migration", "serve", "cluster"])
    _add_model_args(b)
    b.add_argument("--out", default=RESULTS_DIR,
                   help=f"directory for the JSON result and plot (default: ./{RESULTS_DIR}, never the checkout's "
                        "committed results unless named)")
    b.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test)")
    b.add_argument("--no-reference", action="store_true",
                   help="skip the Hugging Face transformers reference")
    mb = b.add_argument_group("bench migration")
    mb.add_argument("--transport", default=None,
                    help="comma-separated KV transports to measure: tcp,gloo,ray (default: all)")
    mb.add_argument("--repeats", type=int, default=None, help="live migrations per transport and length")
    mb.add_argument("--bulk-rate", type=float, default=None, metavar="MB_PER_S",
                    help="pace pre-copy stages to this many MB/s (the last stage is never paced)")
    mb.add_argument("--bulk-idle", action=argparse.BooleanOptionalAction, default=True,
                    help="run pre-copy threads in SCHED_IDLE, only on otherwise idle cores (default: on)")
    mb.add_argument("--arrivals", default=None, metavar="RATE[:PROMPT[:OUTPUT]]",
                    help="new prompts at each instance while the target migrates: RATE a second (Poisson, "
                         "--seed), PROMPT tokens (256), OUTPUT tokens (16); each migration's wait after its "
                         "commit is split (issue 49)")
    mb.add_argument("--gap", type=float, default=None, metavar="S",
                    help="seconds of ordinary steps before each migration (default: the baseline windows)")
    mb.add_argument("--chunked-prefill", type=int, default=None, metavar="TOKENS",
                    help="the engines' chunked prefill, at most TOKENS a step (default: off)")
    from llumnix.bench.serve_bench import add_serve_bench_args

    add_serve_bench_args(b)
    from llumnix.bench.cluster_bench import add_cluster_bench_args

    add_cluster_bench_args(b)
    b.set_defaults(func=_cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llumnix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="complete one prompt with the local engine")
    _add_model_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--min-tokens", type=int, default=0, help="no EOS or stop string before this many tokens")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's, in [-2, 2]")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's, in [-2, 2]")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="transformers' rule, in (0, 2]")
    g.set_defaults(func=_cmd_generate)

    s = sub.add_parser("serve", help="serve an OpenAI-compatible API from a cluster of instances on Ray")
    from llumnix.cluster.serve_args import add_serve_args

    add_serve_args(s)
    s.set_defaults(func=_cmd_serve)
    from llumnix.demo import add_demo_parser

    add_demo_parser(sub)

    gw = sub.add_parser("gateway", help="one more OpenAI gateway in front of a running `llumnix serve` cluster")
    from llumnix.cluster.serve_args import add_gateway_args

    add_gateway_args(gw)
    gw.set_defaults(func=_cmd_gateway)

    top = sub.add_parser("top", help="the cluster in a terminal: per instance KV, freeness, requests; migrations",
                         description="A terminal view of a gateway's /admin/cluster, redrawn every --interval "
                         "seconds: per instance its state, role, KV in use, freeness, running and waiting requests "
                         "and preemptions; the newest migrations with their stall.")
    from llumnix.top import add_top_args

    add_top_args(top)
    top.set_defaults(func=_cmd_top)

    sim = sub.add_parser("simulate", help="run a discrete-event cluster simulation from a YAML config")
    sim.add_argument("config", help="experiment YAML, e.g. benchmarks/sim/figure11.yaml")
    sim.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field")
    sim.add_argument("--seeds", type=int, default=None, help="seeds per point")
    sim.add_argument("--out", default=None, help=f"output directory (default: ./{RESULTS_DIR}/simulate/NAME)")
    sim.add_argument("--resume", action="store_true",
                     help="keep the runs already in the output's metrics.json; run only the missing ones")
    live = sim.add_argument_group("live", "watch one point of the plan as it runs, in /dashboard or llumnix top")
    live.add_argument("--live", action="store_true",
                      help="run the plan's first trace and rate (seed 0) for every system side by side at "
                           "wall-clock pace, each served as a gateway serves a cluster: /SYSTEM/dashboard, "
                           "/SYSTEM/admin/cluster; narrow it with --set (include_systems, traces.NAME.rates)")
    live.add_argument("--speed", type=float, default=1.0, metavar="X",
                      help="simulated seconds per wall-clock second (default 1)")
    live.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; no key)")
    live.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free one)")
    sim.set_defaults(func=_cmd_simulate)

    pr = sub.add_parser("profile", help="measure the real engine and write a latency profile for simulate")
    _add_model_args(pr)
    pr.add_argument("--out", default=f"{RESULTS_DIR}/profile.json",
                    help=f"profile JSON to write (default: ./{RESULTS_DIR}/profile.json)")
    pr.add_argument("--neighbor", action=argparse.BooleanOptionalAction, default=True,
                    help="measure while a second engine process decodes (two instances share the cores)")
    pr.add_argument("--nice", type=int, default=15,
                    help="niceness to measure at (Ray starts instance actors at nice 15)")
    pr.add_argument("--quick", action="store_true", help="a tiny grid (smoke test)")
    pr.set_defaults(func=_cmd_profile)

    _add_bench_parser(sub)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, by name."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def check_writable(path: str, *, is_dir: bool) -> None:
    """Refuse an output that cannot be written before the work, not after it (a profile
    takes minutes, a simulation hours). Missing parent directories are created."""
    target = Path(path) if is_dir else Path(path).parent
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as e:
        raise LlumnixError(f"cannot write {path!r}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # one line naming the flag and the nearest one the command has, not the top-level usage
        from llumnix.cluster.vllm_flags import unknown_flag

        command = _subcommands(parser)[args.command]
        print(f"llumnix {args.command}: error: {unknown_flag(command, extras)}", file=sys.stderr)
        return 2
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        if getattr(args, "out", None):
            check_writable(args.out, is_dir=args.command != "profile")
        return func(args)
    except (LlumnixError, OSError) as e:  # OSError: a file or socket the user named
        if os.environ.get("LLUMNIX_DEBUG"):
            raise
        print(f"llumnix {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
