"""Vocabulary loading: every shared vocabulary loads as its manifest says, every token's bytes
match the reference tokenizer (tiktoken / sentencepiece / tokenizers) byte for byte, the
fingerprint tracks the bytes, bad input raises VocabError, and `surecall vocab` prints it all.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import cached_vocab

from surecall.cli import main
from surecall.errors import VocabError
from surecall.grammars import load_vocab
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.vocab.loaders import load, load_shared

NAMES = ["gpt2", "cl100k_base", "o200k_base", "llama3", "llama4", "qwen2", "llama2", "mistral-v0.3"]
MANIFEST_NAME = {"llama2": "llama2-spm"}
# The real models' logits widths (config.json vocab_size), past the tokenizer's size where padded.
MODEL_WIDTH = {"llama3": 128256, "llama4": 202048, "qwen2": 151936, "llama2": 32000,
               "mistral-v0.3": 32768, "gpt2": 50257, "cl100k_base": 100277, "o200k_base": 200019}
STOP_TEXTS = {
    "gpt2": {"<|endoftext|>"}, "cl100k_base": {"<|endoftext|>"}, "o200k_base": {"<|endoftext|>"},
    "llama3": {"<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"}, "llama4": {"<|end_of_text|>", "<|eom|>", "<|eot|>"},
    "qwen2": {"<|endoftext|>", "<|im_end|>"}, "llama2": {"</s>"}, "mistral-v0.3": {"</s>"},
}
# tiktoken ranks files that serve as an independent byte-exact reference, per vocabulary.
TIKTOKEN_REFERENCE = {
    "gpt2": "gpt2/r50k_base.tiktoken", "cl100k_base": "cl100k_base/cl100k_base.tiktoken",
    "o200k_base": "o200k_base/o200k_base.tiktoken", "llama3": "llama3/tokenizer.model",
    "llama4": "llama4/tokenizer.model", "qwen2": "qwen2/qwen.tiktoken",
}
SENTENCEPIECE_REFERENCE = {"llama2": "llama2/tokenizer.model", "mistral-v0.3": "mistral-v0.3/tokenizer.model.v3"}
# llama.cpp golden vectors -> the shared vocabulary they were made with (phi-3 uses Llama-2's pieces).
GOLDEN = {"llama-bpe": "llama3", "qwen2": "qwen2", "gpt-2": "gpt2", "llama-spm": "llama2", "phi-3": "llama2"}


@pytest.fixture(scope="module")
def tokdir(data_dir) -> Path:
    return data_dir / "tokenizers"


@pytest.fixture(scope="module")
def manifest(tokdir) -> dict:
    entries = json.loads((tokdir / "manifest.json").read_text())["tokenizers"]
    return {e["name"]: e for e in entries}


@cache
def tiktoken_reference(tokdir: Path, name: str):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(tokdir / TIKTOKEN_REFERENCE[name]))
    return tiktoken.Encoding(name=f"ref-{name}", pat_str=r"\S+", mergeable_ranks=ranks, special_tokens={})


@cache
def sentencepiece_reference(tokdir: Path, name: str):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(tokdir / SENTENCEPIECE_REFERENCE[name]))


def sp_decode_mid(processor, ids: list[int]) -> bytes:
    """SentencePiece's decoding of `ids` in the middle of a sequence: decode [anchor] + ids, strip the anchor."""
    anchor = processor.piece_to_id("a")
    return processor.decode([anchor, *ids]).encode()[1:]


@cache
def non_byte_pieces(vocab: Vocab, processor) -> tuple[int, ...]:
    return tuple(i for i in vocab.normal_ids() if not processor.is_byte(i))


def valid_utf8_units(vocab: Vocab, rng: random.Random, processor, count: int) -> list[int]:
    """Random normal pieces interleaved with byte-fallback groups that spell whole characters."""
    ids, normal = [], non_byte_pieces(vocab, processor)
    for _ in range(count):
        if rng.random() < 0.2:
            char = chr(rng.choice([rng.randrange(0x80, 0x800), rng.randrange(0x4E00, 0x9FFF), rng.randrange(0x1F300, 0x1F64F)]))
            ids += [processor.piece_to_id(f"<0x{b:02X}>") for b in char.encode()]
        else:
            ids.append(rng.choice(normal))
    return ids


