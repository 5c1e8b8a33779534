"""Each way a migration ends maps onto one of a few fixed codes, whether the driver set it
or only a text says why (a failed round reported by the instance actor)."""
from __future__ import annotations

import pytest

from llumnix.core.errors import InvalidRequestError, UnknownRequestError
from llumnix.migration import reasons
from llumnix.migration.protocol import MigrationConfig, MigrationProtocol
from llumnix.migration.transport import TransportError


class RayActorError(Exception):  # Ray's errors are told apart by class name: no Ray import
    pass


class ActorDiedError(RayActorError):
    pass


class GetTimeoutError(TimeoutError):
    pass


@pytest.mark.parametrize(("error", "code"), [
    (TransportError("connection reset"), reasons.TRANSPORT_ERROR),
    (ActorDiedError("The actor died"), reasons.DESTINATION_GONE),
    (GetTimeoutError("Get timed out"), reasons.TIMEOUT),
    (InvalidRequestError("x: 2 blocks reserved, 3 needed"), reasons.INSTALL_FAILED),
    (UnknownRequestError("no reservation for x"), reasons.INSTALL_FAILED),
    (ZeroDivisionError(), reasons.OTHER),
])
def test_an_exception_that_ended_a_migration_has_a_code(error, code):
    assert reasons.of_exception(error) == code


@pytest.mark.parametrize(("text", "code"), [
    ("destination refused to reserve blocks", reasons.REFUSED),
    ("the request finished, was aborted or was preempted", reasons.SOURCE_FINISHED),
    ("the request ended before its last stage", reasons.SOURCE_FINISHED),
    ("the queued request was scheduled or ended meanwhile", reasons.SOURCE_FINISHED),
    ("KeyError: 'cmpl-d6d6 is not on instance-1'", reasons.SOURCE_FINISHED),  # before the fix
    ("the destination refused the KV", reasons.KV_REFUSED),
    ("timeout", reasons.TIMEOUT),
    ("TransportError: peer closed", reasons.TRANSPORT_ERROR),
    ("GetTimeoutError: Get timed out: some object(s) not ready.", reasons.TIMEOUT),
    # InstanceActor.migrate_out's failed round (a call to the destination), and
    # LlumSched's repr of a source whose round died with it
    ("RayActorError: The actor died unexpectedly before finishing this task.", reasons.DESTINATION_GONE),
    ("ActorDiedError(cause=...)", reasons.SOURCE_GONE),
    ("something else entirely", reasons.OTHER),
    ("", reasons.OTHER),
])
def test_a_report_without_a_code_is_classified_by_its_text(text, code):
    assert reasons.of_report({"committed": False, "abort_reason": text}) == code


def test_a_reports_own_code_wins_over_its_text():
    assert reasons.of_report({"abort_code": reasons.KV_REFUSED, "abort_reason": "timeout"}) == reasons.KV_REFUSED
    # a code from some other version is not trusted as a label value
    assert reasons.of_report({"abort_code": "made-up", "abort_reason": "timeout"}) == reasons.TIMEOUT


def test_the_protocol_codes_its_own_aborts():
    p = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0)
    p.begin_stage([1, 2], 0.0)
    p.on_reserved(None, 0.1)
    assert p.report().abort_code == reasons.REFUSED and p.report().abort_reason.startswith("destination refused")
    p = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0)
    p.begin_stage([1, 2], 0.0)
    p.on_reserved([5, 6], 0.1)
    p.on_copied(0.2, request_alive=False, num_unsent_blocks=0)
    assert p.report().abort_code == reasons.SOURCE_FINISHED
    p = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0)
    p.abort("a transport said no", 0.1)
    assert p.report().abort_code == reasons.OTHER
    assert MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0).report().abort_code is None
