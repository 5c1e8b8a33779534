from __future__ import annotations

from llumnix.gateway.formatting import LogprobFormat, echo_entries, response_body, sse, usage

TEXT = {1: "he", 2: "llo", 3: "!", 9: "x"}
FMT = LogprobFormat(TEXT.__getitem__)


def test_completion_logprobs_count_offsets_from_the_texts():
    body, end = FMT.completion([(1, -0.5, None), (2, -1.0, None)], offset=4)
    assert body == {"tokens": ["he", "llo"], "token_logprobs": [-0.5, -1.0], "top_logprobs": None,
                    "text_offset": [4, 6]}
    assert end == 9


def test_completion_top_logprobs_hold_the_chosen_token_too_and_none_for_an_echoed_first():
    entries = [(1, None, None), (2, -1.0, [(9, -0.1)])]
    body, _ = FMT.completion(entries, offset=0)
    assert body["top_logprobs"] == [None, {"x": -0.1, "llo": -1.0}]
    as_ids, _ = LogprobFormat(TEXT.__getitem__, as_ids=True).completion(entries, offset=0)
    assert as_ids["tokens"] == ["token_id:1", "token_id:2"]
    assert as_ids["top_logprobs"] == [None, {"token_id:9": -0.1, "token_id:2": -1.0}]
    assert as_ids["text_offset"] == [0, 2]  # offsets still count the text


def test_chat_logprobs_name_tokens_with_their_bytes_and_alternatives():
    assert FMT.chat([(3, -0.2, [(9, -2.0)])]) == {"content": [
        {"token": "!", "logprob": -0.2, "bytes": [33],
         "top_logprobs": [{"token": "x", "logprob": -2.0, "bytes": [120]}]}]}
    assert FMT.chat([(3, -0.2, None)])["content"][0]["top_logprobs"] == []


def test_echo_entries_lead_with_the_prompts_first_token_unscored():
    assert echo_entries([5, 6, 7], [(6, -1.0, None), (7, -2.0, None)]) == [
        (5, None, None), (6, -1.0, None), (7, -2.0, None)]
    assert echo_entries([5], None) == [(5, None, None)]


def test_usage_and_envelopes():
    assert usage(5, 7, 4) == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                              "prompt_tokens_details": {"cached_tokens": 4}}
    objects = [response_body("r", "m", 1, [], chat=chat, chunk=chunk)["object"]
               for chat in (False, True) for chunk in (False, True)]
    assert objects == ["text_completion", "text_completion", "chat.completion", "chat.completion.chunk"]
    assert sse("[DONE]") == b"data: [DONE]\n\n" and sse({"a": 1}) == b'data: {"a":1}\n\n'


def test_a_logprob_of_minus_infinity_is_written_as_valid_json():
    import json

    from llumnix.gateway.formatting import MIN_LOGPROB, LogprobFormat, json_bytes

    fmt = LogprobFormat(token_text=lambda t: f"<{t}>")
    chat = fmt.chat([(1, float("-inf"), [(2, float("nan")), (3, -1.5)])])
    comp, _ = fmt.completion([(1, None, None), (4, float("-inf"), [(5, -0.5)])], 0)
    for body in (chat, comp):
        def refuse(token: str) -> None:
            raise AssertionError(f"{token} is not JSON")

        json.loads(json_bytes(body), parse_constant=refuse)
    assert chat["content"][0]["logprob"] == MIN_LOGPROB
    assert [a["logprob"] for a in chat["content"][0]["top_logprobs"]] == [MIN_LOGPROB, -1.5]
    assert comp["token_logprobs"] == [None, MIN_LOGPROB] and comp["top_logprobs"][1]["<4>"] == MIN_LOGPROB