def joined(vocab: Vocab, ids) -> bytes:
    return b"".join(vocab.token_bytes[i] for i in ids)


# --- every shared vocabulary loads as the manifest says ----------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_shared_vocab_matches_manifest(name, manifest, data_dir):
    vocab, entry = cached_vocab(name), manifest[MANIFEST_NAME.get(name, name)]
    assert vocab.vocab_size == entry["n_vocab_total"]
    assert vocab.logits_width == MODEL_WIDTH[name]
    for text, idx in entry["special_tokens"].items():
        assert vocab.special_tokens[text] == idx
        assert idx in vocab.special_ids and vocab.token_bytes[idx] == b""
    if entry["n_regular_tokens"] < entry["n_vocab_total"]:
        assert len(vocab.normal_ids()) == entry["n_regular_tokens"]
    names = {idx: text for text, idx in vocab.special_tokens.items()}
    assert {names[i] for i in vocab.stop_ids} == STOP_TEXTS[name]
    assert vocab.eos_id in vocab.stop_ids


def test_llama_reserved_specials_fill_the_family_range(data_dir):
    assert set(range(128000, 128256)) == cached_vocab("llama3").special_ids
    assert set(range(200000, 202048)) == cached_vocab("llama4").special_ids
    assert cached_vocab("llama3").special_tokens["<|reserved_special_token_2|>"] == 128012


def test_openai_holes_are_never_allowed(data_dir):
    vocab = cached_vocab("cl100k_base")
    holes = {100256, *range(100261, 100276)}
    assert holes <= vocab.special_ids and all(vocab.token_bytes[i] == b"" for i in holes)
    assert not holes & set(vocab.normal_ids())


