"""The server's pieces without a model: settings, stop strings, request models, metrics text."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from surecall.server import ServerSettings
from surecall.server.metrics import Histogram, Metrics
from surecall.server.protocol import ChatCompletionRequest, CompletionRequest
from surecall.server.streaming import StopMatcher


def test_settings_are_checked():
    with pytest.raises(ValueError, match="Invalid max_queue: expected an integer >= 0, got -1"):
        ServerSettings(max_queue=-1)
    with pytest.raises(ValueError, match="Invalid max_in_flight"):
        ServerSettings(max_in_flight=0)
    with pytest.raises(ValueError, match="Invalid default_max_tokens"):
        ServerSettings(default_max_tokens=0)


def test_stop_matcher_holds_back_a_possible_stop_and_cuts_at_the_first():
    m = StopMatcher(["END", "\n\n"])
    assert m.push("hello E") == "hello "  # "E" may start "END"
    assert m.push("N") == ""
    assert m.push("D and more") == "" and m.hit  # cut before END; nothing after it
    assert m.push("later") == ""
    m = StopMatcher(["END"])
    assert m.push("so E") == "so " and m.push("", final=True) == "E"  # the tail is flushed at the end
    m = StopMatcher(["xy", "y"])
    assert m.push("axyz") == "a"  # the earliest stop wins


def test_request_models_name_what_they_refuse():
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        ChatCompletionRequest.model_validate({**base, "bogus": 1})
    assert ChatCompletionRequest.model_validate({**base, "top_logprobs": 3}).unsupported()[0] == "top_logprobs"
    req = ChatCompletionRequest.model_validate({**base, "max_tokens": 5, "max_completion_tokens": 9})
    assert req.unsupported()[0] == "max_completion_tokens"
    assert ChatCompletionRequest.model_validate({**base, "max_completion_tokens": 9}).budget() == 9
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": True}).unsupported()[0] == "echo"
    parts = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert parts.messages[0].as_template_message() == {"role": "system", "content": "ab"}


def test_metrics_text_is_prometheus():
    h = Histogram((0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5, times=2)
    h.observe(5.0)
    assert h.lines("x") == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1.0"} 3', 'x_bucket{le="+Inf"} 4',
                            "x_sum 6.050000", "x_count 4"]
    m = Metrics()
    m.count_request("chat", 200)
    m.count_tokens(30)
    text = m.render({"num_waiting": 2, "num_running": 3, "prefix_hit_rate": 0.5}, {"compiles": 1, "hits": 4}, 5)
    assert 'surecall_requests_total{endpoint="chat",status="200"} 1' in text
    assert "surecall_queue_depth 2" in text and "surecall_running_rows 3" in text
    assert "surecall_grammar_cache_hits_total 4" in text and "surecall_tokens_per_second 3.0" in text
