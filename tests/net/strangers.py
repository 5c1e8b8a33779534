"""Strangers at a port: connections that never prove the token, held idle or trickling a
byte at a time, reopened when the server closes them (as a patient attacker would)."""
from __future__ import annotations

import contextlib
import resource
import socket
import threading
from collections.abc import Iterator


def raise_fd_limit(want: int) -> None:
    """The soft limit on open files raised to ``want`` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


class Strangers:
    def __init__(self, address: tuple[str, int], num: int, *, trickle_s: float | None = None,
                 source: str | None = None) -> None:
        """``num`` connections to ``address`` (from ``source``, an address of this host);
        with ``trickle_s``, each sends one byte every ``trickle_s`` and is reopened when closed."""
        self.address, self.source = address, source
        self.socks = [self._open() for _ in range(num)]
        self.num_reopened = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if trickle_s is not None:
            self._thread = threading.Thread(target=self._trickle, args=(trickle_s,), daemon=True)
            self._thread.start()

    def _open(self) -> socket.socket:
        src = None if self.source is None else (self.source, 0)
        return socket.create_connection(self.address, timeout=10.0, source_address=src)

    def _trickle(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            for i, s in enumerate(self.socks):
                try:
                    s.send(b"x")
                except OSError:  # closed by the server (a deadline, a cap): come back
                    s.close()
                    with contextlib.suppress(OSError):
                        self.socks[i] = self._open()
                        self.num_reopened += 1

    def num_closed_by_server(self) -> int:
        """Connections the server has closed (read without waiting)."""
        n = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                while True:
                    data = s.recv(4096)
                    if not data:
                        n += 1
                        break
            except BlockingIOError:
                pass
            except OSError:
                n += 1
            finally:
                s.setblocking(True)
        return n

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        for s in self.socks:
            s.close()

    def __enter__(self) -> Strangers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def dripping(sock: socket.socket, every_s: float = 0.05) -> Iterator[None]:
    """``sock`` sends a byte every ``every_s`` until the block ends or the peer closes it:
    each read the server makes is prompt, the whole answer never comes in time."""
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(every_s):
            try:
                sock.send(b"x")
            except OSError:
                return

    threading.Thread(target=drip, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def closed_by_peer(sock: socket.socket, within: float = 5.0) -> bool:
    """Whether the peer closes ``sock`` within ``within`` seconds (what it sent first is skipped)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
