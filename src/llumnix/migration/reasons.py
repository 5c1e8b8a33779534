"""Why a migration aborted, as one of a few fixed codes: what ``/metrics`` counts
(``llumnix:migration_aborts_total{reason=...}``) and ``/admin/cluster`` sums. The report's
``abort_reason`` keeps the full text for a person; the code is for counting, so it never
carries an id or a message.

The driver sets the code where it knows it (``MigrationReport.abort_code``); a report
without one (a failed round reported by the instance actor, an older report) is classified
by its text."""
from __future__ import annotations

import re
from typing import Any

from llumnix.core.errors import InvalidRequestError, UnknownRequestError

REFUSED = "refused"
"""The destination would not reserve blocks for the request (no room under its watermark)."""
SOURCE_FINISHED = "source_finished"
"""The request left the state it was being migrated in on the source, before or during the
migration: it finished, was aborted or preempted, or (queued) was scheduled there."""
KV_REFUSED = "kv_refused"
"""The destination refused a KV write (its reservation had lapsed)."""
TRANSPORT_ERROR = "transport_error"
"""The KV channel failed (connection reset, bad frame)."""
DESTINATION_GONE = "destination_gone"
"""The destination's actor died or could not be reached."""
SOURCE_GONE = "source_gone"
"""The source's migration round failed as a whole (its actor died)."""
INSTALL_FAILED = "install_failed"
"""The destination would not install the request (nothing reserved for it, too few blocks)."""
TIMEOUT = "timeout"
"""The migration ran past ``MigrationConfig.timeout_s``, or a call to the destination timed out."""
OTHER = "other"
"""Anything else (the report's text says what)."""

ALL = (REFUSED, SOURCE_FINISHED, KV_REFUSED, TRANSPORT_ERROR, DESTINATION_GONE, SOURCE_GONE,
       INSTALL_FAILED, TIMEOUT, OTHER)

_ACTOR_GONE = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "RaySystemError",
               "NodeDiedError", "OwnerDiedError")
"""Ray's errors for an actor (or its node) that is no longer there, by class name: the
migration package does not import Ray."""

_TEXTS = (("destination refused to reserve", REFUSED), ("destination reserved the wrong", OTHER),
          ("the request finished", SOURCE_FINISHED), ("the request ended", SOURCE_FINISHED),
          ("the queued request was scheduled", SOURCE_FINISHED), ("is not on ", SOURCE_FINISHED),
          ("the destination refused the KV", KV_REFUSED))
"""The driver's and the protocol's own texts, for reports that carry no code."""


def of_exception(e: BaseException) -> str:
    """The code of an exception that ended a migration (raised by a transport, by a call
    to the destination, or by its install)."""
    names = [c.__name__ for c in type(e).__mro__]
    if "TransportError" in names:
        return TRANSPORT_ERROR
    if any(n.startswith(_ACTOR_GONE) for n in names):
        return DESTINATION_GONE
    if "GetTimeoutError" in names or isinstance(e, TimeoutError):
        return TIMEOUT
    if isinstance(e, (InvalidRequestError, UnknownRequestError)):
        return INSTALL_FAILED
    return OTHER


def of_report(report: dict[str, Any]) -> str:
    """An aborted report's code: its own, else one read from its text. The instance actor
    reports a round that failed on a call to the destination as ``"Name: message"`` and a
    source that died under its round as ``repr(error)``, ``"Name(...)"``."""
    code = report.get("abort_code")
    if isinstance(code, str) and code in ALL:
        return code
    text = str(report.get("abort_reason") or "")
    if text == "timeout":
        return TIMEOUT
    for needle, c in _TEXTS:
        if needle in text:
            return c
    m = re.match(r"(\w+)([:(])", text)
    if m is None:
        return OTHER
    name, sep = m.groups()
    if name.startswith(_ACTOR_GONE):
        return SOURCE_GONE if sep == "(" else DESTINATION_GONE
    if name == "TransportError" or name.endswith("TransportError"):
        return TRANSPORT_ERROR
    if name in ("GetTimeoutError", "TimeoutError"):
        return TIMEOUT
    return OTHER
