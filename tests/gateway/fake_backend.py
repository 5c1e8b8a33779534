"""A backend for gateway tests: an EngineCore with the token-cache executor, stepped
in the event loop, and a byte-level tokenizer."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from llumnix.core.batch import RequestOutput
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest
from tests.engine.helpers import make_engine


class ByteTokenizer:
    eos_token_id = None
    max_token_bytes = 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i % 128 for i in ids).decode(errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt=True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode_chat(self, messages, add_generation_prompt=True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    def warm_up(self) -> None:
        pass


class EngineBackend:
    model_name = "fake"
    max_model_len = 256
    vocab_size = 256

    def __init__(self, prefix_caching: bool = False) -> None:
        self.engine = make_engine(num_blocks=64, block_size=4, max_model_len=self.max_model_len,
                                  vocab_size=self.vocab_size, prefix_caching=prefix_caching)
        self.tokenizer = ByteTokenizer()
        self.aborted: list[str] = []
        self._outbox: dict[str, list[RequestOutput]] = {}

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        self.engine.check_admissible(num_prompt_tokens, params)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Any caller's turn steps the engine and files every request's outputs, so requests
        served at once (a request with n > 1) each get all of theirs."""
        rid = request.request_id
        self._outbox[rid] = []
        self.engine.add_request(rid, request.prompt_token_ids, request.params, priority=request.priority)
        try:
            while True:
                await asyncio.sleep(0)
                if not self._outbox[rid]:
                    for out in self.engine.step():
                        if out.request_id in self._outbox:
                            self._outbox[out.request_id].append(out)
                while self._outbox[rid]:
                    out = self._outbox[rid].pop(0)
                    yield out
                    if out.is_finished:
                        return
        finally:
            del self._outbox[rid]

    async def abort(self, request_id: str) -> None:
        if self.engine.abort_request(request_id):
            self.aborted.append(request_id)

    async def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def cluster_info(self) -> dict[str, Any]:
        return {"instances": [self.engine.instance_id]}

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        return {"draining": instance_id}

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        return {"undrained": instance_id}


def chatml_tokenizer():
    """A real ``Tokenizer``: byte-level BPE over single bytes (no merges), ChatML's two
    control tokens, and the ChatML template."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    from llumnix.model.tokenizer import Tokenizer

    tok = HFTokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return Tokenizer(tok, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"), chat_template=None)
