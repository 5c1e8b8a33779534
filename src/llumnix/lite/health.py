"""An endpoint's health: passive signals (the requests' own failures) and active probes
eject it with an exponential backoff; a probe that succeeds once the backoff is over
re-admits it.

    HEALTHY --(eject_after request failures in a row, or as many probe failures,
               or a refused connection)--> EJECTED(until t)
    EJECTED --(t passed and a probe succeeds)--> HEALTHY     (next ejection: backoff x 2)
    HEALTHY --(a request succeeds)--> HEALTHY, request failures in a row reset; after a
                                      whole healthy backoff period the backoff resets too
    HEALTHY --(a probe succeeds)--> HEALTHY, probe failures in a row reset

Requests and probes count apart: a probe that answers proves the server is up, not that
its completions are sane, so it does not clear an engine whose requests keep failing
(one streaming ids outside the vocabulary would otherwise never be ejected while
requests came slower than probes).

Pure: ``now`` comes in, nothing here sleeps or dials.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthOptions:
    eject_after: int = 2
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0


class EndpointHealth:
    def __init__(self, options: HealthOptions | None = None) -> None:
        self.options = options or HealthOptions()
        self.ejected_until: float | None = None
        self.num_failures_in_row = 0
        """Requests that failed since the last that succeeded."""
        self.num_probe_failures_in_row = 0
        self.num_ejections = 0
        self._backoff = self.options.backoff_s
        self._healthy_since = 0.0
        self.last_error = ""

    @property
    def is_ejected(self) -> bool:
        return self.ejected_until is not None

    def can_serve(self) -> bool:
        """Dispatch may choose it (an ejected endpoint waits for a probe to come back)."""
        return self.ejected_until is None

    def on_success(self, now: float) -> None:
        self.num_failures_in_row = 0
        self._relax(now)

    def _relax(self, now: float) -> None:
        """After a whole backoff period healthy, the next ejection is short again."""
        if self.ejected_until is None and now - self._healthy_since >= self._backoff:
            self._backoff = self.options.backoff_s

    def on_failure(self, now: float, error: str, fatal: bool = False, probe: bool = False) -> bool:
        """A failed request (or ``probe``); ``fatal`` (a refused connection) ejects at
        once. Returns whether this ejected it."""
        self.last_error = error
        if probe:
            self.num_probe_failures_in_row += 1
        else:
            self.num_failures_in_row += 1
        if self.ejected_until is not None:
            self.ejected_until = max(self.ejected_until, now + self._backoff)
            return False
        in_row = max(self.num_failures_in_row, self.num_probe_failures_in_row)
        if not fatal and in_row < self.options.eject_after:
            return False
        self.ejected_until = now + self._backoff
        self.num_ejections += 1
        return True

    def on_probe(self, ok: bool, now: float, error: str = "") -> bool:
        """An active probe's answer. Returns whether it re-admitted the endpoint."""
        if not ok:
            self.on_failure(now, error or "probe failed", probe=True)
            return False
        self.num_probe_failures_in_row = 0
        if self.ejected_until is None:
            self._relax(now)
            return False
        if now < self.ejected_until:
            return False
        self.ejected_until = None
        self.num_failures_in_row = 0
        self._healthy_since = now
        self._backoff = min(self._backoff * 2, self.options.max_backoff_s)
        return True

    def summary(self, now: float) -> dict[str, object]:
        until = self.ejected_until
        return {"state": "ejected" if until is not None else "healthy",
                "ejected_for_s": None if until is None else round(max(0.0, until - now), 3),
                "num_ejections": self.num_ejections, "failures_in_row": self.num_failures_in_row,
                "probe_failures_in_row": self.num_probe_failures_in_row,
                "last_error": self.last_error}
