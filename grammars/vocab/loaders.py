"""Load a `Vocab` (the exact bytes every token id contributes mid-sequence) from local files.

Sources: a Hugging Face model/tokenizer directory (`tokenizer.json`; `vocab.json` + `merges.txt`;
SentencePiece `tokenizer.model[.v3]`), a tiktoken ranks file (`*.tiktoken`, or a Llama-3/4
`tokenizer.model` holding base64 ranks), a `transformers` tokenizer object or a
`tiktoken.Encoding`. The format is detected from the files, never from a model name. Nothing is
downloaded: a hub id is refused with "pass a local directory". It does not tokenize text.
One file past 400 lines on purpose: the five readers share the id -> bytes assembly and the
error wording, and each is a handful of short functions.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from surecall.errors import VocabError
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.vocab.shared import require_shared

# Texts of special tokens that end generation, across families (EOS, end of turn, end of message).
STOP_TEXTS = frozenset({
    "</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>",
    "<|eot|>", "<|eom|>", "<|end|>", "<end_of_turn>", "<eos>", "<|return|>", "<|call|>",
})
# Preferred EOS text, first match wins, when no config names one.
_EOS_ORDER = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|im_end|>", "<|eot_id|>")
_BOS_TEXTS = ("<|begin_of_text|>", "<s>", "<bos>")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=* \d+\r?$")
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CONTROL_SHAPE = re.compile(r"^(<[^<>\s]+>|\[[A-Z_/]+\])$")  # <|endoftext|>, </s>, <pad>, [INST]
_EXPECTED = ("a local directory or file holding tokenizer.json, vocab.json + merges.txt, "
             "tokenizer.model (SentencePiece or tiktoken ranks) or a *.tiktoken file")


@dataclass(frozen=True)
class TiktokenFamily:
    """Special tokens a bare tiktoken ranks file does not carry, recognised by its rank count."""

    name: str
    num_ranks: int  # ids 0..num_ranks-1 are the ranks
    num_total: int  # tokenizer size; unnamed ids in [num_ranks, num_total) are reserved or holes
    special_tokens: dict  # text -> id of the named specials
    reserved_name: str | None = None  # format for unnamed ids ("<|reserved_special_token_{}|>") or None: holes


# Data from the tiktoken package (openai_public.py), meta-llama/llama-models (llama3/llama4
# tokenizer.py) and Qwen's qwen.tiktoken; cross-checked with ../shared/data/tokenizers/manifest.json.
TIKTOKEN_FAMILIES = {f.num_ranks: f for f in (
    TiktokenFamily("r50k_base", 50256, 50257, {"<|endoftext|>": 50256}),
    TiktokenFamily("p50k_base", 50281, 50281, {"<|endoftext|>": 50256}),  # ranks skip 50256
    TiktokenFamily("cl100k_base", 100256, 100277, {
        "<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
        "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}),
    TiktokenFamily("o200k_base", 199998, 200019, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
    TiktokenFamily("llama3", 128000, 128256, {
        "<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|finetune_right_pad_id|>": 128004,
        "<|step_id|>": 128005, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010, "<|image|>": 128011},
        "<|reserved_special_token_{}|>"),
    TiktokenFamily("llama4", 200000, 202048, {
        "<|begin_of_text|>": 200000, "<|end_of_text|>": 200001, "<|fim_prefix|>": 200002,
        "<|fim_middle|>": 200003, "<|fim_suffix|>": 200004, "<|header_start|>": 200005,
        "<|header_end|>": 200006, "<|eom|>": 200007, "<|eot|>": 200008, "<|step|>": 200009,
        "<|python_start|>": 200010, "<|python_end|>": 200011, "<|finetune_right_pad|>": 200012},
        "<|reserved_special_token_{}|>"),
    TiktokenFamily("qwen", 151643, 151646, {
        "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}),
)}

# Shared vocabularies: manifest name -> (folder or file under tokenizers/, the real model's logits width).
SHARED_VOCABS = {
    "gpt2": ("gpt2", 50257),
    "cl100k_base": ("cl100k_base/cl100k_base.tiktoken", 100277),
    "o200k_base": ("o200k_base/o200k_base.tiktoken", 200019),
    "llama3": ("llama3/tokenizer.model", 128256),
    "llama4": ("llama4/tokenizer.model", 202048),
    "qwen2": ("qwen2", 151936),
    "llama2": ("llama2/tokenizer.model", 32000),
    "mistral-v0.3": ("mistral-v0.3", 32768),
}
SHARED_ALIASES = {"llama2-spm": "llama2", "mistral": "mistral-v0.3", "r50k_base": "gpt2"}


# --- public entry points -------------------------------------------------------------------
def load(source, logits_width: int | None = None, name: str | None = None,
         special_tokens: dict | None = None) -> Vocab:
    """Load a Vocab from a local path (directory or file) or a tokenizer object.

    `logits_width` pads past the tokenizer's size (default: config.json's vocab_size when present).
    `special_tokens` (text -> id) adds specials to a bare tiktoken file of an unknown family.
    """
    if isinstance(source, str) and source.startswith("shared:") and not os.path.exists(source):
        if special_tokens is not None:
            raise VocabError(f"special_tokens apply to a bare tiktoken file, not to the shared vocabulary {source!r}")
        return load_shared(source.removeprefix("shared:"), logits_width=logits_width)
    if isinstance(source, (str, os.PathLike)):
        path = _local_path(source)
        parts = _load_path(path, special_tokens)
        default_name = (path if path.is_dir() else path.parent).name
        config_dir = path if path.is_dir() else path.parent
    else:
        parts = _load_object(source)
        default_name = str(getattr(source, "name_or_path", "") or getattr(source, "name", "") or "")
        config_dir = None
    return _assemble(parts, logits_width, name or parts.get("name") or default_name, config_dir)


def load_shared(name: str, logits_width: int | None = None) -> Vocab:
    """A vocabulary from ../shared/data/tokenizers by manifest name, with the real model's logits width."""
    key = SHARED_ALIASES.get(name, name)
    if key not in SHARED_VOCABS:
        raise VocabError(f"unknown shared vocabulary {name!r}: expected one of {sorted(SHARED_VOCABS)}")
    relative, width = SHARED_VOCABS[key]
    try:
        path = require_shared(f"tokenizers/{relative}")
    except FileNotFoundError as exc:
        raise VocabError(str(exc)) from exc
    return load(path, logits_width=width if logits_width is None else logits_width, name=key)