# --- exactness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("golden", sorted(GOLDEN))
def test_golden_vectors_decode_exactly(golden, tokdir):
    name = GOLDEN[golden]
    vocab = cached_vocab(name)
    folder = tokdir / "llama.cpp-vocab" / "test-vectors"
    texts = (folder / f"ggml-vocab-{golden}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    lines = (folder / f"ggml-vocab-{golden}.gguf.out").read_text().split("\n")[: len(texts)]
    assert len(texts) == 46
    for text, line in zip(texts, lines, strict=True):
        ids = [int(x) for x in line.split()]
        ours = joined(vocab, ids)
        if name in SENTENCEPIECE_REFERENCE:
            assert ours == sp_decode_mid(sentencepiece_reference(tokdir, name), ids)
            assert ours == (b" " + text.encode() if text else b"")  # SentencePiece's dummy prefix
        else:
            assert ours == tiktoken_reference(tokdir, name).decode_bytes(ids)
            assert ours == text.encode()


@pytest.mark.parametrize("name", sorted(TIKTOKEN_REFERENCE))
def test_every_token_matches_tiktoken(name, tokdir):
    vocab, ref = cached_vocab(name), tiktoken_reference(tokdir, name)
    bad = [i for i in range(ref.n_vocab) if vocab.token_bytes[i] != ref.decode_single_token_bytes(i)]
    assert bad == []
    invalid_alone = [i for i in vocab.normal_ids()[:5000] if not _is_utf8(vocab.token_bytes[i])]
    assert invalid_alone, "byte-level vocabularies hold tokens that are not UTF-8 on their own"


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("name", sorted(TIKTOKEN_REFERENCE))
def test_random_sequences_match_tiktoken(name, tokdir):
    vocab, ref, rng = cached_vocab(name), tiktoken_reference(tokdir, name), random.Random(name)
    normal = vocab.normal_ids()
    for _ in range(300):
        ids = rng.choices(normal, k=rng.randrange(1, 40))
        assert joined(vocab, ids) == ref.decode_bytes(ids), ids


@pytest.mark.parametrize("name", sorted(SENTENCEPIECE_REFERENCE))
def test_every_piece_matches_sentencepiece(name, tokdir):
    vocab, processor = cached_vocab(name), sentencepiece_reference(tokdir, name)
    for idx in range(processor.get_piece_size()):
        if processor.is_control(idx) or processor.is_unknown(idx):
            assert idx in vocab.special_ids and vocab.token_bytes[idx] == b""
        elif processor.is_byte(idx):
            assert vocab.token_bytes[idx] == bytes([int(processor.id_to_piece(idx)[3:5], 16)])
        else:
            assert vocab.token_bytes[idx] == sp_decode_mid(processor, [idx]), processor.id_to_piece(idx)


@pytest.mark.parametrize("name", sorted(SENTENCEPIECE_REFERENCE))
def test_random_sequences_match_sentencepiece(name, tokdir):
    vocab, processor, rng = cached_vocab(name), sentencepiece_reference(tokdir, name), random.Random(name)
    for _ in range(300):
        ids = valid_utf8_units(vocab, rng, processor, rng.randrange(1, 30))
        assert joined(vocab, ids) == sp_decode_mid(processor, ids), ids
    assert vocab.token_bytes[processor.piece_to_id("▁foo")] == b" foo"  # the leading-space rule


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_random_sequences_match_hf_tokenizers(name, tokdir):
    from tokenizers import Tokenizer, decoders, models

    folder = tokdir / name
    ref = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    ref.decoder = decoders.ByteLevel()
    vocab, rng = cached_vocab(name), random.Random(name)
    normal = vocab.normal_ids()
    for _ in range(200):  # arbitrary ids: invalid UTF-8 is replaced the same way on both sides
        ids = rng.choices(normal, k=rng.randrange(1, 40))
        assert joined(vocab, ids).decode("utf-8", "replace") == ref.decode(ids), ids


def test_mistral_tokenizer_json_matches_its_sentencepiece_model(tokdir):
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(tokdir / "mistral-v0.3" / "tokenizer.json"))
    vocab = cached_vocab("mistral-v0.3")
    processor, rng = sentencepiece_reference(tokdir, "mistral-v0.3"), random.Random(7)
    anchor = ref.token_to_id("a")
    for _ in range(200):
        ids = valid_utf8_units(vocab, rng, processor, rng.randrange(1, 30))
        assert b"a" + joined(vocab, ids) == ref.decode([anchor, *ids]).encode(), ids
    from_spm = load(tokdir / "mistral-v0.3" / "tokenizer.model.v3")
    assert from_spm.token_bytes == vocab.token_bytes and from_spm.special_ids == vocab.special_ids


@pytest.mark.parametrize("name, file", [("gpt2", "gpt2/r50k_base.tiktoken"), ("qwen2", "qwen2/qwen.tiktoken")])
def test_hf_files_and_tiktoken_file_agree(name, file, tokdir):
    from_ranks = load(tokdir / file)
    vocab = cached_vocab(name)
    assert from_ranks.format == "tiktoken" and vocab.format == "hf-bpe"
    assert from_ranks.token_bytes == vocab.token_bytes and from_ranks.special_ids == vocab.special_ids


def test_duplicate_bytes_stay_distinct_ids(data_dir):
    vocab = cached_vocab("llama2")
    by_bytes: dict[bytes, list[int]] = {}
    for idx in vocab.normal_ids():
        by_bytes.setdefault(vocab.token_bytes[idx], []).append(idx)
    shared = {b: ids for b, ids in by_bytes.items() if len(ids) > 1}
    assert b"A" in shared and len(shared[b"A"]) == 2  # the piece "A" and byte-fallback <0x41>
    assert vocab.vocab_size == 32000


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_many_random_sequences(name, tokdir):
    vocab, rng = cached_vocab(name), random.Random(f"slow-{name}")
    if name in TIKTOKEN_REFERENCE:
        ref, normal = tiktoken_reference(tokdir, name), vocab.normal_ids()
        for _ in range(5000):
            ids = rng.choices(normal, k=rng.randrange(1, 100))
            assert joined(vocab, ids) == ref.decode_bytes(ids)
    else:
        processor = sentencepiece_reference(tokdir, name)
        for _ in range(3000):
            ids = valid_utf8_units(vocab, rng, processor, rng.randrange(1, 80))
            assert joined(vocab, ids) == sp_decode_mid(processor, ids)


