"""Observation segments: only the new text after the model's turn is rendered and tokenised."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from surecall.models import __file__ as models_init
from surecall.rollout.render import RenderError, SegmentRenderer, call_message, result_message

CALLS = [{"id": "c0", "name": "file_view", "arguments": {"path": "a.txt"}}]
HISTORY = [{"role": "user", "content": "show a.txt"}]


@pytest.fixture(scope="module")
def tokenizer():
    from pathlib import Path

    return AutoTokenizer.from_pretrained(Path(models_init).parent / "surecall_tiny")


def test_the_segment_is_the_template_text_after_the_stop_token(tokenizer):
    r = SegmentRenderer(tokenizer, [])
    text = r.observation_text(HISTORY, call_message(CALLS), [result_message(CALLS[0], "line 1")], True)
    assert text == "\n<|im_start|>user\n<tool_response>\nline 1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    cut = r.observation_text(HISTORY, call_message(CALLS), [result_message(CALLS[0], "line 1")], False)
    assert cut == "<|im_end|>" + text  # a turn cut by its budget gets the stop token the template expects
    ids = r.observation_ids(HISTORY, call_message(CALLS), [result_message(CALLS[0], "line 1")], True)
    assert tokenizer.decode(ids) == text


def test_a_tokenizer_without_a_chat_template_uses_the_plain_fallback(tokenizer):
    class Plain:
        chat_template = None
        eos_token = None

        def encode(self, text, add_special_tokens=False):
            return tokenizer.encode(text, add_special_tokens=False)

    r = SegmentRenderer(Plain(), [])
    text = r.observation_text(HISTORY, call_message(CALLS), [result_message(CALLS[0], "ok")], True)
    assert text == "\ntool: ok\nassistant:"


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    class Rewriting:
        chat_template = "x"
        eos_token = "<|im_end|>"

        def apply_chat_template(self, messages, add_generation_prompt=False, **_):
            return f"{len(messages)} messages" + ("!" if add_generation_prompt else "")

    r = SegmentRenderer(Rewriting(), [])
    with pytest.raises(RenderError, match="renders the conversation with tool results differently"):
        r.observation_text(HISTORY, call_message(CALLS), [result_message(CALLS[0], "ok")], True)
