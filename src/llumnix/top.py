"""`llumnix top`: the cluster in a terminal, from a gateway's ``/admin/cluster``: per
instance its state, PD role, KV in use, freeness, running and waiting requests and
preemptions; the migrations (counts, and the newest with their stall). Redrawn as the
view changes (``/admin/cluster?after=VERSION``: the gateway answers when it differs from
the last one drawn), and every ``--interval`` seconds while it does not; a gateway without
that is polled every ``--interval`` (at most 0.5 s). ``--once`` prints one view and exits
(scripts, tests)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from llumnix.core.errors import LlumnixError

BAR = 10
"""Characters of the KV usage bar."""
NUM_RECENT = 8
"""Migrations listed under the table, newest first."""
MIN_GAP_S = 0.2
"""The fewest seconds between two redraws while the view keeps changing."""
POLL_S = 0.5
"""The longest period of plain polls (a gateway without watches)."""


def add_top_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (default http://127.0.0.1:8000)")
    p.add_argument("--key", default=os.environ.get("LLUMNIX_ADMIN_KEY") or os.environ.get("LLUMNIX_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (default: $LLUMNIX_ADMIN_KEY, else $LLUMNIX_API_KEY)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between redraws while nothing changes (default 2; a change is drawn as it "
                        "happens)")
    p.add_argument("--once", action="store_true", help="print one view and exit")


def fetch(url: str, key: str | None, after: str | None = None, wait_s: float = 0.0) -> dict[str, Any]:
    """``/admin/cluster`` (with ``after``: once its version is not ``after``, or after
    ``wait_s``), or LlumnixError in one line (unreachable, refused, not a gateway)."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    params = None if after is None else {"after": after, "wait": f"{wait_s:g}"}
    try:
        r = httpx.get(f"{url.rstrip('/')}/admin/cluster", headers=headers, params=params, timeout=5 + wait_s)
    except httpx.HTTPError as e:
        raise LlumnixError(f"cannot reach {url}: {type(e).__name__}") from None
    if r.status_code in (401, 403):
        raise LlumnixError(f"{url} refused /admin/cluster ({r.status_code}): pass its admin or API key with --key")
    if r.status_code == 429 and after is not None:  # too many watches open there: a plain poll
        return fetch(url, key)
    if r.status_code != 200:
        raise LlumnixError(f"{url}/admin/cluster answered {r.status_code}: {r.text[:200]}")
    info: dict[str, Any] = r.json()
    return info


def state_of(inst: dict[str, Any]) -> str:
    if inst.get("is_terminating"):
        return "draining"
    return "serving" if inst.get("is_schedulable", True) else "unschedulable"


def _bar(used: int, total: int) -> str:
    share = used / total if total > 0 else 0.0
    filled = min(BAR, round(share * BAR))
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {100 * share:3.0f}%"


def _freeness(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return "inf" if math.isinf(value) else f"{value:.1f}"


def outcome(m: dict[str, Any]) -> str:
    """A migration report's end, as `top` and the demo print it."""
    if not m.get("committed"):
        return f"aborted ({m.get('abort_code') or m.get('abort_reason') or '?'})"
    if m.get("was_queued"):
        return "committed (queued: no stall)"
    stall = m.get("downtime")
    return "committed" if stall is None else f"committed, stall {1000 * float(stall):.1f} ms"


def _migration(m: dict[str, Any], now: float) -> str:
    # reported_at: LlumSched's wall clock (end_time is on the source's monotonic clock)
    at = m.get("reported_at") or m.get("end_time")
    ago = f"{now - float(at):5.1f}s ago" if at else "          "
    head = f"  {ago}  {m.get('request_id') or '-'}  {m.get('src_instance_id') or '-'} -> {m.get('dst_instance_id') or '-'}"
    return f"{head}  {outcome(m)}"


def _sim_line(sim: dict[str, Any]) -> str:
    behind = float(sim.get("behind_s") or 0.0)
    return (f"simulated: {sim.get('name')}, {sim.get('label')}; t = {float(sim.get('time_s', 0)):.1f} s at "
            f"{float(sim.get('speed', 1)):g}x, {sim.get('num_finished', 0)}/{sim.get('num_requests', 0)} requests done"
            f"{'; ended' if sim.get('done') else ''}{f'; {behind:.1f} s behind' if behind >= 1 else ''}")


def render(info: dict[str, Any], url: str, now: float) -> str:
    """The view of one ``/admin/cluster`` answer, as text. A simulation's (``llumnix
    simulate --live``) is on its own clock: ``requests.time``, and a line says where it is."""
    mig = info.get("migrations") or {}
    sim = info.get("sim")
    if sim:
        now = float((info.get("requests") or {}).get("time", now))
    insts = sorted((i for i in info.get("instances", ()) if isinstance(i, dict)), key=lambda i: str(i["instance_id"]))
    lines = [f"llumnix top  {url}  {time.strftime('%H:%M:%S', time.localtime(now))}  dispatch "
             f"{info.get('dispatch_policy', '-')}  dispatched {info.get('num_dispatched', 0)}  instances {len(insts)}",
             f"migrations: {mig.get('committed', 0)} committed, {mig.get('aborted', 0)} aborted, "
             f"{len(mig.get('in_flight') or ())} in flight",
             *([_sim_line(sim)] if sim else []),
             "",
             f"{'INSTANCE':<14}{'STATE':<15}{'ROLE':<9}{'KV USED':<19}{'FREENESS':>9}{'RUNNING':>9}{'WAITING':>9}"
             f"{'PREEMPT':>9}"]
    for i in insts:
        lines.append(f"{str(i['instance_id']):<14}{state_of(i):<15}{str(i.get('role') or '-'):<9}"
                     f"{_bar(int(i.get('num_used_blocks', 0)), int(i.get('num_total_blocks', 0))):<19}"
                     f"{_freeness(i.get('freeness')):>9}{i.get('num_running', 0):>9}{i.get('num_waiting', 0):>9}"
                     f"{i.get('num_preemptions', 0):>9}")
    if not insts:
        lines.append("  (no instance reports yet)")
    recent = list(mig.get("recent") or ())[-NUM_RECENT:][::-1]
    lines += ["", "recent migrations (newest first):" if recent else "recent migrations: none yet"]
    lines += [_migration(m, now) for m in recent]
    return "\n".join(lines)


def main_top(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise LlumnixError(f"--interval must be > 0, got {args.interval:g}")
    if args.once:
        print(render(fetch(args.url, args.key), args.url, time.time()))
        return 0
    first = fetch(args.url, args.key, after="")  # a wrong URL or key: one line, before the screen is taken
    info: dict[str, Any] | None = first
    version = first.get("version")  # None: a gateway without watches (or too many open there), polled
    failed = ""
    try:
        while True:
            started = time.monotonic()
            view = render(info, args.url, time.time()) if info is not None else failed
            sys.stdout.write("\x1b[H\x1b[2J" + view + "\n")  # home, clear: one screen redrawn
            sys.stdout.flush()
            gap = MIN_GAP_S if version is not None and info is not None else min(args.interval, POLL_S)
            time.sleep(max(0.0, started + gap - time.monotonic()))
            try:
                info = fetch(args.url, args.key, version, args.interval)
                version = info.get("version")
            except LlumnixError as e:  # a gateway restarting: say so, and keep trying
                info, failed = None, f"llumnix top  {args.url}  {time.strftime('%H:%M:%S')}\n\n  {e}; trying again"
    except KeyboardInterrupt:
        return 0
