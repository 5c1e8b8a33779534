"""The ``predicted-slo`` scorer: place a request where it meets its class's objectives with
the most slack, without pushing the requests already there past theirs.

Per candidate, with the predictions of ``policy/slo_predict.py``: the request's slack on
TTFT and on TPOT (1 - predicted / objective), and the running requests' slack on TPOT
after it joins (against the tightest objective among their classes). A candidate where
every slack is >= 0 scores 0.5 + half the smallest slack (in [0.5, 1]); one where some
is negative scores below 0.5, the less the more they miss by, so when no instance can
meet the objectives the request queues at the least-bad one (the class's rule: a class
with a ``shed_share`` may be refused instead, ``should_shed``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llumnix.core.errors import LlumnixError
from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig
from llumnix.policy.freeness import queue_aware_freeness
from llumnix.policy.slo import SLOClass
from llumnix.policy.slo_predict import SLOPredictor

MEETS = 0.5
"""Score at and above which a candidate is predicted to meet every objective."""


@dataclass
class SLODispatch:
    """What the scorer reads about the request being dispatched (``DispatchContext.slo``)."""

    predictor: SLOPredictor
    slo_class: SLOClass
    priority: int
    num_prompt_tokens: int


def candidate_score(s: InstanceStatus, req: SLODispatch, now: float, *, expected: bool = False) -> float:
    """``expected``: by the TTFT and TPOT to expect (a shed decision: would it miss?), not by
    the conservative ones dispatch ranks by (taking nothing from anyone, the whole queue in
    the batch)."""
    pred = req.predictor
    load = pred.load(s)
    cls = req.slo_class
    tpot = pred.tpot(load, req.num_prompt_tokens, now, expected=expected)
    ttft = pred.ttft(load, req.num_prompt_tokens, req.priority, now + cls.ttft_s,
                     objective_s=cls.ttft_s if expected else None)
    own = min(1.0 - ttft / cls.ttft_s, 1.0 - tpot / cls.tpot_s)
    # the requests already there: a constraint, not a ranking (else a loose class avoids
    # every instance that runs a tight one, and piles up where none does)
    others = 1.0 - tpot / load.tightest_tpot_s if load.tightest_tpot_s is not None else 0.0
    if own >= 0.0 and others >= 0.0:
        return MEETS + 0.5 * min(1.0, own)
    return MEETS / (1.0 - min(0.0, own) - min(0.0, others))


def slo_scores(cands: list[InstanceStatus], req: SLODispatch | None, now: float,
               freeness: FreenessConfig | None = None) -> list[float]:
    """One score per candidate (all 1 without an SLO context: the scorer then does not decide).
    With ``freeness``, the candidates that meet every objective rank by queue-aware freeness
    instead of slack (0.5 + half the min-max normalized freeness)."""
    if req is None:
        return [1.0] * len(cands)
    scores = [candidate_score(s, req, now) for s in cands]
    if freeness is None:
        return scores
    meets = [i for i, v in enumerate(scores) if v >= MEETS]
    if len(meets) > 1:
        fs = [queue_aware_freeness(cands[i], freeness) for i in meets]
        lo, hi = min(fs), max(fs)
        for i, f in zip(meets, fs, strict=True):
            scores[i] = MEETS + 0.5 * ((f - lo) / (hi - lo) if hi > lo else 1.0)
    return scores


class RequestShedError(LlumnixError):
    """Dispatch refused a request early: no instance meets its class's objectives and the
    class may shed (the gateway answers 429 with ``Retry-After``)."""

    def __init__(self, slo_class: str, retry_after_s: int) -> None:
        super().__init__(f"no instance can meet slo_class {slo_class!r} now; retry after {retry_after_s} s")
        self.slo_class = slo_class
        self.retry_after_s = retry_after_s


class ShedBook:
    """Per class: requests dispatch saw and those it shed, for the class's shed share."""

    def __init__(self) -> None:
        self.num_seen: dict[str, int] = {}
        self.num_shed: dict[str, int] = {}

    def check(self, req: SLODispatch, chosen: InstanceStatus, now: float) -> None:
        """Count the request; raise ``RequestShedError`` if it is to be shed rather than sent to ``chosen``."""
        name = req.slo_class.name
        seen, shed = self.num_seen.get(name, 0), self.num_shed.get(name, 0)
        self.num_seen[name] = seen + 1
        if req.slo_class.shed_share <= 0.0 or not should_shed(candidate_score(chosen, req, now, expected=True),
                                                               req.slo_class, shed, seen):
            return
        self.num_shed[name] = shed + 1
        pred = req.predictor
        wait = pred.ttft(pred.load(chosen), req.num_prompt_tokens, req.priority, now + req.slo_class.ttft_s,
                         objective_s=req.slo_class.ttft_s)
        raise RequestShedError(name, max(1, math.ceil(wait - req.slo_class.ttft_s)))


def should_shed(best_score: float, slo_class: SLOClass, num_shed: int, num_seen: int) -> bool:
    """Refuse the request early: no instance meets its objectives and its class may still
    shed (fewer than ``shed_share`` of its requests so far, this one counted)."""
    return best_score < MEETS and num_shed + 1 <= slo_class.shed_share * (num_seen + 1)
