"""Value pools for the synthetic corpus: paths, code blocks, shell commands, regex patterns.

Each function draws one value from a `random.Random`, so the corpus is a pure function of its
seed. The pools deliberately carry what makes JSON hard to emit: quotes, backslashes, tabs,
newlines, non-ASCII text and long strings. `split` lets the held-out rows draw names that the
training rows never see. This module does not phrase requests or render calls (corpus.py does).
"""

from __future__ import annotations

import random

_DIRS = ["src", "lib", "app", "tests", "pkg", "scripts", "docs", "cmd", "internal", "web",
         "server", "client", "utils", "core", "api", "config", "tools", "examples"]
_SUBDIRS = ["models", "views", "handlers", "db", "auth", "io", "net", "cli", "parser",
            "render", "cache", "jobs", "legacy", "v2", "données", "über", "my project"]
_STEMS = ["main", "app", "utils", "config", "server", "models", "parser", "test_api",
          "README", "setup", "handlers", "index", "schema", "routes", "worker", "helpers",
          "settings", "cli", "core", "types", "errors", "client", "Makefile", "notes",
          "résumé", "日本語", "data_loader", "train", "build", "lexer"]
_HELDOUT_STEMS = ["scheduler", "ledger", "invoice", "graph", "widget", "mailer", "crawler",
                  "tokenizer", "café", "metrics"]
_EXTS = [".py", ".py", ".py", ".js", ".ts", ".md", ".rs", ".go", ".toml", ".json", ".yaml",
         ".txt", ".sh", ".c", ".h", ".cfg", ""]
_IDENTS = ["count", "total", "user_id", "name", "items", "result", "buf", "path", "config",
           "retries", "timeout", "value", "idx", "data", "resp", "token", "cache", "limit"]
_HELDOUT_IDENTS = ["balance", "invoice_id", "rows", "payload", "cursor", "widget"]
_WORDS = ["hello", "world", "error", "done", "failed", "ok", "warning", "naïve", "café",
          "日本", "Grüße", "✓ passed", "→ next", "line", "value", "😀", "ß", "Ωmega"]
_GLOBS = ["*.py", "*.js", "*.ts", "*.md", "*.rs", "*.go", "*.json", "*.yaml", "*.txt",
          "test_*.py", "*.{js,ts}", "*.c", "*.h", "*.toml", "*.sh", "*.cfg"]


def _pick(rng: random.Random, pool: list[str], heldout: list[str] | None, split: str) -> str:
    if heldout and split == "heldout" and rng.random() < 0.5:
        return rng.choice(heldout)
    return rng.choice(pool)


def ident(rng: random.Random, split: str = "train") -> str:
    return _pick(rng, _IDENTS, _HELDOUT_IDENTS, split)


def word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


def path(rng: random.Random, split: str = "train") -> str:
    """A relative file path; sometimes nested, with spaces, unicode or (rarely) backslashes."""
    stem = _pick(rng, _STEMS, _HELDOUT_STEMS, split)
    name = stem + rng.choice(_EXTS)
    parts = [rng.choice(_DIRS)] if rng.random() < 0.8 else []
    if rng.random() < 0.4:
        parts.append(rng.choice(_SUBDIRS))
    parts.append(name)
    sep = "\\" if rng.random() < 0.05 else "/"
    prefix = "./" if rng.random() < 0.1 else ""
    return prefix + sep.join(parts)


