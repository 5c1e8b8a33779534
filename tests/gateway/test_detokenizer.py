from __future__ import annotations

from llumnix.gateway.detokenizer import IncrementalDetokenizer


class BytesTok:
    """Token i is byte i: multi-byte characters span several tokens."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def _stream(text: str, stop=()):
    det = IncrementalDetokenizer(BytesTok(), stop)
    ids = list(text.encode())
    pieces = [det.add([t]) for t in ids]
    pieces.append(det.add([], final=True))
    return pieces, det


def test_pieces_join_to_the_text_and_never_split_a_character():
    pieces, det = _stream("héllo wörld ✓")
    assert "".join(pieces) == "héllo wörld ✓" == det.text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_is_cut_and_never_leaked():
    pieces, det = _stream("one two STOP three", stop=("STOP",))
    assert "".join(pieces) == "one two " and det.stopped
    assert not any("S" in p for p in pieces)


def test_earliest_of_several_stops_wins():
    pieces, _ = _stream("abc;def.", stop=(".", ";"))
    assert "".join(pieces) == "abc"


def test_min_tokens_keeps_early_stops_in_the_text():
    det = IncrementalDetokenizer(BytesTok(), ("ab",), min_tokens=4)
    pieces = [det.add([t]) for t in b"abxabyab"]
    pieces.append(det.add([], final=True))
    # "ab" ending at the 2nd token is too early; the one ending at the 5th counts
    assert "".join(pieces) == "abx" and det.stopped
    det = IncrementalDetokenizer(BytesTok(), ("ab",), min_tokens=2)
    assert "".join([det.add([t]) for t in b"abab"] + [det.add([], final=True)]) == ""  # ends at the 2nd: counts