# --- paths and format detection ------------------------------------------------------------
def _local_path(source) -> Path:
    path = Path(source).expanduser()
    if path.exists():
        return path
    text = str(source)
    if _HUB_ID.match(text) and not text.startswith((".", "~")):
        raise VocabError(
            f"{text!r} is not a local path (it looks like a Hugging Face hub id): surecall never "
            f"downloads; pass a local directory holding the tokenizer files "
            f"(e.g. after `huggingface-cli download {text}`)")
    raise VocabError(f"tokenizer path not found: {path} (expected {_EXPECTED})")


def _load_path(path: Path, special_tokens: dict | None) -> dict:
    if path.is_dir():
        return _load_directory(path, special_tokens)
    name = path.name
    if name == "vocab.json" or name == "merges.txt":
        return _load_hf_bpe(path.parent / "vocab.json", path.parent / "merges.txt")
    head = _read_head(path)
    if name.endswith(".tiktoken") or _TIKTOKEN_LINE.match(head.split(b"\n", 1)[0]):
        return _load_tiktoken(path, special_tokens)
    if name.endswith(".json") or head.lstrip().startswith(b"{"):
        return _load_tokenizer_json(path)
    return _load_sentencepiece(path)


def _load_directory(directory: Path, special_tokens: dict | None) -> dict:
    if (directory / "tokenizer.json").is_file():
        return _load_tokenizer_json(directory / "tokenizer.json")
    has_vocab, has_merges = (directory / "vocab.json").is_file(), (directory / "merges.txt").is_file()
    if has_vocab or has_merges:
        return _load_hf_bpe(directory / "vocab.json", directory / "merges.txt")
    models = sorted(directory.glob("tokenizer.model*")) or sorted(directory.glob("*.model"))
    ranks = sorted(directory.glob("*.tiktoken"))
    candidates = models or ranks
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "nothing"
        raise VocabError(f"cannot choose a tokenizer in {directory}: found {found}; expected {_EXPECTED}"
                         + (" (pass the file itself)" if candidates else ""))
    return _load_path(candidates[0], special_tokens)


