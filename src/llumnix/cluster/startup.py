"""How `llumnix serve` and `llumnix gateway` start: the HTTP port taken first (so a port in
use fails in a second, not after the model has loaded), a line for each step, and "ready"
only once the server answers."""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, cast

from llumnix.core.errors import LlumnixError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (for tests and benchmarks that start servers)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None]:
    """``Popen(preexec_fn=die_with_parent())``: the child gets SIGTERM when the process that
    started it dies, however it dies (a benchmark killed with SIGKILL; a server started with
    ``start_new_session`` would otherwise outlive it with its Ray cluster). Linux only (prctl's
    parent-death signal); elsewhere nothing. The signal follows the starting *thread*: start
    such children from the main thread."""
    parent = os.getpid()

    def in_child() -> None:
        if not sys.platform.startswith("linux"):
            return
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def wait_until_healthy(url: str, proc: Any, timeout_s: float = 300.0, what: str = "the server") -> None:
    """Until ``url``'s ``/health`` answers 200 (a server started as ``proc``, a Popen):
    LlumnixError, in one line, when the process exits first or ``timeout_s`` runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise LlumnixError(f"{what} exited with status {proc.returncode} before {url}/health answered")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise LlumnixError(f"{what} did not answer {url}/health within {timeout_s:.0f} s")
        time.sleep(0.2)


def bind_port(host: str, port: int) -> socket.socket:
    """The HTTP socket, bound and listening: the port is ours from now on (a socket that
    is only bound, with SO_REUSEADDR, would not keep a second server off it). A client that
    comes before the server is ready waits in the backlog and is answered once it is."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise LlumnixError(f"--host {host}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait
    try:
        sock.bind(addr)
        sock.listen(2048)  # uvicorn's backlog
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise LlumnixError(f"port {port} on {host} is already in use: stop what holds it, or pick "
                               "another with --port") from None
        raise LlumnixError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class Progress:
    """Start-up lines, each with the seconds since the start."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"{self.title}: {text}", flush=True)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0


def serve_http(app: Any, sock: socket.socket, log_level: str, grace_s: float,
               on_ready: Callable[[], None]) -> None:
    """uvicorn on ``sock`` until SIGINT/SIGTERM; ``on_ready`` once it accepts connections."""
    import uvicorn

    from llumnix.cluster.gc_watch import freeze_startup_objects
    from llumnix.gateway.read_deadline import http_protocol

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit:
                # What start-up built (the app, Ray's worker state, the tokenizer) lives as
                # long as the server: out of the collector's walks (``gc_watch``), which
                # otherwise cost a full collection of it every few hundred requests.
                freeze_startup_objects()
                on_ready()

    # uvicorn's stubs say int; it waits any number of seconds (asyncio.wait_for)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=cast(int, grace_s),
                            http=http_protocol(app))
    Server(config).run(sockets=[sock])
