"""Compile benchmark: our table compiler vs xgrammar and outlines-core over JSONSchemaBench + tools.

For every shared JSONSchemaBench subset and the shared tool files (sampled per subset with a
fixed seed), each engine compiles each schema over the Llama-3 vocabulary in its own worker
process, one per engine, with a per-schema timeout and an address-space limit
(resource.setrlimit), so a blow-up costs one schema, not the machine. Ours must also pass
random walks (half of them under a tight token budget) that parse and validate against the
schema (relaxed keywords accounted for) before a compile counts. Peak memory is the worker's
peak RSS during the compile (VmHWM, reset before each job) above its RSS before it.
Then the seed four-tool catalog: ours cold (fresh process and repeat), warm (disk cache) and
xgrammar. Prints tables, writes benchmarks/results/compile.{md,json}, ends with one JSON line.
Just over 400 lines: the isolated workers, three engines and the report belong to one run.

  .venv/bin/python benchmarks/compile.py [--per-subset 6] [--timeout-s 20] [--out benchmarks/results/compile]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ENGINES = ("ours", "xgrammar", "outlines")


# --- worker side -----------------------------------------------------------------------------
def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class _Ours:
    def __init__(self, vocab, walks: int):
        self.vocab, self.walks = vocab, walks

    def compile(self, schema):
        from surecall.grammars.compile import compile_schema

        started = time.perf_counter()
        table = compile_schema(schema, self.vocab, use_cache=False)
        return table, time.perf_counter() - started

    def check(self, schema, table) -> dict:
        import numpy as np

        from surecall.grammars.walk import decode, random_walk, schema_violations

        rng = np.random.default_rng(0)
        bad, soft = 0, 0
        for i in range(self.walks):
            budget = int(table.dist[0]) + 2 if i % 2 else 512
            ids = random_walk(table, self.vocab, rng, max_tokens=budget)
            try:
                doc = json.loads(decode(self.vocab, ids))
            except ValueError:
                bad += 1
                continue
            errors, relaxed = schema_violations(schema, doc, table.relaxed)
            bad += bool(errors)
            soft += bool(relaxed)
        return {"walks_ok": bad == 0, "walks_relaxed": soft, "table_bytes": table.nbytes,
                "states": table.num_states, "relaxed": len(table.relaxed)}


class _XGrammar:
    def __init__(self, vocab):
        import xgrammar as xgr

        info = xgr.TokenizerInfo(list(vocab.token_bytes), xgr.VocabType.RAW, vocab_size=vocab.logits_width,
                                 stop_token_ids=list(vocab.stop_ids))
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema):
        started = time.perf_counter()
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return compiled, time.perf_counter() - started

    def check(self, schema, compiled) -> dict:
        return {"table_bytes": int(compiled.memory_size_bytes)}


class _Outlines:
    def __init__(self, vocab):
        from outlines_core import Vocabulary

        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b and i not in vocab.special_ids:
                by_bytes.setdefault(b, []).append(i)
        self.vocabulary = Vocabulary(vocab.stop_ids[0], by_bytes)

    def compile(self, schema):
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        started = time.perf_counter()
        regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern=r"[ ]?")
        index = Index(regex, self.vocabulary)
        return index, time.perf_counter() - started

    def check(self, schema, index) -> dict:
        return {"states": len(index.get_transitions())}


def _worker(engine: str, conn, rss_limit_bytes: int, walks: int, cache_dir: str) -> None:
    os.environ["SURECALL_CACHE_DIR"] = cache_dir
    resource.setrlimit(resource.RLIMIT_AS, (rss_limit_bytes, rss_limit_bytes))
    from surecall.grammars.vocab.loaders import load_shared

    vocab = load_shared("llama3")
    runner = {"ours": lambda: _Ours(vocab, walks), "xgrammar": lambda: _XGrammar(vocab),
              "outlines": lambda: _Outlines(vocab)}[engine]()
    conn.send({"ready": True})
    while True:
        job = conn.recv()
        if job is None:
            return
        base = _rss_bytes("VmRSS:")
        _reset_peak()
        try:
            obj, seconds = runner.compile(job)
            peak = max(_rss_bytes("VmHWM:") - base, 0)
            result = {"ok": True, "ms": seconds * 1e3, "peak_bytes": peak, **runner.check(job, obj)}
        except MemoryError:
            result = {"ok": False, "reason": "out of memory"}
        except Exception as exc:  # a peer's failure is data, not a crash of the benchmark
            result = {"ok": False, "reason": _reason(exc)}
        conn.send(result)


def _reason(exc: Exception) -> str:
    name = type(exc).__name__
    text = str(exc)
    if name == "CompileBudgetExceeded":
        kind = "regex size" if "regex of" in text else "time" if "time budget" in text else "memory"
        return f"{name}: {kind}"
    keyword = getattr(exc, "keyword", None)
    if keyword:
        return f"{name}: {keyword}"
    return f"{name}: {text.splitlines()[0][:60] if text else ''}"


class Worker:
    """One engine's worker process; restarted after a timeout or a crash."""

    def __init__(self, engine: str, args, cache_dir: str):
        self.engine, self.args, self.cache_dir = engine, args, cache_dir
        self.proc = None
        self.rss_hwm = 0

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(self.engine, child, int(self.args.rss_gib * 2**30),
                                                       self.args.walks, self.cache_dir), daemon=True)
        self.proc.start()
        if not self.conn.poll(300) or not self.conn.recv().get("ready"):
            raise RuntimeError(f"{self.engine} worker did not start")

    def run(self, schema) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(schema)
        try:
            if self.conn.poll(self.args.timeout_s):
                return self.conn.recv()
            reason = f"timeout > {self.args.timeout_s:g} s"
        except (EOFError, OSError):
            reason = "worker died (memory limit?)"
        self.stop(kill=True)
        return {"ok": False, "reason": reason}

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(5)
        self.proc = None