def _read_head(path: Path, num_bytes: int = 256) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(num_bytes)
    except OSError as exc:
        raise VocabError(f"cannot read tokenizer file {path}: {exc.strerror or exc}") from exc


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise VocabError(f"missing tokenizer file {path}: expected {what}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VocabError(f"cannot read {path}: expected {what} ({exc})") from exc


def _read_json(path: Path, what: str):
    text = _read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise VocabError(f"{path} is not valid JSON: expected {what} ({exc})") from exc


# --- byte-level BPE (GPT-2 style) ----------------------------------------------------------
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's reversible map: printable bytes stand for themselves, the rest for chr(256 + n).

    Adapted from https://github.com/openai/gpt-2/blob/master/src/encoder.py (bytes_to_unicode).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_decoder()
# str.translate table: each alphabet char -> the latin-1 char of its byte; any other char below
# 256 -> a char latin-1 cannot encode, so a token holding one falls back to its raw UTF-8.
_BYTE_LEVEL_TRANSLATE = {**{c: "\U0010ffff" for c in range(256)}, **{ord(c): b for c, b in _BYTE_LEVEL.items()}}


def _byte_level_bytes(token: str) -> bytes:
    """A byte-level token's bytes; a token with a char outside the alphabet is its raw UTF-8 (as HF does)."""
    try:
        return token.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")


def _check_vocab_map(vocab, path: Path) -> dict[str, int]:
    if not isinstance(vocab, dict) or not vocab:
        raise VocabError(f"{path}: expected a non-empty JSON object mapping token text to id")
    seen: dict[int, str] = {}
    for token, idx in vocab.items():
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise VocabError(f"{path}: token {token!r} has id {idx!r}; expected a non-negative integer")
        if idx in seen:
            raise VocabError(f"{path}: id {idx} is given to both {seen[idx]!r} and {token!r}; expected one token per id")
        seen[idx] = token
    return vocab


def _parse_merges(lines, vocab: dict[str, int], path) -> set[str]:
    """Check every merge `a b` names two vocabulary tokens whose join is one too; return the joins."""
    results = set()
    for lineno, line in lines:
        parts = line.split(" ") if isinstance(line, str) else line
        if len(parts) == 2 and isinstance(parts[0], str) and isinstance(parts[1], str):
            joined = parts[0] + parts[1]
            if parts[0] in vocab and parts[1] in vocab and joined in vocab:
                results.add(joined)
                continue
        _raise_bad_merge(lineno, line, parts, vocab, path)
    return results


def _raise_bad_merge(lineno: int, line, parts, vocab: dict[str, int], path) -> None:
    where = f"corrupt merges in {path} at line {lineno}: {line!r}"
    if len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
        raise VocabError(f"{where}; expected two tokens 'A B'")
    missing = next(t for t in (*parts, parts[0] + parts[1]) if t not in vocab)
    raise VocabError(f"{where} uses {missing!r}, which is not in the vocabulary; "
                     f"expected merges of vocabulary tokens")


def _load_hf_bpe(vocab_path: Path, merges_path: Path) -> dict:
    vocab = _check_vocab_map(_read_json(vocab_path, "a JSON object mapping token text to id"), vocab_path)
    text = _read_text(merges_path, f"merges.txt beside {vocab_path.name} ('A B' per line)")
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line and not line.startswith("#version")]
    joins = _parse_merges(lines, vocab, merges_path)
    pieces = {idx: _byte_level_bytes(tok) for tok, idx in vocab.items()}
    # A control-shaped entry no merge produces never comes out of encoding text: an added/control
    # token such as GPT-2's <|endoftext|> (GPT2Tokenizer's default eos), never allowed in a call.
    special = {idx: tok for tok, idx in vocab.items()
               if len(tok) > 1 and tok not in joins and _CONTROL_SHAPE.match(tok)}
    added_special, added_plain = _added_tokens(vocab_path.parent)
    special.update(added_special)
    for idx, text in added_plain.items():  # HF passes added tokens through the byte-level decoder too
        special.pop(idx, None)
        pieces[idx] = _byte_level_bytes(text)
    return {"pieces": pieces, "special": special, "format": "hf-bpe"}