# --- tokenizer objects -------------------------------------------------------------------------
def test_transformers_tokenizer_object(tokdir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokdir / "qwen2"))  # a local directory: nothing downloaded
    vocab, files = load(tokenizer), cached_vocab("qwen2")
    assert vocab.format == "transformers"
    assert vocab.token_bytes == files.token_bytes and vocab.special_ids == files.special_ids
    assert vocab.stop_ids == files.stop_ids and vocab.eos_id == tokenizer.eos_token_id


def test_saved_tokenizer_json_matches_source_files(tokdir, tmp_path):
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(tokdir / "qwen2")).save_pretrained(str(tmp_path))
    vocab, files = load(tmp_path / "tokenizer.json"), cached_vocab("qwen2")
    assert vocab.format == "hf-tokenizer-json"
    assert vocab.token_bytes == files.token_bytes and vocab.special_ids == files.special_ids
    assert vocab.stop_ids == files.stop_ids and vocab.eos_id == files.eos_id


def test_tiktoken_encoding_object(tokdir):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(tokdir / "cl100k_base" / "cl100k_base.tiktoken"))
    specials = cached_vocab("cl100k_base").special_tokens
    named = {t: i for t, i in specials.items()}
    encoding = tiktoken.Encoding(name="cl100k_base", pat_str=r"\S+", mergeable_ranks=ranks, special_tokens=named)
    vocab = load(encoding)
    assert vocab.token_bytes == cached_vocab("cl100k_base").token_bytes
    assert vocab.special_ids == cached_vocab("cl100k_base").special_ids


def test_sentencepiece_backed_object(tokdir):
    class SlowTokenizer:  # what a SentencePiece-backed (slow) transformers tokenizer exposes
        sp_model = sentencepiece_reference(tokdir, "llama2")
        eos_token_id = 2

    vocab = load(SlowTokenizer())
    assert vocab.token_bytes == cached_vocab("llama2").token_bytes and vocab.stop_ids == (2,)


# --- small synthetic vocabularies (no shared data needed) --------------------------------------
def write_bpe(folder: Path, vocab: dict, merges: list[str], **extra_json) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    for file, content in extra_json.items():
        (folder / f"{file}.json").write_text(json.dumps(content))
    return folder


def test_byte_level_bpe_files(tmp_path):
    vocab = {"a": 0, "b": 1, "Ġ": 2, "Ġa": 3, "Ġab": 4, "Ã": 5, "©": 6, "Ã©": 7, "<|endoftext|>": 8, "ba": 10}
    folder = write_bpe(tmp_path / "tok", vocab, ["Ġ a", "Ġa b", "Ã ©"],
                       tokenizer_config={"added_tokens_decoder": {"9": {"content": "<tool>", "special": False}}})
    loaded = load(folder)
    assert loaded.token_bytes[3] == b" a" and loaded.token_bytes[4] == b" ab"
    assert loaded.token_bytes[5] == b"\xc3" and loaded.token_bytes[7] == "é".encode()
    assert loaded.special_ids == {8} and loaded.stop_ids == (8,) and loaded.token_bytes[9] == b"<tool>"
    assert loaded.token_bytes[10] == b"ba"  # unreachable by merges but not control-shaped: kept
    assert load_vocab(folder / "vocab.json", logits_width=16).logits_width == 16


