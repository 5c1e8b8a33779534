"""One logging setup for every Llumnix process: the `serve`/`gateway` process and, inside
Ray, each instance actor and LlumSched. Python drops INFO without a handler, so without
this the request, throughput, migration and drain lines never print.

Lines go to stderr with a timestamp; in a Ray actor, Ray forwards them to the driver's
terminal with its ``(InstanceActor pid=N)`` prefix. Llumnix's own loggers take the chosen
level; everyone else's stay at WARNING (or the chosen level, if higher), so a library's
INFO chatter does not drown ours.

The level travels to the actors in ``$LLUMNIX_LOG_LEVEL``: the serve process sets it
before Ray starts, and the processes Ray starts here inherit it."""
from __future__ import annotations

import logging
import os
import sys
from typing import Any

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
LEVEL_ENV = "LLUMNIX_LOG_LEVEL"
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
_MARK = "_llumnix_handler"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is at each line, not as it was when installed (a
    process, or a test harness, may replace it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(level: str | None = None) -> str:
    """Install the handler (once per process; a second call only changes the level) and
    return the level in force: ``level``, else ``$LLUMNIX_LOG_LEVEL``, else info. A level
    that is not one of ``LOG_LEVELS`` (from the environment) falls back to info."""
    name = (level or os.environ.get(LEVEL_ENV) or "info").lower()
    if name not in LOG_LEVELS:
        name = "info"
    os.environ[LEVEL_ENV] = name  # what the actors started from here read
    if not sys.stderr.isatty():  # a log file or journal: Ray's prefix on the actors' lines without colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    root = logging.getLogger()
    if not any(getattr(h, _MARK, False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    numeric = getattr(logging, name.upper())
    root.setLevel(max(numeric, logging.WARNING))
    logging.getLogger("llumnix").setLevel(numeric)
    return name


def migration_line(report: dict[str, Any], what: str = "migration") -> str:
    """One line for a finished migration (or PD hand-off) report, with its downtime."""
    rid, src, dst = report.get("request_id", "-"), report.get("src_instance_id", "-"), report.get("dst_instance_id", "-")
    head = f"{what} of {rid} {src} -> {dst}"
    if not report.get("committed"):
        why = report.get("abort_code") or report.get("abort_reason") or "unknown"
        return f"{head} aborted ({why})"
    if report.get("was_queued"):
        return f"{head} committed: queued, moved as metadata (no downtime)"
    downtime = report.get("downtime")
    stall = "-" if downtime is None else f"{1000 * float(downtime):.1f} ms"
    duration = report.get("duration")
    took = "" if duration is None else f" in {float(duration):.3f} s"
    return (f"{head} committed: {report.get('num_blocks', 0)} blocks ({report.get('num_blocks_cached', 0) or 0} "
            f"adopted) in {report.get('num_stages', 0)} stages{took}, downtime {stall}")
