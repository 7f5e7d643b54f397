"""Which shared schemas' grammars a change touches: schema -> regex at two commits, compared.

Runs schema -> regex (splice on, as `compile_schema` converts first) over every shared schema
(JSONSchemaBench's 2,584 and the 878 tools, `compile.load_subsets`) with the code of `--base` (a
git worktree made for the run, removed after) and with this checkout, in two child processes at
once, and hashes per schema the regex, its pieces and its relaxed and narrowed lists (a timeout or
a typed error is recorded as such). Prints the ids whose hash differs, one per line, to `--out`
(stdout by default) and a count per subset to stderr. Use it to pick what to rerun after a
change, e.g. `sweep_all.py --redo-ids @FILE`, and to check a refactor changed no grammar.

  SURECALL_DATA=../shared/data .venv/bin/python benchmarks/grammar_diff.py --base HEAD~3 --out /tmp/changed.txt
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--out", default="-", help="where the changed ids go, one per line (- for stdout)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="schema -> regex time limit per schema")
    parser.add_argument("--hashes", help=argparse.SUPPRESS)  # child mode: write {id: hash} here
    args = parser.parse_args(argv)
    if args.hashes:
        return _hash_all(Path(args.hashes), args.timeout_s)
    rev = subprocess.run(["git", "rev-parse", "--verify", f"{args.base}^{{commit}}"], cwd=_ROOT, capture_output=True,
                         text=True)
    if rev.returncode:
        print(f"grammar_diff: --base {args.base!r} is not a commit here", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="surecall-grammar-diff-"))
    tree = work / "base"
    try:
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev.stdout.strip()], cwd=_ROOT, check=True)
        path_dir = _package_view(tree, work / "path")  # the base's package importable as `surecall`
        base_out, head_out = work / "base.json", work / "head.json"
        me = [sys.executable, str(Path(__file__).resolve()), "--base", "-", "--timeout-s", str(args.timeout_s)]
        env = dict(os.environ, PYTHONPATH=str(path_dir))
        procs = [subprocess.Popen([*me, "--hashes", str(base_out)], cwd=tree, env=env),
                 subprocess.Popen([*me, "--hashes", str(head_out)], cwd=_ROOT)]
        if any(p.wait() for p in procs):
            print("grammar_diff: a child failed (its error is above)", file=sys.stderr)
            return 1
        base, head = json.loads(base_out.read_text()), json.loads(head_out.read_text())
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=_ROOT, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    changed = sorted(k for k in head if base.get(k, [None, None])[1] != head[k][1])
    text = "".join(k + "\n" for k in changed)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    per = collections.Counter(head[k][0] for k in changed)
    kinds = collections.Counter(f"{_kind(base.get(k, [None, None])[1])} -> {_kind(head[k][1])}" for k in changed)
    print(f"{len(changed)} of {len(head)} schemas changed since {args.base}: {dict(per)}; {dict(kinds)}",
          file=sys.stderr)
    return 0


def _kind(h: str | None) -> str:
    return "absent" if h is None else "timeout" if h == "timeout" else "error" if h.startswith("error:") else "regex"


def _package_view(tree: Path, into: Path) -> Path:
    """A folder whose `surecall` package is the worktree's code (engine/ with grammars/ and
    kernels/ linked in, as the editable install maps them)."""
    pkg = into / "surecall"
    shutil.copytree(tree / "engine", pkg, symlinks=True)
    for sub in ("grammars", "kernels"):
        (pkg / sub).symlink_to(tree / sub)
    return into


class _TimeUp(Exception):
    pass


def _hash_all(out: Path, timeout_s: float) -> int:
    """Child: {id: [subset, hash of schema -> regex]} for every shared schema, written to `out`."""
    sys.path.insert(0, str(Path.cwd() / "benchmarks"))
    import compile as bench  # the checkout's own loader (cwd: the base worktree or this checkout)

    from surecall.grammars.options import GrammarOptions
    from surecall.grammars.schema.to_regex import schema_to_regex
    from surecall.grammars.vocab.shared import shared_data_dir

    def time_up(*_):
        raise _TimeUp

    signal.signal(signal.SIGALRM, time_up)
    hashes = {}
    for subset, rows in bench.load_subsets(shared_data_dir(), 100_000, 0, set()).items():
        for schema_id, schema, _tests in rows:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                r = schema_to_regex(schema, GrammarOptions(), splice=True)
                h = hashlib.sha1(r.regex.encode("utf-8", "surrogatepass"))
                for piece in r.pieces:
                    h.update(b"\x00" + piece.encode("utf-8", "surrogatepass"))
                h.update(repr(sorted(r.relaxed)).encode())
                h.update(repr(sorted(r.narrowed)).encode())
                hashes[schema_id] = [subset, h.hexdigest()]
            except _TimeUp:
                hashes[schema_id] = [subset, "timeout"]
            except Exception as exc:  # noqa: BLE001 - a typed error is a result here
                hashes[schema_id] = [subset, f"error: {type(exc).__name__}: {str(exc)[:200]}"]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    out.write_text(json.dumps(hashes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
