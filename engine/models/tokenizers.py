"""Loading a tokenizer for counting and chat rendering, from a local path only.

A Hugging Face tokenizer directory goes through `transformers.AutoTokenizer` (offline); a bare
`vocab.json` + `merges.txt` pair (GPT-2) through `tokenizers`' byte-level BPE; a SentencePiece
`tokenizer.model` (Llama-2) through `sentencepiece`; a tiktoken ranks file becomes a
`tiktoken.Encoding` with the split pattern that matches its size. `load_model_tokenizer` finds a
model directory's own tokenizer for `LLM` (a tiktoken `tokenizer.model` with its Vocab from the
grammar loaders). Nothing is downloaded: a hub id gets a clear "pass a local directory" error.
Exact per-token bytes for grammars are `surecall.grammars.vocab.loaders`' job, not this module's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from surecall.errors import ModelLoadError, SurecallError, VocabError

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=* \d+\r?$")  # "BASE64TOKEN RANK", a tiktoken ranks file

# Split patterns of the public tiktoken vocabularies (cl100k-style covers Llama-3 and Qwen).
_CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass
class CountingTokenizer:
    name: str
    encode: Callable[[str], list[int]]
    hf: object | None  # a transformers tokenizer when the path is a HF directory
    context_window: int


def load_counting_tokenizer(path: str | Path, context_window: int | None = None) -> CountingTokenizer:
    p = Path(path)
    if not p.exists():
        hint = " (pass a local directory; nothing is downloaded)" if "/" in str(path) and not str(path).startswith(("/", ".")) else ""
        raise VocabError(f"tokenizer not found: {path}{hint}")
    if p.is_dir() and _is_hf_dir(p):
        return _load_hf(p, context_window)
    if p.is_dir() and (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
        return _load_byte_bpe(p, context_window)
    if p.name in ("vocab.json", "merges.txt"):
        return _load_byte_bpe(p.parent, context_window)
    file = p if p.is_file() else _single_model_file(p)
    if file is None:
        raise VocabError(f"{p}: no tokenizer.json, vocab.json+merges.txt, tokenizer.model or tiktoken file found")
    if _is_sentencepiece(file):
        return _load_sentencepiece(file, context_window)
    return _load_tiktoken(file, context_window)


def _is_hf_dir(p: Path) -> bool:
    return (p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file()


def _single_model_file(p: Path) -> Path | None:
    named = [p / n for n in ("tokenizer.model", "tokenizer.model.v3") if (p / n).is_file()]
    ranks = sorted(f for f in p.glob("*.tiktoken") if f.is_file())
    candidates = named or ranks
    return candidates[0] if len(candidates) == 1 or named else None


def _is_sentencepiece(file: Path) -> bool:
    """A SentencePiece model is a protobuf; tiktoken ranks are base64 text (`Zm9v 123` per line)."""
    try:
        with open(file, "rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise VocabError(f"cannot read tokenizer file {file}: {exc.strerror or exc}") from exc
    return not re.match(rb"^[A-Za-z0-9+/]+=* \d+\r?$", head.split(b"\n", 1)[0])


def _load_byte_bpe(p: Path, context_window: int | None) -> CountingTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers

    try:
        tok = Tokenizer(models.BPE.from_file(str(p / "vocab.json"), str(p / "merges.txt")))
    except Exception as exc:  # tokenizers raises its own Exception type on bad files
        raise VocabError(f"{p}: cannot load vocab.json + merges.txt as byte-level BPE ({exc})") from exc
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return CountingTokenizer(p.name, lambda s: tok.encode(s, add_special_tokens=False).ids, None, context_window or 32768)


def _load_sentencepiece(file: Path, context_window: int | None) -> CountingTokenizer:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(file.read_bytes())
    except Exception as exc:  # sentencepiece raises RuntimeError/OSError variants on bad protobufs
        raise VocabError(f"{file}: neither a SentencePiece model nor tiktoken ranks ({exc})") from exc
    return CountingTokenizer(file.parent.name or file.stem, processor.encode, None, context_window or 32768)


def _load_hf(p: Path, context_window: int | None) -> CountingTokenizer:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:  # transformers raises many types for unreadable files
        raise VocabError(f"{p}: cannot load as a Hugging Face tokenizer ({type(exc).__name__}: {exc})") from exc
    window = context_window or _context_window(p, tok)
    return CountingTokenizer(p.name, lambda s: tok.encode(s, add_special_tokens=False), tok, window)


def _context_window(p: Path, tok) -> int:
    config = p / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int):
            return value
    value = getattr(tok, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else 32768


def _load_tiktoken(file: Path, context_window: int | None) -> CountingTokenizer:
    from tiktoken.load import load_tiktoken_bpe

    try:
        ranks = load_tiktoken_bpe(str(file))
    except Exception as exc:
        raise VocabError(f"{file}: not a tiktoken ranks file (base64 token and rank per line): {exc}") from exc
    enc = tiktoken_encoding(file.stem, ranks)
    return CountingTokenizer(file.parent.name or file.stem, lambda s: enc.encode(s, disallowed_special=()), None, context_window or 32768)


def tiktoken_encoding(name: str, ranks: dict[bytes, int], special_tokens: dict[str, int] | None = None):
    """A tiktoken.Encoding over `ranks` with the split pattern that matches its size (o200k-style
    above 150k ranks, Qwen's 151,643 excepted; cl100k-style, which Llama 3 uses, otherwise)."""
    import tiktoken

    pattern = _O200K_PATTERN if len(ranks) > 150_000 and len(ranks) != 151_643 else _CL100K_PATTERN
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(special_tokens or {}))


def load_model_tokenizer(tokenizer, model) -> tuple[Any, Any]:
    """(tokenizer, Vocab or None): the given one, or the model directory's own; a path is loaded."""
    if tokenizer is None and isinstance(model, (str, Path)):
        path = Path(model).expanduser()
        has_own = any((path / n).is_file() for n in (*_HF_TOKENIZER_FILES, "tokenizer.model"))
        tokenizer = path if has_own else None
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer, None
    path = Path(tokenizer).expanduser()
    file = path if path.is_file() else path / "tokenizer.model"
    only_model = file.is_file() and not any((path / n).is_file() for n in _HF_TOKENIZER_FILES)
    try:
        if only_model and _is_tiktoken(file):
            return _model_tiktoken(file)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True), None
    except (OSError, ValueError, TypeError, SurecallError) as exc:  # transformers/sentencepiece: OSError, ValueError
        what = (f"{file.name} is not tiktoken ranks, and transformers could not read it as a SentencePiece model "
                f"(a corrupt file, or the protobuf package is missing)" if only_model and not _is_tiktoken(file)
                else str(exc))
        raise ModelLoadError(
            f"Could not load a tokenizer from {path}: {what}; pass tokenizer= (a tokenizer directory, a "
            f"transformers tokenizer, a tiktoken.Encoding or a surecall Vocab)"
        ) from exc


def _is_tiktoken(file: Path) -> bool:
    with open(file, "rb") as f:
        return bool(_TIKTOKEN_LINE.match(f.readline()))


def _model_tiktoken(file: Path):
    """A tiktoken `tokenizer.model` (Llama 3/4 style): the Vocab from the grammar loaders (with the
    EOS ids of the configs beside it) and a tiktoken.Encoding over the same ranks and specials."""
    from surecall.grammars.vocab.loaders import load

    vocab = load(file)
    ranks = {b: i for i, b in enumerate(vocab.token_bytes) if i not in vocab.special_ids}
    return tiktoken_encoding(file.parent.name or file.stem, ranks, vocab.special_tokens), vocab
