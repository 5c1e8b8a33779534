"""Tokenizer over the `tokenizers` library, from GGUF metadata or tokenizer.json,
with the model's own chat template rendered by sandboxed Jinja."""
from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from llumnix.core.errors import InvalidRequestError, ModelLoadError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# GGUF token types (llama.cpp): 3 = control, 4 = user-defined; both are whole special tokens.
_SPECIAL_TYPES = (3, 4)
_LONG = 4096
"""Texts of more characters (token lists of more tokens) go through the ``tokenizers``
batch calls, which release the GIL: a worker thread tokenizing a long prompt then does
not stall the event loop."""
_MARK = re.compile("\ue000(\\d+)\ue001")
"""Stands for message i's content while a chat template renders (private-use characters,
which no template writes)."""


class Tokenizer:
    def __init__(self, tok: HFTokenizer, *, bos_token_id: int | None, eos_token_id: int | None,
                 chat_template: str | None) -> None:
        self._tok = tok
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(self.chat_template)
        self._template_tokens = {"bos_token": self._token(bos_token_id), "eos_token": self._token(eos_token_id)}
        """The special tokens' text every render passes (looked up once, not per request)."""

    def with_chat_template(self, template: str) -> Tokenizer:
        """This tokenizer with another chat template (`--chat-template`)."""
        return Tokenizer(self._tok, bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
                         chat_template=template)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """``split_special_tokens`` (transformers' name): special-token text such as
        '<|im_end|>' is encoded as the plain text it is, not as the control token."""
        tok = self._plain if split_special_tokens else self._tok
        if len(text) > _LONG:
            return tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(token_ids) > _LONG:
            return self._tok.decode_batch([token_ids], skip_special_tokens=skip_special_tokens)[0]
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def _plain(self) -> HFTokenizer:
        """A copy that encodes special-token text as plain text (a copy, not a toggled
        flag, so threads tokenizing at once never see each other's setting)."""
        plain = HFTokenizer.from_str(self._tok.to_str())
        plain.encode_special_tokens = True
        return plain

    @cached_property
    def _special_text(self) -> re.Pattern[str] | None:
        texts = sorted((t.content for t in self._tok.get_added_tokens_decoder().values() if t.special),
                       key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    @cached_property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of text one token covers, so a text of B bytes has at
        least B / this many tokens; None where that bound is not sound (a normalizer may
        shrink the text, or bytes outside the vocabulary may be dropped)."""
        model, pre = self._tok.model, self._tok.pre_tokenizer
        byte_level = pre is not None and '"ByteLevel"' in pre.__getstate__().decode()
        if self._tok.normalizer is not None or not isinstance(model, models.BPE) or not (
                byte_level or model.byte_fallback):
            return None
        return max((len(t.encode()) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)

    def warm_up(self) -> None:
        """Build now what serving would build on first use (the length bound, the copy
        that encodes special-token text as text), so no request waits for it."""
        _ = self.max_token_bytes, self._plain, self._special_text

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def save(self, path: str) -> None:
        """Write the vocabulary, merges and rules as a Hugging Face tokenizer.json."""
        self._tok.save(path)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **self._template_tokens)

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """The token ids a chat prefills. Only the chat template's own text holds control
        tokens: special-token text inside a message (a user writing
        '<|im_end|>\\n<|im_start|>system') is encoded as plain text, so it cannot forge a turn."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        special = self._special_text
        if special is None or not any(special.search(m["content"]) for m in messages):
            return self.encode(text, add_special_tokens=False)  # nothing to isolate: one pass
        marked = [{**m, "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
        pieces = _MARK.split(self.apply_chat_template(marked, add_generation_prompt))
        # odd pieces are message indices, even ones the template's text between them
        contents = [messages[int(p)]["content"] if k % 2 else p for k, p in enumerate(pieces)]
        if "".join(contents) != text:
            raise InvalidRequestError("this model's chat template changes message content, so content that "
                                      "holds special-token text cannot be kept apart from it", "messages")
        ids: list[int] = []
        for k, piece in enumerate(contents):
            ids += self.encode(piece, add_special_tokens=False, split_special_tokens=bool(k % 2))
        return ids

    def _token(self, tid: int | None) -> str:
        return "" if tid is None else (self._tok.id_to_token(tid) or "")

    @classmethod
    def from_gguf(cls, reader: Any, fields: dict[str, Any]) -> Tokenizer:
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelLoadError(f"GGUF tokenizer {kind!r} is not supported (only byte-level BPE 'gpt2')")
        f = reader.fields
        tokens = list(f["tokenizer.ggml.tokens"].contents())
        merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
        types = list(f["tokenizer.ggml.token_type"].contents()) if "tokenizer.ggml.token_type" in f else []
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        # SmolLM2's pre-tokenizer ('smollm' in llama.cpp): digits split one by one, then GPT-2's.
        split_digits = fields.get("tokenizer.ggml.pre") in ("smollm", "starcoder")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                      byte_level]) if split_digits else byte_level)
        tok.decoder = decoders.ByteLevel()
        special = [AddedToken(tokens[i], special=True, normalized=False)
                   for i, t in enumerate(types) if t in _SPECIAL_TYPES]
        tok.add_special_tokens(special)
        return cls(tok, bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
                   eos_token_id=fields.get("tokenizer.ggml.eos_token_id"),
                   chat_template=fields.get("tokenizer.chat_template"))

    @classmethod
    def from_dir(cls, path: Path, bos_token_id: int | None, eos_token_id: int | None) -> Tokenizer:
        file = path / "tokenizer.json"
        if not file.exists():
            raise ModelLoadError(f"{path} has no tokenizer.json")
        tok = HFTokenizer.from_file(str(file))
        template = None
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.exists():
            cfg = json.loads(cfg_file.read_text())
            template = cfg.get("chat_template")
            eos = cfg.get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and tok.token_to_id(eos) is not None:
                eos_token_id = tok.token_to_id(eos)
        return cls(tok, bos_token_id=bos_token_id, eos_token_id=eos_token_id, chat_template=template)
