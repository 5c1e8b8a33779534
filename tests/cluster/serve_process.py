"""`llumnix serve` as a real process for the tests that watch it from outside (its output,
its signals, its pace): started on a free port with a small KV cache, waited for until
healthy (its output shown if it never is), and stopped as an operator would."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llumnix.cluster.startup import die_with_parent, free_port, wait_until_healthy
from llumnix.core.errors import LlumnixError


@contextlib.contextmanager
def serve_process(model_dir: Path, log: Path, *flags: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``llumnix serve --model model_dir *flags`` with stdout and stderr in ``log``: its URL
    and process. On leaving, a server still running gets SIGTERM (so it takes its Ray
    session down with it), and SIGKILL if it has not exited 30 s later; a test run killed
    outright takes it down too (``die_with_parent``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "serve", "--model", str(model_dir),
                                 "--port", str(port), "--kv-cache-mib", "8", *flags],
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        try:
            try:
                wait_until_healthy(url, proc, 120.0, "llumnix serve")
            except LlumnixError as e:
                pytest.fail(f"{e}\n{log.read_text()}")
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
