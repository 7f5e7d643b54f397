"""The synthetic tool-call corpus for the seed's four-tool catalog (deterministic from a seed).

Each row is a user request in natural language paired with the one correct call:
{"messages": [{"role": "user", "content": ...}], "tool": name, "arguments": {...}}. The
arguments carry what makes JSON hard (quotes, backslashes, tabs, newlines, unicode, long
strings, numbers at their schema bounds) and always validate against the seed schemas. The
held-out split uses another seed, names the training split never sees, and phrasings kept out
of training. This module does not tokenize (tokenizer.py) or train (train.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from surecall.models.training import snippets as sn

SPLITS = ("train", "heldout")
SPLIT_SALT = {"train": 0, "heldout": 7_919}
_Builder = Callable[[random.Random, str], tuple[str, dict]]


@dataclass(frozen=True)
class CorpusConfig:
    """How many rows of which split, from which seed."""

    num_rows: int
    seed: int = 0
    split: str = "train"

    def __post_init__(self) -> None:
        if not isinstance(self.num_rows, int) or self.num_rows < 1:
            raise ValueError(f"Invalid num_rows: expected a positive int, got {self.num_rows!r}")
        if self.split not in SPLITS:
            raise ValueError(f"Invalid split: expected one of {SPLITS}, got {self.split!r}")


def render_call(tool: str, arguments: dict) -> str:
    """The Hermes-style completion text the model is trained to emit (before its stop token)."""
    body = json.dumps({"name": tool, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def show(text: str) -> str:
    """Quote a string for the request: inline backticks for one line, a fence otherwise."""
    if "\n" in text or "`" in text:
        return f"\n```\n{text}\n```\n"
    return f"`{text}`"


# --- file_view ---------------------------------------------------------------------------
def _limit(rng: random.Random) -> int:
    return rng.choice([1, 500, rng.randint(2, 499), rng.randint(5, 80), rng.randint(5, 80)])


def _offset(rng: random.Random) -> int:
    return rng.choice([1, 10_000_000, rng.randint(2, 9_999_999), rng.randint(2, 2_000)]
                      + [rng.randint(2, 300)] * 3)


def _view_whole(rng, split):
    p = sn.path(rng, split)
    text = rng.choice(["Show me {p}", "Open {p}", "cat {p} for me", "What's in {p}?",
                       "Let me see the file {p}", "Display {p}."]).format(p=show(p))
    return text, {"path": p}


def _view_from(rng, split):
    p, o = sn.path(rng, split), _offset(rng)
    text = rng.choice(["Open {p} at line {o}", "Show {p} starting from line {o}",
                       "View {p} from line {o} on"]).format(p=show(p), o=o)
    return text, {"path": p, "offset": o}


def _view_window(rng, split):
    p, o, n = sn.path(rng, split), _offset(rng), _limit(rng)
    text = rng.choice(["Show {n} lines of {p} starting at line {o}",
                       "View {p}, {n} lines from line {o}",
                       "Read {p} from line {o}, limit {n} lines"]).format(p=show(p), o=o, n=n)
    return text, {"path": p, "offset": o, "limit": n}


def _view_range(rng, split):
    p, o = sn.path(rng, split), rng.randint(1, 400)
    end = o + rng.randint(0, 60)
    text = rng.choice(["View lines {o}-{e} of {p}", "Show me lines {o} to {e} in {p}",
                       "print lines {o} through {e} of {p}"]).format(p=show(p), o=o, e=end)
    return text, {"path": p, "offset": o, "limit": end - o + 1}


def _view_head(rng, split):
    p, n = sn.path(rng, split), _limit(rng)
    text = rng.choice(["Read the first {n} lines of {p}", "head {p}, {n} lines",
                       "Give me the top {n} lines of {p}"]).format(p=show(p), n=n)
    return text, {"path": p, "limit": n}


def _view_heldout(rng, split):
    p, o, n = sn.path(rng, split), _offset(rng), _limit(rng)
    text = f"Could you pull up {show(p)}? I need {n} lines beginning at line {o}."
    return text, {"path": p, "offset": o, "limit": n}


# --- file_edit ---------------------------------------------------------------------------
def _edit_pair(rng: random.Random, split: str, max_lines: int) -> tuple[str, str]:
    old = sn.code_block(rng, max_lines, split)
    mode = rng.random()
    if mode < 0.5:
        new = sn.code_block(rng, max_lines, split)
    elif mode < 0.8:
        new = old.replace(sn.ident(rng, split), sn.ident(rng, split)) + "\n" + sn.code_line(rng)
    else:
        new = old.replace("    ", "\t")
    if new == old:
        new = old + "\n" + sn.code_line(rng, split)
    return old, new


def _edit_block(rng, split):
    p = sn.path(rng, split)
    old, new = _edit_pair(rng, split, rng.choice([3, 6, 9]))
    text = rng.choice(["In {p}, replace{o}with{n}", "Edit {p}: change{o}to{n}",
                       "Please swap this block in {p}:{o}for{n}"]).format(
        p=show(p), o=_show_block(old), n=_show_block(new))
    return text, {"path": p, "old_str": old, "new_str": new}


def _show_block(text: str) -> str:
    return f"\n```\n{text}\n```\n"


def _edit_inline(rng, split):
    p, old, new = sn.path(rng, split), sn.code_line(rng, split), sn.code_line(rng, split)
    text = rng.choice(["Change {o} to {n} in {p}", "In {p} replace {o} with {n}",
                       "{p}: {o} should be {n}"]).format(p=show(p), o=show(old), n=show(new))
    return text, {"path": p, "old_str": old, "new_str": new}


def _edit_all(rng, split):
    p, old, new = sn.path(rng, split), sn.ident(rng, split), sn.ident(rng, split) + "_"
    text = rng.choice(["Rename every {o} to {n} in {p}",
                       "Replace all occurrences of {o} with {n} in {p}"]).format(
        p=show(p), o=show(old), n=show(new))
    return text, {"path": p, "old_str": old, "new_str": new, "allow_multiple": True}


def _edit_delete(rng, split):
    p, old = sn.path(rng, split), sn.code_line(rng, split)
    text = rng.choice(["Delete the line {o} from {p}", "Remove {o} in {p}"]).format(
        p=show(p), o=show(old))
    return text, {"path": p, "old_str": old, "new_str": ""}


def _edit_heldout(rng, split):
    p = sn.path(rng, split)
    old, new = _edit_pair(rng, split, 6)
    text = f"There's a bug in {show(p)}. The code{_show_block(old)}needs to become{_show_block(new)}"
    return text, {"path": p, "old_str": old, "new_str": new}


# --- grep_search -------------------------------------------------------------------------
def _grep_todos(rng, split):
    g, marker = sn.glob(rng), rng.choice(["TODO", "FIXME", "TODO|FIXME", "XXX"])
    text = rng.choice(["Find {m}s in {g}", "find {m} comments in {g} files",
                       "List all {m} markers in {g} files"]).format(m=marker, g=show(g))
    return text, {"pattern": marker, "glob": g}


def _grep_plain(rng, split):
    pat = sn.pattern(rng, split)
    text = rng.choice(["Search for {r}", "grep {r}", "Where does {r} appear?",
                       "Look for the regex {r}"]).format(r=show(pat))
    return text, {"pattern": pat}


def _grep_dir(rng, split):
    pat, d = sn.pattern(rng, split), sn.directory(rng)
    text = rng.choice(["Search {d} for {r}", "grep for {r} under {d}",
                       "Find matches of {r} in {d}"]).format(r=show(pat), d=show(d))
    return text, {"pattern": pat, "path": d}


def _grep_full(rng, split):
    pat, d, g = sn.pattern(rng, split), sn.directory(rng), sn.glob(rng)
    text = rng.choice(["Search {g} files under {d} for {r}",
                       "grep {r} in {d}, only {g}"]).format(r=show(pat), d=show(d), g=show(g))
    return text, {"pattern": pat, "path": d, "glob": g}


def _grep_heldout(rng, split):
    pat, g = sn.pattern(rng, split), sn.glob(rng)
    text = f"I'm looking for lines matching {show(pat)}; restrict it to {show(g)} please."
    return text, {"pattern": pat, "glob": g}


# --- bash_execute ------------------------------------------------------------------------
_NAMED_TIMEOUTS = [("a two-minute timeout", 120_000), ("two minutes", 120_000),
                   ("one minute", 60_000), ("five minutes", 300_000), ("one second", 1_000),
                   ("30 seconds", 30_000), ("90 seconds", 90_000), ("ten seconds", 10_000)]


def _timeout(rng: random.Random) -> tuple[str, int]:
    r = rng.random()
    if r < 0.35:
        return rng.choice(_NAMED_TIMEOUTS)
    if r < 0.6:
        s = rng.choice([1, 300, rng.randint(2, 299)])
        return f"{s} second{'s' if s != 1 else ''}", s * 1000
    ms = rng.choice([1000, 300_000, rng.randint(1001, 299_999)])
    return f"{ms} ms", ms


def _bash_plain(rng, split):
    cmd = sn.command(rng, split)
    text = rng.choice(["Run {c}", "Execute {c}", "Please run {c} in the workspace",
                       "shell: {c}"]).format(c=show(cmd))
    return text, {"command": cmd}


def _bash_timeout(rng, split):
    cmd = sn.command(rng, split)
    phrase, ms = _timeout(rng)
    text = rng.choice(["Run {c} with a timeout of {t}", "Execute {c}, give it {t}",
                       "Run {c} and kill it after {t}"]).format(c=show(cmd), t=phrase)
    return text, {"command": cmd, "timeout_ms": ms}


def _bash_tests(rng, split):
    cmd = rng.choice(["pytest -q", "make test", "npm test", "cargo test", "go test ./..."])
    phrase, ms = _timeout(rng)
    text = rng.choice(["Run the tests with {t} ({c})", "run the test suite via {c}, timeout {t}"]
                      ).format(c=show(cmd), t=phrase)
    return text, {"command": cmd, "timeout_ms": ms}


def _bash_heldout(rng, split):
    cmd = sn.command(rng, split)
    phrase, ms = _timeout(rng)
    text = f"Can you kick off {show(cmd)}? Don't let it go longer than {phrase}."
    return text, {"command": cmd, "timeout_ms": ms}


# Each tool: (builders used by both splits, builders reserved for the held-out split).
_BUILDERS: dict[str, tuple[list[_Builder], list[_Builder]]] = {
    "file_view": ([_view_whole, _view_from, _view_window, _view_range, _view_head],
                  [_view_heldout]),
    "file_edit": ([_edit_block, _edit_block, _edit_inline, _edit_all, _edit_delete],
                  [_edit_heldout]),
    "grep_search": ([_grep_todos, _grep_plain, _grep_dir, _grep_full], [_grep_heldout]),
    "bash_execute": ([_bash_plain, _bash_timeout, _bash_tests], [_bash_heldout]),
}
TOOL_NAMES = tuple(_BUILDERS)


def request(rng: random.Random, split: str, tool: str | None = None) -> dict:
    """One single-call row: a request for `tool` (a random tool when None) and its call."""
    tool = rng.choice(TOOL_NAMES) if tool is None else tool
    shared, reserved = _BUILDERS[tool]
    use_reserved = split == "heldout" and rng.random() < 0.3
    builder = rng.choice(reserved if use_reserved else shared)
    text, arguments = builder(rng, split)
    if rng.random() < 0.1:
        text = text[0].lower() + text[1:]
    return {"messages": [{"role": "user", "content": text.strip()}], "tool": tool,
            "arguments": arguments}


def generate(config: CorpusConfig) -> list[dict]:
    """`config.num_rows` rows, a pure function of (seed, split)."""
    rng = random.Random(config.seed * 1_000_003 + SPLIT_SALT[config.split])
    return [request(rng, config.split) for _ in range(config.num_rows)]


def code_text(seed: int, num_blocks: int) -> list[str]:
    """Code-like text (blocks, commands, patterns) that the tokenizer also trains on."""
    rng = random.Random(seed + 31)
    out = []
    for _ in range(num_blocks):
        out.append(sn.code_block(rng, 12))
        out.append(sn.command(rng))
        out.append(sn.pattern(rng))
    return out


def write_jsonl(rows: list[dict], path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
