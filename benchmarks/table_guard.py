"""Table guard for compile-speed work: dump every TokenTable field for a fixed schema set, compare two dumps.

Compiles the seed catalog (three option sets) and a fixed-seed sample of the shared
JSONSchemaBench subsets and tool files, and pickles each table's arrays (plus
`dense_transitions()`) or the error's type name. The mask is stored logically, as its distinct
rows expanded to dense words under "mask" (the field before issue 15's blocks), so a change of
the mask's storage compares with a dump taken before it. Run it with two checkouts'
interpreters, then `--compare A B`: a speed change must leave every table byte-identical. It
checks equality only; `benchmarks/compile.py` measures.

  .venv/bin/python benchmarks/table_guard.py --out /tmp/guard_after   # (and /tmp/guard_before from main)
  .venv/bin/python benchmarks/table_guard.py --compare /tmp/guard_before /tmp/guard_after
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cases(data: Path, per_file: int, seed: int) -> list[tuple]:
    """(name, schema, options or None): the seed catalog three ways, the GitHub MCP tools and the first
    100 BFCL tools as catalogs, then per_file schemas of each file."""
    from compile import catalog_union_schema

    from surecall.grammars.options import GrammarOptions
    from surecall.tools.catalog import seed_tools

    union = catalog_union_schema(seed_tools())
    out = [("seed_union", union, None), ("seed_union_open", union, GrammarOptions(allow_additional_properties=True)),
           ("seed_union_nocount", union, GrammarOptions(counted_lengths=False))]
    from compile import _schema_of

    tools = {f.stem: [json.loads(line) for line in f.open()] for f in sorted((data / "tools").glob("*.jsonl"))}
    for stem, first in (("github_mcp_tools", None), ("bfcl_tools", 100)):  # whole catalogs: splice pieces and
        calls = [dict(t, parameters=_schema_of(t)) for t in tools.get(stem, [])[:first]]  # shared bodies together
        if calls:
            out.append((f"catalog_{stem}", catalog_union_schema(calls), GrammarOptions(time_budget_s=120.0)))
    rng = random.Random(seed)
    for f in sorted((data / "jsonschemabench").glob("*.jsonl")) + sorted((data / "tools").glob("*.jsonl")):
        items = [json.loads(line) for line in f.open()]
        for it in rng.sample(items, min(per_file, len(items))):
            name = str(it.get("id", f"{f.stem}{len(out)}")).replace("/", "_")
            out.append((name, it.get("schema") or it.get("parameters") or it, None))
    return out


def dump(out: Path, data: Path, per_file: int, seed: int, budget_s: float) -> None:
    from surecall.grammars.compile import compile_schema
    from surecall.grammars.options import GrammarOptions
    from surecall.grammars.vocab.loaders import load_shared

    out.mkdir(parents=True, exist_ok=True)
    vocab = load_shared("llama3")
    for name, schema, options in cases(data, per_file, seed):
        started = time.perf_counter()
        try:
            table = compile_schema(schema, vocab, options or GrammarOptions(time_budget_s=budget_s), use_cache=False)
        except Exception as exc:  # noqa: BLE001 -- a failure is data: it must fail the same way on both sides
            (out / f"{name}.err").write_text(type(exc).__name__)
            print(f"{name}: {type(exc).__name__}", file=sys.stderr)
            continue
        fields = {f.name: getattr(table, f.name) for f in dataclasses.fields(table) if f.name not in _NOT_DUMPED}
        fields["mask"] = table.mask_dense() if hasattr(table, "mask_dense") else table.mask  # the logical rows
        fields["_dense"] = table.dense_transitions()
        (out / f"{name}.pkl").write_bytes(pickle.dumps(fields))
        print(f"{name}: {table.num_states} states, {(time.perf_counter() - started) * 1e3:.0f} ms", file=sys.stderr)


_NOT_DUMPED = ("meta", "mask", "mask_blocks", "mask_row_blocks")  # the mask is dumped dense, as "mask"


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # a field one side has not (None) differs
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    return a == b


def compare(a: Path, b: Path) -> int:
    """Print every difference between two dumps; returns their count."""
    bad, seen = 0, 0
    names = sorted({p.stem for d in (a, b) for p in d.iterdir() if p.suffix in (".pkl", ".err")})
    for name in names:
        errs = [(d / f"{name}.err").read_text() if (d / f"{name}.err").exists() else None for d in (a, b)]
        if errs[0] or errs[1] or not all((d / f"{name}.pkl").exists() for d in (a, b)):
            if errs[0] != errs[1] or not (errs[0] or errs[1]):
                print(f"DIFF {name}: {errs[0] or 'table'} vs {errs[1] or 'table'} (or absent; a time budget depends on speed)")
                bad += 1
            continue
        x, y = (pickle.loads((d / f"{name}.pkl").read_bytes()) for d in (a, b))
        seen += 1
        for key in sorted(set(x) | set(y)):
            if not _same(x.get(key), y.get(key)):
                print(f"DIFF {name}: {key}")
                bad += 1
    print(f"compared {seen} tables: {bad} differences")
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="dump folder")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two dump folders")
    parser.add_argument("--per-file", type=int, default=4, help="schemas sampled per subset file (default 4)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=8.0, help="compile time budget per schema")
    args = parser.parse_args(argv)
    if args.compare:
        return 1 if compare(Path(args.compare[0]), Path(args.compare[1])) else 0
    if not args.out:
        parser.error("give --out DIR (dump) or --compare A B")
    from surecall.grammars.vocab.shared import shared_data_dir

    dump(Path(args.out), shared_data_dir(), args.per_file, args.seed, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
