"""How a gloo pair forms without a port for strangers: a store per group in each process
(``PairStore``), whose halves the two sides swap over a channel they already trust, the
group formed on its own thread (``FormingGroup``), and the mutual proof of the cluster
token each group runs over its own connection before any frame (``prove_as_source``,
``prove_as_destination``).

The proof is bound to each side's role, so a peer cannot answer the source's challenge
by handing it back (a reflection): the source only ever computes ``HMAC(token, "src" n)``
and accepts only ``HMAC(token, "dst" n_s)``.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import Store  # type: ignore[attr-defined]

from llumnix.migration.transport import TransportError

NONCE = 32
_MAC = 32
MAX_HALF_KEYS = 8
"""A peer's half of a rendezvous: at most this many keys (gloo sets one a rank)..."""
MAX_HALF_BYTES = 4096
"""...of at most this many bytes each (a rank's address is about 300)."""

Send = Callable[[bytes], None]
Recv = Callable[[int], bytes]


def _mac(token: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, b"llumnix-gloo/" + role + b"/" + nonce, hashlib.sha256).digest()


def prove_as_source(send: Send, recv: Recv, token: bytes) -> None:
    """The source's side of the proof: the peer proves the token before this side
    computes anything for it."""
    mine = os.urandom(NONCE)
    send(mine)
    answer = recv(NONCE + _MAC)
    theirs, mac = answer[:NONCE], answer[NONCE:]
    if not hmac.compare_digest(mac, _mac(token, b"dst", mine)):
        raise TransportError("the gloo peer does not hold the cluster token")
    send(_mac(token, b"src", theirs))


def prove_as_destination(send: Send, recv: Recv, token: bytes) -> None:
    theirs = recv(NONCE)
    mine = os.urandom(NONCE)
    send(mine + _mac(token, b"dst", theirs))
    if not hmac.compare_digest(recv(_MAC), _mac(token, b"src", mine)):
        raise TransportError("the gloo peer does not hold the cluster token")


class PairStore(Store):
    """One group's rendezvous store, in this process: the keys this rank sets are its
    half (``half()``); the peer's half arrives with ``join()``; a get or wait blocks
    until its keys are here, the timeout, or ``abandon()``."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self._timeout_s = timeout_s
        self._keys: dict[str, bytes] = {}
        self._mine: dict[str, bytes] = {}
        self._cv = threading.Condition()
        self._abandoned = False

    def half(self) -> dict[str, bytes]:
        """This rank's keys, once its group has set them."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._mine or self._abandoned, self._timeout_s) or self._abandoned:
                raise TransportError("gloo: this side's group never offered its address")
            return dict(self._mine)

    def join(self, half: Any) -> None:
        """The peer's half (checked: a few short keys this rank did not set)."""
        if not isinstance(half, dict) or not 0 < len(half) <= MAX_HALF_KEYS or not all(
                isinstance(k, str) and isinstance(v, bytes) and len(v) <= MAX_HALF_BYTES for k, v in half.items()):
            raise TransportError("gloo: the peer's rendezvous half is malformed")
        with self._cv:
            if set(half) & set(self._mine):
                raise TransportError("gloo: the peer's rendezvous half claims this side's keys")
            self._keys.update(half)
            self._cv.notify_all()

    def abandon(self) -> None:
        """Wake every wait with an error: the pair will not form."""
        with self._cv:
            self._abandoned = True
            self._cv.notify_all()

    # -- what torch calls (from the group's constructor) -------------------------------
    def set(self, key: str, value: Any) -> None:
        with self._cv:
            self._keys[key] = self._mine[key] = bytes(value)
            self._cv.notify_all()

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self._keys[key]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        limit = self._timeout_s if timeout is None else timeout.total_seconds()
        with self._cv:
            if not self._cv.wait_for(lambda: self._abandoned or all(k in self._keys for k in keys), limit) \
                    or self._abandoned:
                raise RuntimeError(f"gloo rendezvous: no {keys} from the peer")

    def check(self, keys: list[str]) -> bool:
        with self._cv:
            return all(k in self._keys for k in keys)

    def add(self, key: str, value: int) -> int:
        with self._cv:
            n = int(self._keys.get(key, b"0")) + value
            self._keys[key] = str(n).encode()
            return n

    def delete_key(self, key: str) -> bool:
        with self._cv:
            self._mine.pop(key, None)
            return self._keys.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self._keys)

    def clone(self) -> PairStore:
        return self  # a copy would be a new Python object torch could outlive

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()


class FormingGroup:
    """A two-rank gloo group forming on its own thread (its constructor blocks until the
    peer connects), over a ``PairStore`` kept alive as long as the group."""

    def __init__(self, name: str, host: str, rank: int, timeout_s: float) -> None:
        self.store = PairStore(timeout_s)
        self._timeout_s = timeout_s
        self._done = threading.Event()
        self._group: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._form, args=(host, rank), daemon=True, name=f"gloo-form-{name}").start()

    def _form(self, host: str, rank: int) -> None:
        try:
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._timeout = datetime.timedelta(seconds=self._timeout_s)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
            self._group = dist.ProcessGroupGloo(self.store, rank, 2, opts)
        except Exception as e:  # noqa: BLE001 - handed to whoever waits for the group
            self._error = e
        finally:
            self._done.set()

    def group(self) -> Any:
        """The formed group (a ``TransportError`` if it did not form in time)."""
        if not self._done.wait(self._timeout_s + 1.0):
            self.store.abandon()
            raise TransportError("gloo: the pair's group did not form in time")
        if self._error is not None:
            raise TransportError(f"gloo: {self._error}") from self._error
        return self._group