def test_tokenizer_json_matches_tokenizers_library(tmp_path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    pieces = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5, "▁": 6, "f": 7,
              "o": 8, "▁f": 9, "oo": 10, "▁foo": 11, "é": 12}
    tok = Tokenizer(models.BPE(pieces, [("▁", "f"), ("o", "o"), ("▁f", "oo")], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    vocab = load(tmp_path)
    assert vocab.format == "hf-tokenizer-json" and vocab.special_ids == {0, 1, 2} and vocab.stop_ids == (2,)
    rng = random.Random(3)
    for _ in range(200):
        ids = rng.choices([3, 6, 7, 8, 9, 10, 11, 12, 4, 5], k=rng.randrange(1, 12))
        ids = [i for i in ids if i not in (4, 5)] + [4, 5]  # keep byte fallback spelling whole "é"
        assert joined(vocab, ids) == tok.decode(ids).encode()


# --- fingerprint -------------------------------------------------------------------------------
def small_vocab(**changes) -> Vocab:
    base = dict(token_bytes=(b"a", b"bc", b"", b"\xc3"), special_ids=frozenset({2}), stop_ids=(2,),
                logits_width=8, format="hf-bpe", name="small")
    return Vocab(**{**base, **changes})


def test_fingerprint_tracks_every_token():
    base = small_vocab().fingerprint
    assert base == small_vocab(name="renamed", format="tiktoken").fingerprint  # bytes, not labels
    variants = [
        small_vocab(token_bytes=(b"b", b"bc", b"", b"\xc3")),
        small_vocab(token_bytes=(b"ab", b"c", b"", b"\xc3")),  # same concatenation, other split
        small_vocab(token_bytes=(b"a", b"bc", b"", b"\xc4")),
        small_vocab(token_bytes=(b"a", b"bc", b"", b"\xc3", b"d")),
        small_vocab(special_ids=frozenset({2, 3})),
        small_vocab(stop_ids=()),
        small_vocab(logits_width=9),
    ]
    fingerprints = {v.fingerprint for v in variants}
    assert len(fingerprints) == len(variants) and base not in fingerprints


def test_fingerprint_changes_with_one_real_token(data_dir):
    vocab = cached_vocab("llama2")
    for idx in (3, 16000, 31999):
        changed = list(vocab.token_bytes)
        changed[idx] += b"x"
        assert dataclasses.replace(vocab, token_bytes=tuple(changed)).fingerprint != vocab.fingerprint


def test_fingerprint_stable_across_processes(data_dir):
    code = "from surecall.grammars.vocab.loaders import load_shared; print(load_shared('llama2').fingerprint)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == cached_vocab("llama2").fingerprint == load_shared("llama2").fingerprint


# --- bad input ---------------------------------------------------------------------------------
def test_missing_path():
    with pytest.raises(VocabError, match=r"tokenizer path not found: .*nowhere.*expected a local directory"):
        load("/nowhere/at/all")


def test_hub_id_is_refused_without_download():
    with pytest.raises(VocabError, match=r"meta-llama/Llama-3.1-8B.*never downloads; pass a local directory"):
        load("meta-llama/Llama-3.1-8B")


def test_empty_directory(tmp_path):
    with pytest.raises(VocabError, match=r"cannot choose a tokenizer in .*found nothing; expected .*tokenizer.json"):
        load(tmp_path)


def test_unknown_format(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"\x00\xffnot a tokenizer at all")
    with pytest.raises(VocabError, match=r"tokenizer.model is not a tokenizer this loader knows: expected a SentencePiece"):
        load(tmp_path)


def test_corrupt_merges(tmp_path):
    folder = write_bpe(tmp_path, {"a": 0, "b": 1, "ab": 2}, ["a b", "x y"])
    with pytest.raises(VocabError, match=r"corrupt merges in .*merges.txt at line 3: 'x y' uses 'x'"):
        load(folder)
    (folder / "merges.txt").write_text("a b c\n")
    with pytest.raises(VocabError, match=r"corrupt merges in .*merges.txt at line 1: .*expected two tokens"):
        load(folder / "merges.txt")


def test_vocab_json_without_merges(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0}))
    with pytest.raises(VocabError, match=r"missing tokenizer file .*merges.txt: expected merges.txt beside vocab.json"):
        load(tmp_path)


def test_bad_vocab_json(tmp_path):
    write_bpe(tmp_path, {"a": 0}, [])
    (tmp_path / "vocab.json").write_text("{not json")
    with pytest.raises(VocabError, match=r"vocab.json is not valid JSON: expected a JSON object"):
        load(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 0}))
    with pytest.raises(VocabError, match=r"id 0 is given to both 'a' and 'b'"):
        load(tmp_path)


