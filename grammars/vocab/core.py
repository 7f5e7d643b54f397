"""Vocab: the exact bytes every token id contributes mid-sequence, for one real tokenizer.

The grammar compiler's input. Loading from files lives in `loaders.py`; this module
holds the data and its fingerprint. It does not tokenize or decode text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class Vocab:
    token_bytes: tuple[bytes, ...]  # [vocab_size]; b"" for special/control ids
    special_ids: frozenset[int]  # control/special ids: never allowed inside a call
    stop_ids: tuple[int, ...]  # ids that end generation (EOS, <|eot_id|>, ...)
    logits_width: int  # the model's logits width (>= vocab_size; padded ids are never allowed)
    format: str  # "hf-bpe" | "hf-tokenizer-json" | "sentencepiece" | "tiktoken" | "transformers"
    name: str = ""
    bos_id: int | None = None
    eos_id: int | None = None
    special_tokens: dict = field(default_factory=dict, compare=False)  # text -> id for the specials

    def __post_init__(self):
        if self.logits_width < len(self.token_bytes):
            raise ValueError(
                f"Invalid logits_width: expected >= tokenizer size {len(self.token_bytes)}, got {self.logits_width}"
            )

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def fingerprint(self) -> str:
        """Stable sha256 over every token's bytes, the special and stop ids and the logits width."""
        h = hashlib.sha256()
        h.update(b"surecall-vocab-v1\0")
        h.update(str(self.logits_width).encode() + b"\0")
        for b in self.token_bytes:
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        h.update(b"special\0" + ",".join(map(str, sorted(self.special_ids))).encode())
        h.update(b"stop\0" + ",".join(map(str, self.stop_ids)).encode())
        return h.hexdigest()

    def normal_ids(self) -> list[int]:
        """Ids a grammar may use: not special, with at least one byte."""
        return [i for i, b in enumerate(self.token_bytes) if b and i not in self.special_ids]

    def summary(self) -> dict:
        return {
            "name": self.name,
            "format": self.format,
            "vocab_size": self.vocab_size,
            "logits_width": self.logits_width,
            "num_special": len(self.special_ids),
            "special_ids": sorted(self.special_ids),
            "stop_ids": list(self.stop_ids),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "fingerprint": self.fingerprint,
        }


def load_vocab(source, logits_width: int | None = None, name: str | None = None) -> Vocab:
    """Load a Vocab from a local directory or file, `shared:NAME` (a vocabulary of ../shared/data,
    with its model's logits width), or a `transformers` tokenizer object.

    See `loaders.py` for the formats handled.
    """
    from surecall.grammars.vocab.loaders import load

    return load(source, logits_width=logits_width, name=name)
