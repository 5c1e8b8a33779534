"""startup.wait_until_healthy: the one wait for a started server's /health."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from llumnix.cluster.startup import free_port, wait_until_healthy
from llumnix.core.errors import LlumnixError

SERVER = """
import http.server, sys, time
time.sleep(0.3)  # comes up a moment later
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _run(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args])


def test_returns_once_health_answers():
    port = free_port()
    proc = _run(SERVER, str(port))
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", proc, 30.0)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_exits_first_is_one_line_naming_its_status():
    proc = _run("import sys; sys.exit(3)")
    with pytest.raises(LlumnixError, match=r"^the engine exited with status 3 before .*/health answered$"):
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", proc, 30.0, "the engine")


def test_a_server_that_never_answers_times_out():
    proc = _run("import time; time.sleep(30)")
    try:
        t0 = time.monotonic()
        with pytest.raises(LlumnixError, match="did not answer .* within 1 s"):
            wait_until_healthy(f"http://127.0.0.1:{free_port()}", proc, 1.0)
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
        proc.wait()
