"""The TCP transport's socket mode: blocking calls whose timeouts the kernel keeps."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from llumnix.migration.tcp_transport import _kernel_timeout, _recv_exact


def test_a_stalled_payload_times_out_in_the_kernel():
    a, b = socket.socketpair()
    with a, b:
        _kernel_timeout(a, 0.2)
        b.sendall(b"12345")  # half of what the frame promised, then nothing
        buf = bytearray(10)
        t0 = time.monotonic()
        with pytest.raises(OSError):
            _recv_exact(a, memoryview(buf))
        assert 0.15 < time.monotonic() - t0 < 5.0
        assert bytes(buf[:5]) == b"12345"


def test_without_a_timeout_a_receive_waits_for_the_whole_view():
    a, b = socket.socketpair()
    with a, b:
        _kernel_timeout(a, None)

        def slow_peer() -> None:
            for piece in (b"abc", b"defg", b"hij"):
                time.sleep(0.1)
                b.sendall(piece)

        t = threading.Thread(target=slow_peer)
        t.start()
        buf = bytearray(10)
        _recv_exact(a, memoryview(buf))
        t.join()
        assert bytes(buf) == b"abcdefghij"


def test_a_closed_peer_is_an_error_not_a_hang():
    from llumnix.migration.tcp_transport import TransportError

    a, b = socket.socketpair()
    with a:
        _kernel_timeout(a, 5.0)
        b.sendall(b"xy")
        b.close()
        with pytest.raises(TransportError):
            _recv_exact(a, memoryview(bytearray(4)))


def test_vectored_send_and_receive_move_many_views_in_order():
    import numpy as np

    from llumnix.migration.tcp_transport import _recv_views, _send_views

    # 3,000 small views (more than one sendmsg / recvmsg_into can take), uneven sizes
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 200, size=3000)
    src = rng.integers(0, 256, size=int(sizes.sum()), dtype=np.uint8)
    dst = np.zeros_like(src)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    out = [memoryview(src[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    into = [memoryview(dst[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    a, b = socket.socketpair()
    with a, b:
        _kernel_timeout(a, 5.0)
        _kernel_timeout(b, 5.0)
        t = threading.Thread(target=_send_views, args=(a, out))
        t.start()
        _recv_views(b, into)
        t.join()
    assert np.array_equal(src, dst)


def test_views_of_wider_items_count_bytes():
    import numpy as np

    from llumnix.migration.tcp_transport import _recv_views, _send_views

    src = np.arange(1000, dtype=np.float32)
    dst = np.zeros_like(src)
    a, b = socket.socketpair()
    with a, b:
        t = threading.Thread(target=_send_views, args=(a, [memoryview(src[:300]), memoryview(src[300:])]))
        t.start()
        _recv_views(b, [memoryview(dst[:700]), memoryview(dst[700:])])
        t.join()
    assert np.array_equal(src, dst)
