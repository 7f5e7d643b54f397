"""Free-decoding evaluation of surecall-tiny with plain Hugging Face `generate` (no grammar).

Scores completions against the held-out rows: parse rate (a `<tool_call>` envelope around a JSON
object with a string "name" and an object "arguments"), schema-valid rate (a catalog tool whose
schema accepts the arguments) and exact-call rate (same tool, same arguments as JSON values). Episode turns (episodes.py) are
scored the same way, plus whether the model called a tool at all, picked the gold tool(s) and
answered in text where the gold turn is text. Used during training to pick a checkpoint and by benchmarks/tiny_eval.py. Constrained
decoding is measured through `surecall.llm`, not here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import jsonschema_rs
import torch

_ENVELOPE = re.compile(r"\s*<tool_call>\s*(.*?)\s*</tool_call>\s*", re.DOTALL)
_ENVELOPES = re.compile(r"(?:\s*<tool_call>\s*.*?\s*</tool_call>)+\s*", re.DOTALL)
_ONE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TURN_KINDS = ("first_call", "parallel", "call_after_result", "text_after_result", "text_only")


def parse_call(text: str) -> tuple[str, dict]:
    """(name, arguments) of one Hermes call; ValueError says why the text is malformed."""
    match = _ENVELOPE.fullmatch(text)
    if match is None:
        raise ValueError("no <tool_call>...</tool_call> envelope around the whole completion")
    try:
        body = json.loads(match.group(1))
    except json.JSONDecodeError as exc:
        raise ValueError(f"call body is not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise ValueError("call body lacks a string 'name'")
    if not isinstance(body.get("arguments"), dict):
        raise ValueError("call body lacks an object 'arguments'")
    return body["name"], body["arguments"]


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclass
class CallScore:
    is_parsed: bool
    is_valid: bool
    is_exact: bool
    error: str | None = None


def score_call(text: str, tool: str, arguments: dict, validators: dict) -> CallScore:
    """Score one completion against its gold call; `validators` maps tool name -> validator."""
    try:
        name, args = parse_call(text)
    except ValueError as exc:
        return CallScore(False, False, False, str(exc))
    validator = validators.get(name)
    is_valid = validator is not None and validator.is_valid(args)
    is_exact = name == tool and _canonical(args) == _canonical(arguments)
    return CallScore(True, is_valid, is_exact, None if is_valid else "schema-invalid arguments")


def make_validators(tools: list[dict]) -> dict:
    return {t["name"]: jsonschema_rs.validator_for(t["parameters"]) for t in tools}


def summarize(scores: list[CallScore]) -> dict:
    n = max(len(scores), 1)
    return {"num_rows": len(scores),
            "parse_rate": sum(s.is_parsed for s in scores) / n,
            "valid_rate": sum(s.is_valid for s in scores) / n,
            "exact_rate": sum(s.is_exact for s in scores) / n}


@torch.no_grad()
def hf_generate(model, tokenizer, prompts: list[list[int]], temperature: float, seed: int,
                max_new_tokens: int = 384, batch_size: int = 32) -> list[str]:
    """Free decoding of token-id prompts with `generate`; returns the completions' text."""
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    pad_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    texts = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             eos_token_id=stop_ids, pad_token_id=pad_id,
                             **(sampling if temperature > 0 else {"do_sample": False}))
        for row in out[:, width:].tolist():
            texts.append(_decode_until_stop(tokenizer, row, stop_ids))
    return texts


def _decode_until_stop(tokenizer, ids: list[int], stop_ids: list[int]) -> str:
    for i, tok in enumerate(ids):
        if tok in stop_ids:
            ids = ids[:i]
            break
    return tokenizer.decode(ids, skip_special_tokens=False)


def parse_calls(text: str) -> list[tuple[str, dict]]:
    """Every (name, arguments) of a completion made only of Hermes calls; ValueError if not."""
    if _ENVELOPES.fullmatch(text) is None:
        raise ValueError("no <tool_call>...</tool_call> envelopes around the whole completion")
    return [parse_call(m.group(0)) for m in _ONE.finditer(text)]


def episode_turns(episodes: list[dict]) -> list[dict]:
    """Each assistant turn of each episode: {"messages" (the history), "gold", "kind"}."""
    out = []
    for episode in episodes:
        messages = episode["messages"]
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            calls = message.get("tool_calls") or []
            after_result = messages[i - 1]["role"] == "tool"
            if len(calls) > 1:
                kind = "parallel"
            elif calls:
                kind = "call_after_result" if after_result else "first_call"
            else:
                kind = "text_after_result" if after_result else "text_only"
            out.append({"messages": messages[:i], "gold": message, "kind": kind})
    return out


@dataclass
class TurnScore:
    kind: str
    wants_call: bool
    is_call: bool  # the completion contains a <tool_call>
    is_parsed: bool
    is_valid: bool
    is_right_tool: bool  # same tool names in the same order as the gold turn (text: no call)
    is_exact: bool


def score_turn(text: str, turn: dict, validators: dict) -> TurnScore:
    """Score one completion against its gold turn; parse/valid are about any call it makes."""
    gold = [(c["function"]["name"], c["function"]["arguments"])
            for c in turn["gold"].get("tool_calls") or []]
    is_call = "<tool_call>" in text
    try:
        calls = parse_calls(text) if is_call else []
    except ValueError:
        calls = None
    is_parsed = calls is not None and is_call
    is_valid = is_parsed and all(n in validators and validators[n].is_valid(a) for n, a in calls)
    if not gold:
        return TurnScore(turn["kind"], False, is_call, is_parsed, is_valid, not is_call, not is_call)
    right = is_parsed and [n for n, _ in calls] == [n for n, _ in gold]
    exact = right and all(_canonical(a) == _canonical(b)
                          for (_, a), (_, b) in zip(calls, gold, strict=True))
    return TurnScore(turn["kind"], True, is_call, is_parsed, is_valid, right, exact)


def _rates(scores: list[TurnScore]) -> dict:
    n, called = len(scores), [s for s in scores if s.is_call]
    calls = [s for s in scores if s.wants_call]
    out = {"num_turns": n}
    if calls:
        out |= {"call_rate": sum(s.is_call for s in calls) / len(calls),
                "parse_rate": sum(s.is_parsed for s in calls) / len(calls),
                "valid_rate": sum(s.is_valid for s in calls) / len(calls),
                "right_tool_rate": sum(s.is_right_tool for s in calls) / len(calls),
                "exact_rate": sum(s.is_exact for s in calls) / len(calls)}
    texts = [s for s in scores if not s.wants_call]
    if texts:
        out["text_answer_rate"] = sum(s.is_right_tool for s in texts) / len(texts)
    if called:  # of the completions that tried to call: malformed or schema-invalid
        out["bad_call_rate"] = sum(not s.is_valid for s in called) / len(called)
    return out


def summarize_turns(scores: list[TurnScore]) -> dict:
    """Rates over all turns and per turn kind (call turns: call/parse/valid/right/exact)."""
    out = {"all": _rates(scores)}
    for kind in TURN_KINDS:
        subset = [s for s in scores if s.kind == kind]
        if subset:
            out[kind] = _rates(subset)
    return out
