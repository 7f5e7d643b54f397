"""Free-decoding evaluation of surecall-tiny with plain Hugging Face `generate` (no grammar).

Scores completions against the held-out rows: parse rate (a `<tool_call>` envelope around a JSON
object with a string "name" and an object "arguments"), schema-valid rate (a catalog tool whose
schema accepts the arguments) and exact-call rate (same tool, same arguments as JSON values).
Used during training to pick a checkpoint and by benchmarks/tiny_eval.py. Constrained
decoding is measured through `surecall.llm`, not here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import jsonschema_rs
import torch

_ENVELOPE = re.compile(r"\s*<tool_call>\s*(.*?)\s*</tool_call>\s*", re.DOTALL)


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
