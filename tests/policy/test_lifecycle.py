"""The instance lifecycle: which transitions the machine allows, and what it remembers."""
from __future__ import annotations

import pytest

from llumnix.policy.lifecycle import InstanceState as S
from llumnix.policy.lifecycle import Lifecycles


def test_the_normal_life_of_an_instance():
    lc = Lifecycles()
    assert lc.move("i", S.STARTING, 0.0) and lc.move("i", S.SERVING, 5.0)
    assert lc.move("i", S.TERMINATING, 6.0, "drain") and lc.get("i").reason == "drain"
    assert lc.move("i", S.SERVING, 7.0)  # undrain
    assert lc.move("i", S.TERMINATING, 8.0, "scale-in") and lc.move("i", S.RETIRED, 9.0)
    assert lc.get("i").since == 9.0 and lc.is_gone("i")


@pytest.mark.parametrize(("path", "bad"), [
    ([S.SERVING, S.FAILED], S.SERVING),         # a late report of a dead instance revives nothing
    ([S.SERVING, S.TERMINATING, S.RETIRED], S.TERMINATING),
    ([S.SERVING], S.RETIRED),                   # stopped only after draining
    ([S.SERVING], S.STARTING),
    ([], S.RETIRED),
])
def test_transitions_the_machine_refuses(path, bad):
    lc = Lifecycles()
    for t, s in enumerate(path):
        assert lc.move("i", s, float(t))
    before = lc.get("i")
    assert not lc.move("i", bad, 99.0) and lc.get("i") == before


def test_a_registration_restarts_whatever_came_before_and_gone_ids_stay_taken():
    lc = Lifecycles(keep_gone=2)
    for i in range(4):
        lc.move(f"i{i}", S.SERVING, 0.0)
        lc.move(f"i{i}", S.FAILED, 1.0, "killed")
    assert lc.all_ids() == ["i2", "i3"]  # the oldest gone ones are forgotten past keep_gone
    lc.restart("i3", 2.0)
    assert lc.state("i3") == S.SERVING and lc.ids(S.SERVING) == ["i3"]