# --- data ------------------------------------------------------------------------------------
def load_subsets(data_dir: Path, per_subset: int, seed: int) -> dict[str, list[tuple[str, dict]]]:
    subsets: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted((data_dir / "jsonschemabench").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        subsets[path.stem] = [(r["id"], r["schema"]) for r in rows]
    for path in sorted((data_dir / "tools").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        subsets[f"tools:{path.stem}"] = [(r["id"], _tool_schema(r)) for r in rows if _tool_schema(r) is not None]
    rng = random.Random(seed)
    return {name: rng.sample(items, min(per_subset, len(items))) for name, items in subsets.items()}


def _tool_schema(row: dict):
    for key in ("parameters_json_schema", "inputSchema", "input_schema", "parameters"):
        if isinstance(row.get(key), dict):
            return row[key]
    return None


# --- aggregation -----------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarise(results: list[dict]) -> dict:
    ok = [r for r in results if r["ok"]]
    valid = [r for r in ok if r.get("walks_ok", True)]
    times = [r["ms"] for r in valid]
    reasons = Counter(r["reason"] for r in results if not r["ok"])
    reasons.update("invalid random walk" for r in ok if not r.get("walks_ok", True))
    return {
        "n": len(results), "compiled": len(valid), "median_ms": _pct(times, 0.5), "p90_ms": _pct(times, 0.9),
        "p99_ms": _pct(times, 0.99), "max_ms": max(times) if times else None,
        "peak_mib": max((r["peak_bytes"] for r in ok), default=0) / 2**20,
        "table_mib_median": (_pct([r["table_bytes"] for r in ok if "table_bytes" in r], 0.5) or 0) / 2**20,
        "unsupported": dict(reasons.most_common(4)),
    }


def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# --- the seed catalog ------------------------------------------------------------------------
def catalog_union_schema(tools: list[dict]) -> dict:
    """The tagged union of calls {"name": ..., "arguments": ...} as one JSON Schema (for every engine)."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}


def seed_catalog_figures(cache_dir: str, repeats: int) -> dict:
    """Run in a fresh process: ours cold (first and repeat), warm load, xgrammar; median of repeats."""
    from surecall.tools.catalog import seed_tools

    schema_json = json.dumps(catalog_union_schema(seed_tools()))
    code = f"""
import json, os, statistics, time
os.environ["SURECALL_CACHE_DIR"] = {cache_dir!r}
from surecall.grammars.compile import compile_schema
from surecall.grammars.vocab.loaders import load_shared
import xgrammar as xgr
vocab = load_shared("llama3")
schema = json.loads({schema_json!r})
t = time.perf_counter(); table = compile_schema(schema, vocab, use_cache=False); first = (time.perf_counter() - t) * 1e3
cold = []
for _ in range({repeats}):
    t = time.perf_counter(); compile_schema(schema, vocab, use_cache=False); cold.append((time.perf_counter() - t) * 1e3)
compile_schema(schema, vocab)
warm = []
for _ in range({repeats}):
    t = time.perf_counter(); w = compile_schema(schema, vocab); warm.append((time.perf_counter() - t) * 1e3)
info = xgr.TokenizerInfo(list(vocab.token_bytes), xgr.VocabType.RAW, vocab_size=vocab.logits_width, stop_token_ids=list(vocab.stop_ids))
xg = []
for _ in range({repeats} + 1):
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    t = time.perf_counter(); compiler.compile_json_schema(json.dumps(schema), any_whitespace=False); xg.append((time.perf_counter() - t) * 1e3)
xg1 = []
for _ in range({repeats}):
    compiler = xgr.GrammarCompiler(info, cache_enabled=False, max_threads=1)
    t = time.perf_counter(); compiler.compile_json_schema(json.dumps(schema), any_whitespace=False); xg1.append((time.perf_counter() - t) * 1e3)
print(json.dumps({{"first_cold_ms": first, "cold_ms": statistics.median(cold), "warm_ms": statistics.median(warm),
  "xgrammar_ms": statistics.median(xg[1:]), "xgrammar_1thread_ms": statistics.median(xg1),
  "states": table.num_states, "dfa_states": table.meta["dfa_states"], "table_bytes": table.nbytes,
  "relaxed": table.relaxed, "warm_is_mapped": type(w.mask).__name__}}))
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": out.stderr[-800:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- main ------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-subset", type=int, default=4,
                        help="schemas sampled per subset (default 4: about 10 minutes on the loaded 2-core machine)")
    parser.add_argument("--timeout-s", type=float, default=15.0, help="per-schema wall-clock limit per engine")
    parser.add_argument("--rss-gib", type=float, default=4.0, help="address-space limit of each worker")
    parser.add_argument("--walks", type=int, default=4, help="random walks checked per compiled schema (ours)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats for the seed catalog timings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subsets", default="", help="comma-separated subset names (default: all)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--out", default="benchmarks/results/compile")
    args = parser.parse_args(argv)

    from surecall.grammars.vocab.shared import shared_data_dir

    data = shared_data_dir()
    if not (data / "jsonschemabench").exists():
        print(f"shared data not found at {data}", file=sys.stderr)
        return 2
    cache_dir = tempfile.mkdtemp(prefix="surecall-bench-cache-")
    subsets = load_subsets(data, args.per_subset, args.seed)
    if args.subsets:
        wanted = set(args.subsets.split(","))
        subsets = {k: v for k, v in subsets.items() if k in wanted}
    engines = [e for e in args.engines.split(",") if e]
    workers = {e: Worker(e, args, cache_dir) for e in engines}
    started = time.perf_counter()
    per_subset: dict[str, dict] = {}
    failures: list[dict] = []
    try:
        for name, items in subsets.items():
            results = {e: [] for e in engines}
            for schema_id, schema in items:
                for e in engines:
                    r = workers[e].run(schema)
                    results[e].append(r)
                    if e == "ours" and (not r["ok"] or not r.get("walks_ok", True)):
                        failures.append({"subset": name, "id": schema_id, **r})
            per_subset[name] = {e: summarise(rs) for e, rs in results.items()}
            _print_subset(name, per_subset[name], engines)
    finally:
        for w in workers.values():
            w.stop()
    sweep_s = time.perf_counter() - started
    catalog = seed_catalog_figures(cache_dir, args.repeats)
    report = _report(args, per_subset, engines, catalog, failures, sweep_s)
    _write(args.out, report)
    print(json.dumps({"bench": "compile", "overall": report["overall"], "seed_catalog": catalog}, default=str))
    return 0


def _print_subset(name: str, summary: dict, engines: list[str]) -> None:
    cells = []
    for e in engines:
        s = summary[e]
        cells.append(f"{e} {s['compiled']}/{s['n']} med {_fmt(s['median_ms'])} ms")
    print(f"{name:28s} " + " | ".join(cells), flush=True)


def _report(args, per_subset, engines, catalog, failures, sweep_s) -> dict:
    overall = {}
    for e in engines:
        medians = [s[e]["median_ms"] for s in per_subset.values() if s[e]["median_ms"] is not None]
        overall[e] = {
            "compiled": sum(s[e]["compiled"] for s in per_subset.values()),
            "n": sum(s[e]["n"] for s in per_subset.values()),
            "median_of_subset_medians_ms": statistics.median(medians) if medians else None,
        }
    return {
        "command": " ".join([sys.executable.split("/")[-1], "benchmarks/compile.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "settings": {k: v for k, v in vars(args).items()},
        "sweep_s": sweep_s, "per_subset": per_subset, "overall": overall, "seed_catalog": catalog,
        "our_failures": failures[:60],
    }


def _write(out: str, report: dict) -> None:
    base = Path(out)
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    engines = list(report["overall"])
    lines = ["# Compile benchmark: surecall vs xgrammar vs outlines-core (Llama-3 vocabulary)", "",
             f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ",
             f"Sweep time: {report['sweep_s']:.0f} s; per-schema timeout {report['settings']['timeout_s']} s, "
             f"worker address space {report['settings']['rss_gib']} GiB.", "",
             "Compiled = compiled within the limits (ours: and every random walk parsed and validated). "
             "Times: median / p90 / p99 / max over compiled schemas, ms. Peak = max worker RSS growth during "
             "one compile. Table = median table size (ours: TokenTable bytes; xgrammar: memory_size_bytes).", "",
             "| subset | " + " | ".join(f"{e} compiled | {e} med/p90/p99/max ms | {e} peak MiB" for e in engines)
             + " | our table MiB | our unsupported reasons |",
             "|---" * (3 * len(engines) + 3) + "|"]
    for name, s in report["per_subset"].items():
        cells = []
        for e in engines:
            x = s[e]
            cells += [f"{x['compiled']}/{x['n']}",
                      "/".join(_fmt(x[k], 0) for k in ("median_ms", "p90_ms", "p99_ms", "max_ms")),
                      _fmt(x["peak_mib"], 0)]
        reasons = "; ".join(f"{k} x{v}" for k, v in s[engines[0]]["unsupported"].items())
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_fmt(s[engines[0]]['table_mib_median'])} | {reasons} |")
    lines += ["", "Overall: " + json.dumps(report["overall"]), "", "## Seed four-tool catalog (tagged union, with its bounds)",
              "", "```", json.dumps(report["seed_catalog"], indent=1, default=str), "```", ""]
    base.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