def _added_tokens(directory: Path) -> tuple[dict[int, str], dict[int, str]]:
    """Added tokens from tokenizer_config.json / added_tokens.json: (special id -> text, plain id -> text)."""
    special, plain = {}, {}
    config_path = directory / "tokenizer_config.json"
    config = _read_json(config_path, "a JSON object") if config_path.is_file() else {}
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        content = entry.get("content", "") if isinstance(entry, dict) else str(entry)
        target = special if (not isinstance(entry, dict) or entry.get("special", True)) else plain
        target[int(key)] = content
    added_path = directory / "added_tokens.json"
    if added_path.is_file():
        for content, idx in _check_vocab_map(_read_json(added_path, "a JSON object"), added_path).items():
            if idx not in plain:
                special.setdefault(idx, content)
    return special, plain


# --- tokenizer.json ------------------------------------------------------------------------
def _walk_types(node) -> set[str]:
    """Every "type" named anywhere inside a normalizer/pre-tokenizer/decoder tree."""
    if isinstance(node, dict):
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        return found.union(*(_walk_types(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_walk_types(v) for v in node))
    return set()


def _load_tokenizer_json(path: Path) -> dict:
    data = _read_json(path, "a Hugging Face tokenizer.json with a 'model' object")
    return _tokenizer_json_parts(data, path)


def _tokenizer_json_parts(data, path) -> dict:
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or "vocab" not in model:
        raise VocabError(f"{path}: expected a Hugging Face tokenizer.json with a 'model' object holding 'vocab'")
    kind = model.get("type") or ("BPE" if "merges" in model else "")
    if kind not in ("BPE", "Unigram"):
        raise VocabError(f"{path}: tokenizer model type {kind!r} is not supported; expected BPE or Unigram "
                         f"(WordPiece/WordLevel decoders insert spaces, so tokens have no fixed bytes)")
    if kind == "Unigram":
        vocab = {entry[0]: i for i, entry in enumerate(model["vocab"])}
    else:
        vocab = _check_vocab_map(model["vocab"], path)
        merges = model.get("merges") or []
        _parse_merges(enumerate(merges, 1), vocab, path)
    types = _walk_types([data.get("pre_tokenizer"), data.get("decoder")])
    byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in types
    if "ByteLevel" in types:
        to_bytes = _byte_level_bytes
    else:
        def to_bytes(token: str) -> bytes:
            match = _BYTE_PIECE.match(token) if byte_fallback else None
            return bytes([int(match.group(1), 16)]) if match else token.replace("▁", " ").encode()
    pieces = {idx: to_bytes(tok) for tok, idx in vocab.items()}
    special = {}
    for entry in data.get("added_tokens") or []:
        if entry.get("special"):
            special[entry["id"]] = entry["content"]
        else:
            pieces[entry["id"]] = to_bytes(entry["content"])
    unk = model.get("unk_token")
    if isinstance(unk, str) and unk in vocab:
        special[vocab[unk]] = unk
    elif isinstance(model.get("unk_id"), int):
        special[model["unk_id"]] = model["vocab"][model["unk_id"]][0]
    return {"pieces": pieces, "special": special, "format": "hf-tokenizer-json"}


# --- SentencePiece -------------------------------------------------------------------------
def _load_sentencepiece(path: Path) -> dict:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(path.read_bytes())
    except OSError as exc:
        raise VocabError(f"cannot read tokenizer file {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # sentencepiece raises RuntimeError/OSError variants on bad protobufs
        raise VocabError(f"{path} is not a tokenizer this loader knows: expected a SentencePiece model "
                         f"(protobuf) or tiktoken ranks (base64 token + rank per line)") from exc
    return _sentencepiece_parts(processor)


def _sentencepiece_parts(processor) -> dict:
    pieces, special = {}, {}
    for idx in range(processor.get_piece_size()):
        piece = processor.id_to_piece(idx)
        if processor.is_control(idx) or processor.is_unknown(idx) or processor.is_unused(idx):
            special[idx] = piece
        elif processor.is_byte(idx):
            pieces[idx] = bytes([int(_BYTE_PIECE.match(piece).group(1), 16)])
        else:  # mid-sequence "▁foo" is " foo": the dummy-prefix strip applies only at the start
            pieces[idx] = piece.replace("▁", " ").encode()
    eos = processor.eos_id()
    return {"pieces": pieces, "special": special, "format": "sentencepiece",
            "eos_ids": [eos] if eos >= 0 else [],
            "bos_id": processor.bos_id() if processor.bos_id() >= 0 else None}


# --- tiktoken ------------------------------------------------------------------------------
def _load_tiktoken(path: Path, special_tokens: dict | None) -> dict:
    ranks = {}
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise VocabError(f"cannot read tokenizer file {path}: {exc.strerror or exc}") from exc
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            if len(parts) != 2 or rank < 0:
                raise ValueError
        except (ValueError, IndexError) as exc:
            raise VocabError(f"corrupt tiktoken ranks in {path} at line {lineno}: {line[:60]!r}; "
                             f"expected 'BASE64TOKEN RANK'") from exc
        if rank in ranks:
            raise VocabError(f"corrupt tiktoken ranks in {path} at line {lineno}: rank {rank} repeated")
        ranks[rank] = token
    if not ranks:
        raise VocabError(f"{path} holds no ranks: expected tiktoken 'BASE64TOKEN RANK' lines")
    return _tiktoken_parts(ranks, special_tokens)


def _tiktoken_parts(ranks: dict[int, bytes], special_tokens: dict | None) -> dict:
    family = TIKTOKEN_FAMILIES.get(max(ranks) + 1)
    special = {idx: text for text, idx in (special_tokens or {}).items()}
    name = None
    if family is not None and special_tokens is None:
        name = family.name
        special = {idx: text for text, idx in family.special_tokens.items()}
        unnamed = [i for i in range(family.num_ranks, family.num_total) if i not in special]
        for k, idx in enumerate(unnamed):
            if family.reserved_name:
                special[idx] = family.reserved_name.format(k)
    size = max([family.num_total - 1 if family and special_tokens is None else 0, *ranks, *special]) + 1
    return {"pieces": dict(ranks), "special": special, "format": "tiktoken", "name": name, "size": size}


# --- tokenizer objects ---------------------------------------------------------------------
def _load_object(tokenizer) -> dict:
    if hasattr(tokenizer, "_mergeable_ranks") and hasattr(tokenizer, "_special_tokens"):  # tiktoken.Encoding
        parts = _tiktoken_parts(dict(map(reversed, tokenizer._mergeable_ranks.items())), tokenizer._special_tokens)
        return {**parts, "name": tokenizer.name, "size": tokenizer.n_vocab}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        parts = _tokenizer_json_parts(json.loads(backend.to_str()), type(tokenizer).__name__)
    elif getattr(tokenizer, "sp_model", None) is not None:
        parts = _sentencepiece_parts(tokenizer.sp_model)
    else:
        raise VocabError(f"unsupported tokenizer object {type(tokenizer).__name__}: expected a transformers "
                         f"tokenizer (fast, or SentencePiece-backed), a tiktoken.Encoding, or a local path")
    for idx, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            parts["special"][idx] = str(added)
    for idx in getattr(tokenizer, "all_special_ids", None) or []:
        parts["special"].setdefault(idx, tokenizer.convert_ids_to_tokens(idx))
    eos = getattr(tokenizer, "eos_token_id", None)
    parts["eos_ids"] = [eos] if isinstance(eos, int) else parts.get("eos_ids", [])
    parts["format"] = "transformers"
    num_ids = len(tokenizer) if hasattr(tokenizer, "__len__") else 0
    parts["size"] = max(num_ids, 1 + max([*parts["pieces"], *parts["special"]]))
    return parts


# --- assembly ------------------------------------------------------------------------------
def _config_ids(config_dir: Path | None, special: dict[int, str]) -> tuple[list[int], int | None, int | None]:
    """EOS ids, BOS id and vocab_size from the configs beside the tokenizer (when present)."""
    if config_dir is None:
        return [], None, None
    by_text = {text: idx for idx, text in special.items()}
    eos, bos, width = [], None, None
    for file in ("tokenizer_config.json", "config.json", "generation_config.json"):
        path = config_dir / file
        if not path.is_file():
            continue
        config = _read_json(path, "a JSON object")
        for key, value in config.items():
            values = value if isinstance(value, list) else [value]
            values = [v.get("content") if isinstance(v, dict) else v for v in values]
            ids = [v if isinstance(v, int) else by_text.get(v) for v in values]
            ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
            if key in ("eos_token", "eos_token_id"):
                eos += ids
            elif key in ("bos_token", "bos_token_id") and ids:
                bos = ids[0]
        if file == "config.json" and isinstance(config.get("vocab_size"), int):
            width = config["vocab_size"]
    return eos, bos, width


def _assemble(parts: dict, logits_width: int | None, name: str, config_dir: Path | None) -> Vocab:
    pieces, special = parts["pieces"], parts["special"]
    size = max([parts.get("size", 0), *(i + 1 for i in pieces), *(i + 1 for i in special)])
    # Ids no token has (holes in OpenAI's special range) are never allowed: marked special, no bytes.
    token_bytes = tuple(b"" if i in special else pieces.get(i, b"") for i in range(size))
    special_ids = frozenset(special) | {i for i in range(size) if i not in pieces}
    config_eos, config_bos, config_width = _config_ids(config_dir, special)
    by_text = {text: idx for idx, text in special.items()}
    eos_ids = [*config_eos, *parts.get("eos_ids", [])]
    eos_id = eos_ids[0] if eos_ids else next((by_text[t] for t in _EOS_ORDER if t in by_text), None)
    stop_ids = sorted({*eos_ids, *(i for i, t in special.items() if t in STOP_TEXTS)})
    bos_id = config_bos if config_bos is not None else parts.get("bos_id")
    if bos_id is None:
        bos_id = next((by_text[t] for t in _BOS_TEXTS if t in by_text), None)
    width = logits_width if logits_width is not None else max(size, config_width or 0)
    if not isinstance(width, int) or isinstance(width, bool):
        raise VocabError(f"logits width {width!r} is not an integer: expected an integer >= {size}")
    if width < size:
        raise VocabError(f"logits width {width} is smaller than the tokenizer's size {size} "
                         f"(ids 0..{size - 1}); expected an integer >= {size}")
    return Vocab(
        token_bytes=token_bytes, special_ids=frozenset(special_ids), stop_ids=tuple(stop_ids),
        logits_width=width, format=parts["format"], name=name, bos_id=bos_id, eos_id=eos_id,
        special_tokens={text: idx for idx, text in sorted(special.items())},
    )