def directory(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.2:
        return "."
    if r < 0.7:
        return rng.choice(_DIRS)
    return rng.choice(_DIRS) + "/" + rng.choice(_SUBDIRS)


def glob(rng: random.Random) -> str:
    return rng.choice(_GLOBS)


def _string_literal(rng: random.Random) -> str:
    text = word(rng)
    style = rng.random()
    if style < 0.4:
        return f'"{text}"'
    if style < 0.6:
        return f"'{text}'"
    if style < 0.8:
        return f'"{text}\\n"'
    return f'"say \\"{text}\\""'


def code_line(rng: random.Random, split: str = "train") -> str:
    """One line of code-like text with quotes, escapes or unicode."""
    a, b = ident(rng, split), ident(rng, split)
    forms = [
        lambda: f"{a} = {rng.randint(0, 999)}",
        lambda: f"{a} = {b} + {rng.randint(1, 9)}",
        lambda: f"print({_string_literal(rng)})",
        lambda: f'log.info("{word(rng)}: %s", {a})',
        lambda: f"return {a}",
        lambda: f"if {a} is None:",
        lambda: f"{a} = {b}.get({_string_literal(rng)}, {rng.randint(0, 9)})",
        lambda: f"raise ValueError(f\"bad {a}: {{{a}!r}}\")",
        lambda: f"path = r\"C:\\Users\\{a}\\{word(rng)}.txt\"",
        lambda: "pattern = re.compile(r\"\\d+\\.\\d*\")",
        lambda: f"const {a} = `${{{b}}}`;",
        lambda: f"let {a} = \"{word(rng)}\";",
        lambda: f"# TODO: handle {a} == {b}",
        lambda: f"// FIXME: {word(rng)} when {a} < 0",
        lambda: f"{a}.append(\"\\t\".join({b}))",
        lambda: f"msg = '{word(rng)}' + \"\\\\\"",
    ]
    return rng.choice(forms)()


def code_block(rng: random.Random, max_lines: int = 8, split: str = "train") -> str:
    """Several lines of indented code; indentation is spaces or (sometimes) tabs."""
    num_lines = rng.randint(1, max_lines)
    indent = "\t" if rng.random() < 0.25 else "    "
    lines = []
    depth = 0
    for _ in range(num_lines):
        line = code_line(rng, split)
        lines.append(indent * depth + line)
        depth = min(depth + 1, 2) if line.endswith(":") else max(depth - (rng.random() < 0.3), 0)
    if rng.random() < 0.3:
        header = f"def {ident(rng, split)}({ident(rng, split)}):"
        lines = [header] + [indent + line for line in lines]
    return "\n".join(lines)


_COMMANDS = [
    "pytest -q", "pytest -x tests/", "python -m pytest -q -k {ident}", "make test", "make",
    "cargo test", "go test ./...", "npm test", "ls -la {dir}", "git status", "git diff --stat",
    "git log --oneline -n {n}", "wc -l {path}", "cat {path}", "head -n {n} {path}",
    "python {path}", "ruff check .", "mypy {dir}", "du -sh {dir}", "find {dir} -name '{glob}'",
    "grep -rn \"{word}\" {dir}", "echo \"{word}\" > out.txt", "sed -n '{n},{m}p' {path}",
    "python -c 'print(\"{word}\")'", "printf '%s\\t%s\\n' {ident} {word}",
    "find . -name '*.pyc' -delete", "grep -rn \"TODO\\|FIXME\" {dir}",
    "tar czf backup.tgz {dir}", "echo \"it's \\\"quoted\\\"\"", "ls {dir} | wc -l",
    "cat <<'EOF' > {path}\n{code}\nEOF",
    "for f in {dir}/*; do\n\techo \"$f\"\ndone",
    "python - <<'EOF'\n{code}\nEOF",
]


def command(rng: random.Random, split: str = "train") -> str:
    """A shell command; some span several lines (heredocs, loops) or carry tabs and quotes."""
    template = rng.choice(_COMMANDS)
    return template.format(
        ident=ident(rng, split), dir=directory(rng), n=rng.randint(1, 50), m=rng.randint(51, 99),
        path=path(rng, split), glob=glob(rng), word=word(rng).replace("'", ""),
        code=code_block(rng, 4, split) if "{code}" in template else "",
    )


_PATTERNS = [
    "TODO", "FIXME", "TODO|FIXME", "def {ident}", "class \\w+", "import {ident}",
    "def \\w+\\(", "\\b{ident}\\b", "\\d{{3}}-\\d{{4}}", "\"[^\"]*\"", "print\\(",
    "^\\s*#", "{ident}\\s*=", "raise \\w+Error", "https?://\\S+", "[A-Z]{{2,}}_[A-Z]+",
    "\\t", "{word}", "async def", "\\$\\{{\\w+\\}}",
]


def pattern(rng: random.Random, split: str = "train") -> str:
    return rng.choice(_PATTERNS).format(ident=ident(rng, split), word=word(rng))
