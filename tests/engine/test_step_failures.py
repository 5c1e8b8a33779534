"""A step that raises fails only the requests it concerns; the engine goes on."""
from __future__ import annotations

import pytest

from llumnix.core.batch import ModelOutput, SchedulerOutput
from llumnix.core.sampling_params import SamplingParams
from llumnix.engine.engine_core import MAX_FAILED_STEPS, EngineFailedError
from tests.engine.helpers import make_engine, run_to_completion
from tests.fakes import TokenCacheExecutor


class PoisonedExecutor(TokenCacheExecutor):
    """Raises on any batch that holds a poisoned request, as torch.multinomial did on
    a NaN row: the whole step fails, not only that request's row."""

    def __init__(self, *args, poison: set[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.poison = poison
        self.num_raised = 0

    def execute(self, batch: SchedulerOutput) -> ModelOutput:
        if any(r.request_id in self.poison for r in batch.scheduled):
            self.num_raised += 1
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return super().execute(batch)


def _engine(poison: set[str], chunked: bool = False, prefix_caching: bool = False):
    eng = make_engine(num_blocks=64, block_size=4, max_num_seqs=8, chunked=chunked, max_batched=16 if chunked else 256,
                      prefix_caching=prefix_caching)
    eng.executor = PoisonedExecutor(64, 4, poison=poison)
    return eng


def _add(eng, n: int) -> None:
    for i in range(n):
        eng.add_request(f"r{i}", [1 + i, 2, 3, 4, 5 + i] * (1 + i % 3), SamplingParams(max_tokens=6 + i))


@pytest.mark.parametrize(("chunked", "prefix_caching"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("poison", [{"r3"}, {"r0", "r5"}, {"r0", "r1", "r2", "r3", "r4", "r5", "r6"}])
def test_only_the_poisoned_requests_fail_and_the_rest_match_a_clean_run(poison, chunked, prefix_caching):
    clean = _engine(set(), chunked, prefix_caching)
    _add(clean, 8)
    want = run_to_completion(clean)

    eng = _engine(poison, chunked, prefix_caching)
    _add(eng, 8)
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
        eng.check_invariants()
    failed = {o.request_id for o in outs if o.finish_reason == "error"}
    assert failed == poison
    assert all(o.error and "RuntimeError" in o.error and "nan" not in o.error for o in outs if o.request_id in failed)
    got: dict[str, list[int]] = {}
    for o in outs:
        got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert {r: t for r, t in got.items() if r not in poison} == {r: t for r, t in want.items() if r not in poison}
    assert eng.kv.num_free_blocks == eng.kv.num_total_blocks or prefix_caching
    assert not eng.kv.has("r3") and eng.num_failed_requests == len(poison)


def test_an_engine_that_fails_every_request_raises_after_a_few_steps():
    eng = _engine(set())
    eng.executor.poison = {f"r{i}" for i in range(20)}
    for i in range(20):
        eng.add_request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=4))
    with pytest.raises(EngineFailedError):
        for _ in range(20):
            eng.step()
    assert eng.num_failed_requests >= MAX_FAILED_STEPS
