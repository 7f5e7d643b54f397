"""The byte-level BPE tokenizer of surecall-tiny and its chat template.

Trained with `tokenizers` on the corpus (prompts, calls) plus code-like text, and saved in the
Hugging Face format (tokenizer.json + tokenizer_config.json with the Jinja chat template), so
`transformers.AutoTokenizer.from_pretrained(dir)` loads it offline. Pre-tokenization is byte
level after a GPT-2-style word split (escapes kept apart, see PRETOKENIZE_PATTERN), so a
word is the same token in the request and in the call. Training the model is train.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, PAD, EOS = "<|bos|>", "<|pad|>", "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]
DEFAULT_SYSTEM = ("You are a coding assistant. Call tools when a request needs them, "
                  "otherwise answer in text.")
TOOLS_FOOTER = ("\n</tools>\nFor each call, reply with <tool_call>\n"
                "{\"name\": <tool name>, \"arguments\": <JSON object>}\n</tool_call>")

# Qwen2-style (Hermes) rendering. The system block lists each tool as one JSON line (OpenAI
# {"type": "function", ...}, MCP {"inputSchema": ...} and bare {name, parameters} dicts all
# render the same). An assistant turn is its text, or its calls one `<tool_call>` block per line
# (after its text, if any); consecutive `tool` messages share one user turn, one
# `<tool_response>` block each. Jinja string literals take Python escapes ('\n').
# Adapted from the Qwen2.5 chat template (https://huggingface.co/Qwen/Qwen2.5-7B-Instruct,
# tokenizer_config.json).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = messages[0].content -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system_text = '" + DEFAULT_SYSTEM + "' -%}{%- set turns = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n<tools>' -}}"
    "{%- for tool in tools -%}"
    "{%- set fn = tool.function if tool.function is defined else tool -%}"
    "{%- set params = fn.parameters if fn.parameters is defined else fn.inputSchema -%}"
    "{{- '\\n' + ({'name': fn.name, 'description': fn.description, 'parameters': params} | tojson) -}}"
    "{%- endfor -%}"
    "{{- '" + TOOLS_FOOTER.replace("\n", "\\n") + "' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in turns -%}"
    "{%- if m.role == 'assistant' and m.tool_calls is defined and m.tool_calls -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if m.content -%}{{- m.content + '\\n' -}}{%- endif -%}"
    "{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) -%}"
    "{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (f.name | tojson) + ', \"arguments\": ' + args"
    " + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{%- set body = m.content if m.content is string else (m.content | tojson) -%}"
    "{{- '\\n<tool_response>\\n' + body + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


# GPT-2's word split (with _ inside words), plus: a backslash and the character after it form one piece, so a JSON
# escape (\n, \", \\) never fuses with the word that follows it. Words then tokenize the same
# in the request and inside the call's strings, which makes copying an induction task.
# Adapted from the GPT-2 pre-tokenizer regex (https://github.com/openai/gpt-2, encoder.py).
PRETOKENIZE_PATTERN = (r"\\.|'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}_]+| ?\p{N}+| ?[^\s\p{L}\p{N}_\\]+"
                       r"|\s+(?!\S)|\s+|\\")


def system_block(tools: list[dict]) -> str:
    """The text between `<|im_start|>` and `<|im_end|>` of the system turn (for BPE training)."""
    lines = [f"system\n{DEFAULT_SYSTEM}\n\n# Tools\n<tools>"]
    for tool in tools:
        entry = {"name": tool["name"], "description": tool["description"],
                 "parameters": tool["parameters"]}
        lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines) + TOOLS_FOOTER


def train_bpe(texts: list[str], vocab_size: int = 3072, max_token_length: int = 16) -> Tokenizer:
    """A byte-level BPE over `texts` with the chat special tokens at ids 0..4."""
    if vocab_size < 300:
        raise ValueError(f"Invalid vocab_size: expected >= 300 (256 bytes + specials), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), max_token_length=max_token_length)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": IM_END, "pad_token": PAD, "unk_token": None,
        "additional_special_tokens": [EOS, IM_START],
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def save_hf(tokenizer: Tokenizer, out_dir: Path, model_max_length: int = 1024) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = tokenizer_config(model_max_length)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": IM_END, "pad_token": PAD,
         "additional_special_tokens": [EOS, IM_START]}, indent=2) + "\n")
