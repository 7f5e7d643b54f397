"""Checks the grammar tests share: a one-byte-per-token vocabulary, regex-vs-jsonschema
disagreements on candidate values, and random walks that break the schema.

Nothing here asserts; each test states what it expects of the lists these return.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np

from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex
from surecall.grammars.vocab import Vocab
from surecall.grammars.walk import decode, random_walk, schema_violations


def byte_vocab(name: str) -> Vocab:
    """256 one-byte tokens and a stop token (id 256)."""
    pieces = [bytes([b]) for b in range(256)] + [b""]
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({256}), stop_ids=(256,),
                 logits_width=len(pieces), format="test", name=name)


def disagreements(schema: dict, values: list) -> list:
    """The values the schema's regex (grammar spelling) and jsonschema (2020-12) judge differently."""
    regex = re.compile(expand_marks(schema_to_regex(schema).regex))
    validator = jsonschema.Draft202012Validator(schema)
    return [v for v in values if (regex.fullmatch(grammar_dumps(v, schema)) is not None) != validator.is_valid(v)]


def broken_walks(schema: dict, table, vocab, count: int, short_budget: int) -> list[str]:
    """Texts of `count` random walks (seed 0; every other one cut at `short_budget` tokens) that
    schema_violations finds fault with, relaxed keywords included."""
    rng, broken = np.random.default_rng(0), []
    for i in range(count):
        text = decode(vocab, random_walk(table, vocab, rng, max_tokens=None if i % 2 else short_budget)).decode()
        if schema_violations(schema, json.loads(text), table.relaxed) != ([], []):
            broken.append(text)
    return broken


def invalid_tight_walks(schema: dict, table, vocab, count: int) -> list:
    """Documents of `count` random walks (seed 0; budgets the fewest tokens + 1, then + 200, by
    turns) that the schema's own draft validator rejects."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    rng, invalid = np.random.default_rng(0), []
    for i in range(count):
        ids = random_walk(table, vocab, rng, max_tokens=int(table.dist[0]) + (1 if i % 2 else 200))
        document = json.loads(decode(vocab, ids))
        if not validator.is_valid(document):
            invalid.append(document)
    return invalid
