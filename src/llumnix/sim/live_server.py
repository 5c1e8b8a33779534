"""``llumnix simulate CONFIG --live``: the plan's first point (its first trace and rate,
seed 0) run for every system side by side at wall-clock pace (``--speed`` times
faster), each served as the gateway serves a real cluster: ``/NAME/dashboard`` (the
same page) over ``/NAME/admin/cluster`` (the same document), for ``llumnix top --url
http://HOST:PORT/NAME``. ``/dashboard`` and ``/admin/cluster`` are the first system's;
``/`` lists them all. When the runs end, their summary table is printed and the pages
keep the last state until Ctrl-C (or SIGTERM). No key: it listens on 127.0.0.1 unless
``--host`` says otherwise. ``/NAME/admin/cluster?after=VERSION&wait=S`` waits for the next
document as the gateway's long poll does (a thread each, ``MAX_WAITERS`` at once)."""
from __future__ import annotations

import errno
import html
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from llumnix.core.errors import LlumnixError
from llumnix.sim.config import ExperimentConfig
from llumnix.sim.live import LiveRun
from llumnix.sim.runner import RunSpec, make_simulator, plan, record_of


def _path(name: str) -> str:
    """A system's name as the first part of its pages' path."""
    return quote(name, safe="+")


@cache
def dashboard_page() -> bytes:
    return (files("llumnix.gateway") / "static" / "dashboard.html").read_bytes()


MAX_WAITERS = 64
"""Long polls waiting at once (each holds a thread); one more is answered 429."""
MAX_WAIT_S = 30.0


class LiveServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], runs: dict[str, LiveRun]) -> None:
        self.runs = runs
        """Path name (the system's, URL-quoted) -> its run; the first is the default."""
        self.num_waiting = 0
        self.waiting_lock = threading.Lock()
        self.serving = False
        super().__init__(address, _Handler)

    def close(self) -> None:
        """Answer every waiting long poll, stop serving, close the socket."""
        for r in self.runs.values():
            r.close()
        if self.serving:  # shutdown() waits for serve_forever, which must have been started
            self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def index(self) -> bytes:
        items = "".join(f'<li><a href="{html.escape(p)}/dashboard">{html.escape(r.name)}</a> '
                        f'<span>{html.escape(r.label)}</span></li>' for p, r in self.runs.items())
        return (f'<!doctype html><meta charset="utf-8"><title>Llumnix simulation</title>'
                f"<h1>Llumnix simulation, live</h1><ul>{items}</ul>").encode()


class _Handler(BaseHTTPRequestHandler):
    server: LiveServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/") if p]
        runs = self.server.runs
        run = next(iter(runs.values()))
        if parts and _path(parts[0]) in runs:
            run = runs[_path(parts[0])]
            parts = parts[1:]
        elif not parts:
            return self._send(200, "text/html; charset=utf-8", self.server.index())
        if parts == ["dashboard"]:
            return self._send(200, "text/html; charset=utf-8", dashboard_page())
        if parts == ["admin", "cluster"]:
            return self._cluster(run)
        if parts == ["health"]:
            return self._send(200, "application/json", b'{"status": "ok"}')
        return self._error(404, f"no route {self.path}: try /, /dashboard or /admin/cluster", None)

    def _cluster(self, run: LiveRun) -> None:
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if "after" not in query:
            return self._send(200, "application/json", run.body)
        try:
            wait_s = min(MAX_WAIT_S, float(query.get("wait", ["20"])[0]))
            if not wait_s >= 0:
                raise ValueError
        except ValueError:
            return self._error(400, f"wait must be a number of seconds >= 0, got {query['wait'][0]!r}", "wait")
        with self.server.waiting_lock:
            if self.server.num_waiting >= MAX_WAITERS:
                return self._error(429, f"{MAX_WAITERS} watches of /admin/cluster are open, the most this server "
                                        "keeps; poll /admin/cluster without after= instead", "after")
            self.server.num_waiting += 1
        try:
            body = run.wait(query["after"][0], wait_s)
        finally:
            with self.server.waiting_lock:
                self.server.num_waiting -= 1
        return self._send(200, "application/json", body)

    def _error(self, status: int, message: str, param: str | None) -> None:
        kind = {404: "not_found_error", 429: "rate_limit_error"}.get(status, "invalid_request_error")
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
        return self._send(status, "application/json", json.dumps(body).encode())

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # two polls a second per page: not worth a line each


