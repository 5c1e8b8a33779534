"""The hot path's builders write every field of their object as the class call would."""
from __future__ import annotations

import dataclasses

import pytest

from llumnix.core.batch import (
    DecodeBatch,
    ModelOutput,
    RequestMetrics,
    RequestOutput,
    SchedulerOutput,
    decode_output,
    timed_output,
    token_output,
)
from llumnix.core.request import Request
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.status import RequestBrief, request_brief


def _fields(obj: object) -> dict[str, object]:
    """Every field's value; a slot a builder left unwritten raises AttributeError."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


METRICS = RequestMetrics(arrival_time=1.0, first_scheduled_time=1.5, first_token_time=2.0, finish_time=3.0,
                         num_prompt_tokens=10, num_output_tokens=4, num_preemptions=0, preemption_loss=0.0,
                         priority=1)


@pytest.mark.parametrize("finish_reason, stop_reason, metrics", [
    (None, None, None),
    ("stop", 7, METRICS),
    ("length", "END", METRICS),
])
def test_token_output_is_the_class_call(finish_reason: str | None, stop_reason: int | str | None,
                                        metrics: RequestMetrics | None) -> None:
    built = token_output("r-1", 42, 3, finish_reason, stop_reason, metrics, "gw-a", 2)
    called = RequestOutput("r-1", [42], 3, finish_reason, None, stop_reason, metrics, "gw-a", 2)
    assert type(built) is RequestOutput
    assert _fields(built) == _fields(called)
    assert built == called
    assert built.is_finished == (finish_reason is not None)


def test_token_outputs_do_not_share_their_token_list() -> None:
    a, b = token_output("a", 1, 1, None, None, None, "", 0), token_output("b", 1, 1, None, None, None, "", 0)
    a.new_token_ids.append(2)
    assert b.new_token_ids == [1]


@pytest.mark.parametrize("running, migrating", [(True, False), (False, True)])
def test_request_brief_is_the_class_call(running: bool, migrating: bool) -> None:
    built = request_brief("r-2", 1, 5, 70, 0.25, running, migrating, 6, "batch")
    called = RequestBrief("r-2", 1, 5, 70, 0.25, running, migrating, 6, "batch")
    assert type(built) is RequestBrief
    assert _fields(built) == _fields(called)
    assert built == called
    assert dataclasses.replace(built, num_blocks=6) == dataclasses.replace(called, num_blocks=6)


def test_decode_output_is_the_class_calls() -> None:
    reqs = [Request("a", [1, 2, 3], SamplingParams(max_tokens=4), 0.0, output_token_ids=[9]),
            Request("b", [4, 5], SamplingParams(max_tokens=4), 0.5)]
    tables, starts, outs = [[0], [1]], [3, 1], [1, 0]
    built = decode_output(reqs, tables, starts, outs, ["c"])
    called = SchedulerOutput(None, is_prefill=False, preempted_request_ids=["c"],
                             decode=DecodeBatch(reqs, tables, starts, outs))
    assert type(built) is SchedulerOutput and type(built.decode) is DecodeBatch
    assert _fields(built) == _fields(called)
    assert _fields(built.decode) == _fields(called.decode)
    assert built.request_ids == ["a", "b"] and built.num_entries == 2 and not built.is_empty
    assert [dataclasses.astuple(e) for e in built.scheduled] == [dataclasses.astuple(e) for e in called.scheduled]


def test_timed_output_is_the_class_call() -> None:
    built = timed_output([0, 0, 0], 0.125)
    called = ModelOutput([0, 0, 0], elapsed=0.125)
    assert type(built) is ModelOutput
    assert _fields(built) == _fields(called)
    assert built == called


def test_a_field_the_builders_do_not_write_fails_here() -> None:
    """What the two tests above rely on: a slot never written reads as an error, not a default."""
    blank = object.__new__(RequestBrief)
    with pytest.raises(AttributeError):
        _fields(blank)