def test_corrupt_tiktoken(tmp_path):
    path = tmp_path / "x.tiktoken"
    path.write_text("IQ== 0\nnot-base64!! 1\n")
    with pytest.raises(VocabError, match=r"corrupt tiktoken ranks in .*x.tiktoken at line 2"):
        load(path)


def test_tiktoken_file_of_unknown_family(tmp_path):
    import base64

    path = tmp_path / "small.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate([b"a", b"\xe2\x82", b" b"])))
    bare = load(path)
    assert bare.token_bytes == (b"a", b"\xe2\x82", b" b") and not bare.special_ids and bare.stop_ids == ()
    named = load(path, special_tokens={"<|endoftext|>": 4})
    assert named.vocab_size == 5 and named.special_ids == {3, 4} and named.stop_ids == (4,)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    path.chmod(0)
    with pytest.raises(VocabError, match=r"cannot read .*tokenizer.json"):
        load(path)


def test_undecodable_file(tmp_path):
    write_bpe(tmp_path, {"a": 0}, [])
    (tmp_path / "vocab.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(VocabError, match=r"cannot read .*vocab.json: expected a JSON object mapping token text to id"):
        load(tmp_path)


def test_unsupported_tokenizer_json_model(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    with pytest.raises(VocabError, match=r"tokenizer.json: tokenizer model type 'WordPiece' is not supported"):
        load(tmp_path)


def test_logits_width_smaller_than_tokenizer(tmp_path):
    write_bpe(tmp_path, {"a": 0, "b": 1}, [])
    with pytest.raises(VocabError, match=r"logits width 1 is smaller than the tokenizer's size 2"):
        load(tmp_path, logits_width=1)
    with pytest.raises(VocabError, match=r"logits width '64' is not an integer"):
        load(tmp_path, logits_width="64")


def test_unknown_shared_name_and_object():
    with pytest.raises(VocabError, match=r"unknown shared vocabulary 'gpt5': expected one of"):
        load_shared("gpt5")
    with pytest.raises(VocabError, match=r"unsupported tokenizer object int"):
        load(42)


# --- CLI ---------------------------------------------------------------------------------------
def test_cli_text(tokdir, capsys):
    path = str(tokdir / "llama3" / "tokenizer.model")
    assert main(["vocab", path, "--logits-width", "128512"]) == 0
    out = capsys.readouterr().out
    vocab = load(path, logits_width=128512)
    assert "format:         tiktoken" in out and "tokenizer size: 128256" in out
    assert "logits width:   128512 (256 padded ids" in out
    assert "special ids:    256 [128000..128255]" in out
    assert "128009 <|eot_id|>" in out and vocab.fingerprint in out


def test_cli_json(tokdir, capsys):
    assert main(["vocab", str(tokdir / "mistral-v0.3"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    vocab = cached_vocab("mistral-v0.3")
    assert data["format"] == "hf-tokenizer-json" and data["vocab_size"] == 32768
    assert data["special_ids"] == sorted(vocab.special_ids) and data["special_id_ranges"] == [[0, 770]]
    assert data["stop_tokens"] == {"2": "</s>"} and data["fingerprint"] == vocab.fingerprint


def test_cli_shared_and_abbreviation(data_dir, capsys):
    assert main(["vocab", "shared:cl100k_base"]) == 0
    out = capsys.readouterr().out
    assert "special ids:    21 [100256..100276]" in out


def test_cli_error_exit(capsys):
    assert main(["vocab", "meta-llama/Llama-3.1-8B"]) == 2
    assert "pass a local directory" in capsys.readouterr().err


def test_load_vocab_takes_the_shared_spec(data_dir):
    """`load_vocab("shared:NAME")` is the CLI's --tokenizer spec: the shared file with its model's logits width."""
    vocab = load_vocab("shared:llama2")
    assert vocab.fingerprint == cached_vocab("llama2").fingerprint
    assert vocab.logits_width == load_shared("llama2").logits_width == 32000
    with pytest.raises(VocabError, match="unknown shared vocabulary 'gpt5'"):
        load_vocab("shared:gpt5")
