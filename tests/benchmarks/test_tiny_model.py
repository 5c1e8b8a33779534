"""The paced cluster's tiny model (benchmarks/cluster/tiny_model.py): greedy decoding picks
printable ASCII whatever the hidden state, so the gateway never holds its text back."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")


def test_the_printable_head_makes_greedy_tokens_printable():
    from benchmarks.cluster.tiny_model import byte_tokenizer_json, printable_head

    vocab = byte_tokenizer_json()["model"]["vocab"]
    head = printable_head(vocab, 64, 257)
    printable = {i for ch, i in vocab.items() if len(ch) == 1 and "!" <= ch <= "~"}
    assert len(printable) == 94
    torch.manual_seed(1)
    picks = (torch.randn(5000, 64) @ head.T).argmax(dim=1)
    assert set(picks.tolist()) <= printable and len(set(picks.tolist())) > 40
    assert not head[[i for i in range(257) if i not in printable]].any()
