"""A grammar with called pieces and a vocabulary whose tokens cross their calls and ends
(tests/grammars/test_called_pieces.py, tests/kernels/test_kernels_calls.py)."""

from __future__ import annotations

from surecall.grammars.vocab.core import Vocab


def call_schema(max_length: int = 70) -> dict:
    """An object value (P, ~2k regex characters: a splice piece) used at three places and as the
    items of an array, holding a second one (Q) used beside it. Its name is a counted string
    past 48 characters (`max_length`) and its tags a counted array."""
    p = {"type": "object", "properties": {"name": {"type": "string", "maxLength": max_length},
                                          "kind": {"enum": ["alpha", "beta", "gamma", "delta", "epsilon"]}},
         "required": ["name", "kind"]}
    for i in range(10):
        p["properties"][f"field_{i}"] = {"enum": [f"value_{i}_{j}" for j in range(6)]}
    p["properties"].update({"size": {"type": "integer", "minimum": 0},
                            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 60},
                            "q": {"$ref": "#/definitions/Q"}})
    q = {"type": "object", "properties": {"x": {"type": "number"},
                                          "label": {"enum": ["north", "south", "east", "west"]}}, "required": ["x"]}
    for i in range(8):
        q["properties"][f"extra_{i}"] = {"enum": [f"e{i}{j}" for j in range(5)]}
    return {"type": "object", "properties": {
        "a": {"$ref": "#/definitions/P"}, "b": {"$ref": "#/definitions/P"},
        "c": {"type": "array", "items": {"$ref": "#/definitions/P"}}, "d": {"$ref": "#/definitions/Q"},
        "e": {"type": "string"}}, "required": ["a", "d"], "definitions": {"P": p, "Q": q}}


def small_vocab() -> Vocab:
    """Every byte, and multi-byte tokens that end a body and go on (`},"`, `}}`), open one
    (`{"`), or both (`}, {`)."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"', b'"}', b"}}", b'},"', b"}, {", b"},{", b'":{"', b'"a":{', b'"}}', b"]}", b"}]", b'":"',
               b'", "', b'"kind":"', b"alpha", b"value", b'"x":', b"}}}", b"[{", b"]}}"]
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 3, format="test", name="calls")
