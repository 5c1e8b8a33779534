"""The gateway's HTTP edge against slow and prying clients (issue 43, point 7): a request
must arrive whole within the read deadline, keys are compared in constant time, and
/metrics and the API docs can be put behind the key."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from llumnix.gateway.app import build_app
from llumnix.gateway.inprocess import InProcessGateway


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (reads EOF), None if it did not in time."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return time.monotonic() - t0
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - t0


@pytest.mark.parametrize("sent", [
    b"",  # connected, silent
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty",  # half the headers
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n{}",  # 2 bytes of a 1,000-byte body
])
def test_a_request_that_does_not_arrive_in_time_loses_its_connection(backend, sent):
    with InProcessGateway(backend, http_read_timeout_s=1.0) as url:
        slow = _connect(url)
        slow.sendall(sent)
        closed_after = _closed_within(slow, 5.0)
        assert closed_after is not None and closed_after < 3.0, closed_after
        # meanwhile and after, others are served
        r = httpx.post(f"{url}/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200


def test_trickling_does_not_extend_the_deadline(backend):
    with InProcessGateway(backend, http_read_timeout_s=1.0) as url:
        slow = _connect(url)
        t0 = time.monotonic()
        header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
        try:
            for byte in header:
                slow.sendall(bytes([byte]))
                time.sleep(0.02)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _closed_within(slow, 5.0) is not None
        assert time.monotonic() - t0 < 5.0


def test_a_slow_but_timely_request_and_a_long_answer_are_not_cut(backend):
    with InProcessGateway(backend, http_read_timeout_s=1.0) as url:
        sock = _connect(url)
        body = b'{"model": "fake", "prompt": "x", "max_tokens": 2}'
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode())
        time.sleep(0.5)
        sock.sendall(body)
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        # the keep-alive connection's next request gets a deadline of its own
        time.sleep(0.7)
        sock.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("path", ["/metrics", "/openapi.json", "/docs", "/redoc"])
def test_metrics_and_docs_can_need_the_key(backend, path):
    open_client = TestClient(build_app(backend, api_key="k"))
    assert open_client.get(path).status_code == 200
    private = TestClient(build_app(backend, api_key="k", private_docs_and_metrics=True))
    assert private.get(path).status_code == 401
    assert private.get(path, headers={"Authorization": "Bearer k"}).status_code == 200
    assert private.get("/health").status_code in (200, 503)  # probes stay open


def test_a_key_that_differs_only_in_its_last_byte_is_refused(backend):
    client = TestClient(build_app(backend, api_key="secret-key"))
    req = {"model": "fake", "prompt": "x", "max_tokens": 1}
    assert client.post("/v1/completions", json=req, headers={"Authorization": "Bearer secret-kez"}).status_code == 401
    assert client.post("/v1/completions", json=req, headers={"Authorization": "Bearer secret-key"}).status_code == 200


def test_an_in_process_gateway_freezes_the_heap_while_it_serves_as_serve_does(backend):
    """A full collection of a benchmark's heap (112k objects: 68-135 ms) would hold the
    gateway's loop; like ``llumnix serve``, the in-process gateway freezes what the process
    holds once it serves, and unfreezes it at the end."""
    import gc

    gc.unfreeze()
    kept = [[i] for i in range(1000)]  # tracked objects made before the gateway starts
    with InProcessGateway(backend) as url:
        assert gc.get_freeze_count() >= len(kept)
        r = httpx.post(f"{url}/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200
    assert gc.get_freeze_count() == 0
