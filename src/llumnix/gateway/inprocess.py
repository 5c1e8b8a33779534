"""The OpenAI gateway for a backend, served by uvicorn in a thread of this process on a
free loopback port (benchmarks and tests; `llumnix serve` and `llumnix gateway` run
uvicorn in the foreground instead).

Like `llumnix serve` (``cluster/startup.py``), it freezes what the process holds once it
serves (``gc_watch.freeze_startup_objects``): a benchmark's or a test run's heap is larger
than a server's, and a full collection of it holds the gateway's loop for tens of
milliseconds (a shed request's 429 took 56 ms in the first round of a quiet
``benchmarks/slo/real_cluster.py`` run, against 8-15 ms in the others). The block's end
unfreezes it."""
from __future__ import annotations

import gc
import socket
import threading
import time
from typing import Any

from llumnix.core.errors import LlumnixError


class InProcessGateway:
    """``with InProcessGateway(backend) as url:`` serves ``build_app(backend, **app_kw)``
    (a backend with ``start``/``stop`` coroutines, such as ``ClusterBackend``, is started
    and stopped with the app) until the block ends."""

    def __init__(self, backend: Any, startup_timeout_s: float = 30.0, **app_kw: Any) -> None:
        self.backend = backend
        self.app_kw = app_kw
        self.startup_timeout_s = startup_timeout_s
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self._froze = False
        """This gateway froze the heap (``LLUMNIX_GC_FREEZE=0`` turns it off): its end unfreezes it."""

    def __enter__(self) -> str:
        import uvicorn

        from llumnix.gateway.app import build_app
        from llumnix.gateway.read_deadline import http_protocol

        app = build_app(self.backend, **self.app_kw)
        for hooks, name in ((app.router.on_startup, "start"), (app.router.on_shutdown, "stop")):
            if hasattr(self.backend, name):
                hooks.append(getattr(self.backend, name))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    http=http_protocol(app)))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="gateway")
        self.thread.start()
        deadline = time.time() + self.startup_timeout_s
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        if not self.server.started:
            self.__exit__()
            raise LlumnixError(f"the in-process gateway did not start within {self.startup_timeout_s:g} s")
        from llumnix.cluster.gc_watch import freeze_startup_objects

        self._froze = freeze_startup_objects() > 0
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)
        if self._froze:
            gc.unfreeze()
            self._froze = False
