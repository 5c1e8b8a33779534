"""Headless Chromium driven over the DevTools protocol, with a websocket client of the
standard library (text frames, client masking): enough to open a page, read its DOM
with ``evaluate``, take a screenshot and collect its console errors, without adding a
browser-automation dependency."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import urlopen


def chromium() -> str | None:
    """Debian's ``chromium`` (``.ci/run`` installs it), or another name for it; None if absent."""
    return next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)


class DevTools:
    """One page target's DevTools session. Events that arrive while a call waits for its
    answer are kept in ``events``."""

    def __init__(self, ws_url: str, timeout_s: float = 30.0) -> None:
        u = urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                          .encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self._exact(1)  # a byte at a time: nothing of the first frame is read here
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"no websocket: {head[:200]!r}")
        self.num_calls = 0
        self.events: list[dict[str, Any]] = []

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            buf += chunk
        return bytes(buf)

    def _send(self, text: str) -> None:
        data = text.encode()
        n = len(data)
        size = bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 1 << 16
                                                  else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i & 3] for i, b in enumerate(data))
        self.sock.sendall(bytes([0x81]) + size + mask + masked)

    def _receive(self) -> dict[str, Any]:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._exact(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._exact(8))
            payload = self._exact(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise ConnectionError("DevTools closed the websocket")
            if opcode in (0, 1, 2):
                parts.append(payload)
                if b0 & 0x80:
                    message: dict[str, Any] = json.loads(b"".join(parts))
                    return message

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.num_calls += 1
        self._send(json.dumps({"id": self.num_calls, "method": method, "params": params}))
        while True:
            msg = self._receive()
            if msg.get("id") == self.num_calls:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result
            self.events.append(msg)

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and the browser's error log entries
        (a resource that failed to load) seen so far."""
        self.evaluate("0")  # takes in the events sent before now
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:500])
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(json.dumps(p.get("args"))[:500])
            elif e.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"{p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out


@contextlib.contextmanager
def headless_page(exe: str, profile: Path, width: int = 1280, height: int = 1400) -> Iterator[DevTools]:
    """A headless Chromium with one blank page, its DevTools session open (runtime, page and
    log events on); the browser is stopped at the end."""
    proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--no-first-run", "--disable-extensions", "--remote-debugging-port=0",
                             f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and active.read_text().count("\n") >= 1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        with urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            target = next(t for t in json.load(r) if t["type"] == "page")
        page = DevTools(target["webSocketDebuggerUrl"])
        for domain in ("Runtime", "Page", "Log"):
            page.call(f"{domain}.enable")
        yield page
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """``check()``'s first truthy value, polled every ``every_s``; the test fails naming
    ``what`` if none comes within ``timeout_s``."""
    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s")
        time.sleep(every_s)