def first_point(cfg: ExperimentConfig) -> list[RunSpec]:
    """The plan's first (trace, rate) at seed 0, every system."""
    runs = plan(cfg, 1)
    head = runs[0]
    return [r for r in runs if (r.trace.name, r.rate) == (head.trace.name, head.rate)]


def listen(host: str, port: int, runs: dict[str, LiveRun]) -> LiveServer:
    try:
        return LiveServer((host, port), runs)
    except OSError as e:
        why = "address in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise LlumnixError(f"cannot listen on {host}:{port}: {why} (--port 0 takes any free port)") from None


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the live view as Ctrl-C does: exit 0


class LiveSession:
    """The runs of one point side by side, started together, and their server."""

    def __init__(self, specs: list[RunSpec], speed: float, host: str, port: int) -> None:
        if not speed > 0:
            raise LlumnixError(f"--speed must be > 0, got {speed:g}")
        self.specs = specs
        sims = [make_simulator(s) for s in specs]
        epoch, start = time.time(), time.monotonic()
        self.runs = {_path(s.system.name): LiveRun(s.system.name, sim, speed, epoch=epoch, start=start,
                                                   label=f"{s.trace.name} at {s.rate:g} req/s, {len(sim.trace)} "
                                                         f"requests, {s.cluster.num_instances} instances")
                     for s, sim in zip(specs, sims, strict=True)}
        self.server = listen(host, port, self.runs)

    def start(self) -> None:
        self.server.serving = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        for r in self.runs.values():
            threading.Thread(target=r.run, daemon=True, name=f"live-{r.name}").start()

    def addresses(self) -> list[str]:
        url = self.server.url
        return [f"  {r.name:<14} {url}/{path}/dashboard   (llumnix top --url {url}/{path})"
                for path, r in self.runs.items()]

    def wait(self, on_tick: Callable[[], None] | None = None, every_s: float = 0.5) -> list[dict[str, Any]]:
        """Until every run ends (``on_tick`` between checks); their metrics records."""
        for r in self.runs.values():
            while not r.done.wait(every_s):
                if on_tick is not None:
                    on_tick()
            if r.error is not None:
                raise LlumnixError(f"the {r.name} run failed: {type(r.error).__name__}: {r.error}")
        if on_tick is not None:
            on_tick()
        return [record_of(s, len(r.sim.trace), r.summary or {}) for s, r in zip(self.specs, self.runs.values(),
                                                                                 strict=True)]

    def hold(self) -> None:
        """Serve the last state until Ctrl-C or SIGTERM."""
        signal.signal(signal.SIGTERM, _interrupt)
        while True:
            time.sleep(3600)


def main_live(cfg: ExperimentConfig, speed: float, host: str, port: int) -> int:
    specs = first_point(cfg)
    session = LiveSession(specs, speed, host, port)
    signal.signal(signal.SIGTERM, _interrupt)
    head, run = specs[0], next(iter(session.runs.values()))
    print(f"live: {cfg.name}, {head.trace.name} at {head.rate:g} req/s, {len(run.sim.trace)} requests, "
          f"{head.cluster.num_instances} instances, {speed:g}x wall-clock speed", flush=True)
    print("\n".join(session.addresses()), flush=True)
    session.start()
    try:
        records = session.wait()
        from llumnix.sim.report import summary_table

        print(summary_table(records), flush=True)
        print(f"the runs ended; {session.server.url}/ keeps their last state until Ctrl-C", flush=True)
        session.hold()
    except KeyboardInterrupt:
        pass
    finally:
        session.server.close()
        sys.stdout.flush()
    return 0
