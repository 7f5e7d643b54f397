"""Compile benchmark: surecall vs xgrammar, llguidance and outlines-core over JSONSchemaBench + tools.

For every shared JSONSchemaBench subset and the two shared tool files (a fixed-seed sample per
subset), each engine compiles each schema over the Llama-3 vocabulary in its own worker process,
with a wall-clock timeout and an address-space cap (resource.setrlimit), so a blow-up costs one
schema, not the machine. Per engine: compiled count, the schemas' valid instances accepted,
invalid ones rejected (only where the violated keyword is enforced), compile median/p90/max,
table bytes p50/p99/max; ours also random walks (half cut by a tight token budget) validated
against the original schema. Valid instances are counted twice: under each engine's default
(ours and xgrammar close objects to their declared properties, in declared order) and "open"
(a schema with a rejected valid instance is recompiled with undeclared keys allowed and any
property order: compile_engines `compile_open`), so the policy's cost is measured, not hidden.
The timed engines (ours, xgrammar, llguidance) run first, one after another on every schema, with the
machine to themselves; outlines-core, by far the slowest, then runs the same schemas in two lanes of its
own (it used to run beside them: its two workers took the cores a single-threaded engine's compile was
timed on, and xgrammar's 8 threads a larger share of what was left). --max-minutes bounds each phase
(round-robin over subsets). Then the
seed catalog (ours cold/warm vs xgrammar), two real catalogs the same way (the GitHub MCP server's
78 tools, BFCL's first 100: CATALOGS), issue 15's goals with their gaps, and a compact table
for the README. Progress on stderr; benchmarks/results/compile.{json,md}; last line one JSON.
Engine adapters: compile_engines.py; summaries, goals and tables: compile_report.py.

  .venv/bin/python benchmarks/compile.py            # the full run (about 35 minutes)
  .venv/bin/python benchmarks/compile.py --quick    # 2 schemas per subset, results to /tmp
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # compile_engines, compile_report (also in workers)
from compile_report import OPEN_ENGINES, SHORT, build_report, fmt, readme_table, write  # noqa: E402

ENGINES = ("ours", "xgrammar", "llguidance", "llguidance-lenient", "outlines")
# outlines-core takes seconds per schema where the others take milliseconds: it runs in lanes of
# its own (two, each taking every other schema) after the others, which run one after another on
# every schema (the first phase); the second phase runs the schemas the first finished.
LANES = ((("ours", "xgrammar", "llguidance", "llguidance-lenient"), 0, 1), (("outlines",), 0, 2),
         (("outlines",), 1, 2))
SECOND_PHASE = {"outlines"}  # engines whose lanes wait for the timed engines to finish
WARMUP_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]}


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


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the benchmark dies (a killed run leaves no orphans)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker(engine_name: str, conn, address_space_bytes: int, walks: int, cache_dir: str, data_dir: str) -> None:
    _die_with_parent()
    log = os.open(os.path.join(cache_dir, f"{engine_name}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)  # the engines' own warnings and progress go to a log, not between the progress lines
    os.environ["SURECALL_CACHE_DIR"] = os.path.join(cache_dir, "tables")
    os.environ["SURECALL_DATA"] = data_dir
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    from compile_engines import Tokens, instance_check, make_engine, timed

    engine = make_engine(engine_name, Tokens(Path(data_dir)), walks)
    if hasattr(engine, "warm_up"):  # ours: what LLM does at load (vocabulary index, the DFA child)
        engine.warm_up()
    engine.compile(WARMUP_SCHEMA)  # thread pools, lazy tables: not charged to the first schema
    conn.send({"ready": True})
    while True:
        job = conn.recv()
        if job is None:
            return
        if job.get("open"):
            conn.send(_open_check(engine, job))
            continue
        # 1. compile, timed, with the worker's memory growth
        base = _rss_bytes("VmRSS:")
        _reset_peak()
        try:
            compiled, ms = timed(engine.compile, job["schema"])
            conn.send({"ok": True, "ms": ms, "peak_bytes": max(_rss_bytes("VmHWM:") - base, 0),
                       **engine.describe(compiled)})
        except MemoryError:
            conn.send({"ok": False, "reason": "out of memory"})
            continue
        except Exception as exc:  # a compiler's failure is data, not a crash of the benchmark
            conn.send({"ok": False, "reason": _reason(exc)})
            continue
        # 2. the checks, under their own timeout
        try:
            checks = instance_check(engine, job["schema"], compiled, job["tests"])
            if hasattr(engine, "walk_check"):
                checks.update(engine.walk_check(job["schema"], compiled))
        except Exception as exc:  # noqa: BLE001
            checks = {"check_error": _reason(exc)}
        del compiled
        conn.send(checks)


def _open_check(engine, job: dict) -> dict:
    """The valid instances again, under the engine's open-object compile (`compile_open`)."""
    from compile_engines import timed, valid_check

    try:
        compiled, ms = timed(engine.compile_open, job["schema"])
        got = valid_check(engine, compiled, job["tests"])
    except MemoryError:
        return {"open_error": "out of memory"}
    except Exception as exc:  # noqa: BLE001 - a failed open compile is data, like a failed compile
        return {"open_error": _reason(exc)}
    return {"valid_accepted_open": got["valid_accepted"], "rejected_valid_open": got["rejected_valid"],
            "open_ms": ms}


def _reason(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc)
    if name == "CompileBudgetExceeded":
        kind = "regex size" if "regex of" in text else "time" if "time budget" in text else "memory"
        return f"{name}: {kind}"
    keyword = getattr(exc, "keyword", None)
    if keyword:
        return f"{name}: {keyword}"
    return f"{name}: {text.splitlines()[0][:70] if text else ''}"


class Worker:
    """One engine's worker process, with a spare started in the background after each kill
    (a worker loads the vocabulary for seconds: the spare hides that from the next schema)."""

    def __init__(self, engine: str, args, cache_dir: str):
        self.engine, self.args, self.cache_dir = engine, args, cache_dir
        self.proc = self.conn = None
        self.spare = None

    def prestart(self) -> None:
        self.spare = self.spare or self._spawn()

    def _spawn(self) -> tuple:
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, daemon=True, args=(
            self.engine, child, int(self.args.rss_gib * 2**30), self.args.walks, self.cache_dir, str(self.args.data)))
        proc.start()
        return proc, conn

    def _start(self) -> None:
        self.proc, self.conn = self.spare or self._spawn()
        self.spare = None
        if not self.conn.poll(300) or not self.conn.recv().get("ready"):
            raise RuntimeError(f"{self.engine} worker did not start")

    def _receive(self, timeout_s: float, what: str) -> dict:
        try:
            if self.conn.poll(timeout_s):
                return self.conn.recv()
            reason = f"{what} timeout > {timeout_s:g} s"
        except (EOFError, OSError):
            reason = f"worker died during {what} (memory cap?)"
        self.stop(kill=True)
        self.prestart()
        return {"ok": False, "reason": reason}

    def run(self, schema, tests) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send({"schema": schema, "tests": tests})
        result = self._receive(self.args.timeout_s, "compile")
        if result.get("ok"):
            started = time.perf_counter()
            checks = self._receive(self.args.check_timeout_s, "check")
            result.update({"check_error": checks["reason"]} if "reason" in checks else checks)
            result["check_ms"] = (time.perf_counter() - started) * 1e3
        if self.engine in OPEN_ENGINES and self.proc is not None and \
                result.get("valid_accepted", 0) < result.get("valid_n", 0):
            result.update(self.run_open(schema, [t for t in tests if t[1]]))
        return result

    def run_open(self, schema, valid_tests) -> dict:
        """valid_accepted_open (or open_error) from recompiling with objects open."""
        self.conn.send({"open": True, "schema": schema, "tests": valid_tests})
        got = self._receive(self.args.timeout_s + self.args.check_timeout_s, "open compile")
        return {"open_error": got["reason"]} if "reason" in got else got

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None:
            if kill:
                self.proc.kill()
            else:
                try:
                    self.conn.send(None)
                except OSError:
                    pass
            self.proc.join(5)
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self.spare is not None:
            self.spare[0].kill()
            self.spare[0].join(5)
            self.spare = None


# --- data ------------------------------------------------------------------------------------
def load_subsets(data_dir: Path, per_subset: int, seed: int, wanted: set[str]) -> dict[str, list[tuple]]:
    """{subset: [(id, schema, tests)]}, each subset sampled with its own fixed seed."""
    files = sorted((data_dir / "jsonschemabench").glob("*.jsonl")) + sorted((data_dir / "tools").glob("*.jsonl"))
    subsets = {}
    for path in files:
        name = path.stem if path.parent.name == "jsonschemabench" else f"tools:{path.stem}"
        if wanted and name not in wanted and path.stem not in wanted:
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        items = [(r["id"], _schema_of(r), r.get("tests", [])) for r in rows if _schema_of(r) is not None]
        subsets[name] = random.Random(f"{seed}:{name}").sample(items, min(per_subset, len(items)))
    return subsets


def _schema_of(row: dict):
    for key in ("schema", "parameters_json_schema", "inputSchema", "input_schema", "parameters"):
        if isinstance(row.get(key), dict):
            return row[key]
    return None


def confirmed_tests(schema, tests: list, render_budget_s: float = 3.0) -> tuple[list, int]:
    """(data, is_valid, spellings) for the instances whose label jsonschema confirms, and how
    many disagreed. Our grammar-order spelling gets `render_budget_s` per schema (the renderer
    can take minutes on the largest schemas); past it, instances keep the two plain spellings."""
    from compile_engines import styles

    from surecall.grammars.walk import schema_violations

    out, disagreed = [], 0
    deadline = time.perf_counter() + render_budget_s
    for case in tests:
        try:
            bad, soft = schema_violations(schema, case["data"], [])
        except Exception:  # noqa: BLE001 - a schema jsonschema cannot load: its instances are not used
            return [], len(tests)
        is_valid = not bad and not soft
        if is_valid != bool(case.get("valid")):
            disagreed += 1
            continue
        out.append((case["data"], is_valid, _spellings(case["data"], schema, deadline, styles)))
    return out, disagreed


def _spellings(data, schema, deadline: float, styles) -> list[str]:
    left = deadline - time.perf_counter()
    if left <= 0 or threading.current_thread() is not threading.main_thread():
        return styles(data, schema, with_grammar_order=False)

    def expire(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        return styles(data, schema)
    except TimeoutError:
        return styles(data, schema, with_grammar_order=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- the seed catalog ------------------------------------------------------------------------
def catalog_union_schema(tools: list[dict]) -> dict:
    """The tagged union of calls {"name": ..., "arguments": ...} as one JSON Schema (for every engine)."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}


_SEED_CODE = """
import json, os, statistics, sys, time
os.environ["SURECALL_CACHE_DIR"] = sys.argv[1]
from surecall.grammars.compile import compile_schema
from surecall.grammars.vocab.loaders import load_shared
import xgrammar as xgr
repeats, schema = int(sys.argv[2]), json.loads(sys.stdin.read())
vocab = load_shared("llama3")
def ms(fn):
    t = time.perf_counter(); out = fn(); return out, (time.perf_counter() - t) * 1e3
table, first = ms(lambda: compile_schema(schema, vocab, use_cache=False))
info = xgr.TokenizerInfo(list(vocab.token_bytes), xgr.VocabType.RAW, vocab_size=vocab.logits_width,
                         stop_token_ids=list(vocab.stop_ids))
def xg(threads):
    compiler = xgr.GrammarCompiler(info, cache_enabled=False, max_threads=threads)
    return ms(lambda: compiler.compile_json_schema(json.dumps(schema), any_whitespace=False))[1]
xg(8)
# interleaved (ours, xgrammar 8 threads, xgrammar 1 thread) per repeat: a load that comes and goes
# on a shared machine then weighs on both engines alike; the ratio is the median of the pairs'
cold, xg8, xg1 = [], [], []
for _ in range(repeats):
    cold.append(ms(lambda: compile_schema(schema, vocab, use_cache=False))[1])
    xg8.append(xg(8))
    xg1.append(xg(1))
compile_schema(schema, vocab)
warm = [ms(lambda: compile_schema(schema, vocab))[1] for _ in range(repeats)]
print(json.dumps({"first_cold_ms": first, "cold_ms": statistics.median(cold), "warm_ms": statistics.median(warm),
  "xgrammar_ms": statistics.median(xg8), "xgrammar_1thread_ms": statistics.median(xg1),
  "cold_over_xgrammar": statistics.median(o / x for o, x in zip(cold, xg8)), "repeats": repeats,
  "states": table.num_states, "table_bytes": table.nbytes, "relaxed": table.relaxed}))
"""


def seed_catalog_figures(cache_dir: str, repeats: int) -> dict:
    """In a fresh process: ours cold (first and repeats), warm (disk cache), xgrammar; medians."""
    from surecall.tools.catalog import seed_tools

    return catalog_figures(cache_dir, repeats, seed_tools())


def catalog_figures(cache_dir: str, repeats: int, tools: list[dict]) -> dict:
    """seed_catalog_figures for any tools (name, parameters) as one tagged union."""
    import subprocess

    schema_json = json.dumps(catalog_union_schema(tools))
    out = subprocess.run([sys.executable, "-c", _SEED_CODE, cache_dir, str(repeats)], input=schema_json,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return {"error": out.stderr[-800:]}
    return {"tools": len(tools), **json.loads(out.stdout.strip().splitlines()[-1])}


# Real catalogs beside the seed's: what a client sending every tool of a server waits for once.
CATALOGS = (("GitHub MCP server", "github_mcp_tools", None), ("BFCL, first 100", "bfcl_tools", 100))


def real_catalog_figures(data_dir: Path, cache_dir: str, repeats: int) -> dict:
    """{name: catalog_figures} for CATALOGS found under data_dir/tools (3 repeats at most: ~2 s each);
    a name seen before is skipped (a catalog's names are distinct: BFCL repeats a few across tasks)."""
    out = {}
    for name, stem, first in CATALOGS:
        path = data_dir / "tools" / f"{stem}.jsonl"
        if path.exists():
            tools: dict[str, dict] = {}
            for line in path.read_text().splitlines():
                row = json.loads(line) if line.strip() else {}
                if row.get("name") and row["name"] not in tools and _schema_of(row) is not None:
                    tools[row["name"]] = {"name": row["name"], "parameters": _schema_of(row)}
            out[name] = catalog_figures(cache_dir, min(repeats, 3), list(tools.values())[:first])
    return out


# --- main ------------------------------------------------------------------------------------
# (full run, --quick) defaults of the flags --quick shortens; a flag given explicitly wins.
RUN_DEFAULTS = {"per_subset": (12, 2), "timeout_s": (10.0, 5.0), "walks": (4, 2), "repeats": (9, 1)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-subset", type=int, help="schemas sampled per subset (default 12; --quick 2)")
    parser.add_argument("--subsets", default="", help="comma-separated subset names, e.g. Github_hard,tools:bfcl_tools")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {','.join(ENGINES)}")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 2 schemas per subset, 5 s timeout, 2 walks, 1 repeat, out to /tmp")
    parser.add_argument("--timeout-s", type=float, help="per-schema compile limit per engine (default 10; --quick 5)")
    parser.add_argument("--check-timeout-s", type=float, default=30.0, help="per-schema limit on the checks")
    parser.add_argument("--rss-gib", type=float, default=4.0, help="address-space cap of each worker")
    parser.add_argument("--walks", type=int, help="random walks per compiled schema, ours (default 4; --quick 2)")
    parser.add_argument("--repeats", type=int, help="repeats for the seed catalog timings, interleaved with xgrammar (default 9; --quick 1)")
    parser.add_argument("--max-minutes", type=float, default=22.0,
                        help="stop starting schemas this long after each phase began (default 22; the full run "
                             "takes about 35 minutes); the round-robin order keeps subsets even")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default="", help="the shared data folder (default: surecall's shared_data_dir)")
    parser.add_argument("--out", default="", help="output base (default benchmarks/results/compile; --quick /tmp)")
    args = parser.parse_args(argv)
    for key, (full, quick) in RUN_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    args.out = args.out or (str(Path(tempfile.gettempdir()) / "surecall-compile-quick") if args.quick
                            else "benchmarks/results/compile")
    bad = [e for e in args.engines.split(",") if e and e not in ENGINES]
    if bad:
        parser.error(f"unknown engine(s) {bad}: expected some of {list(ENGINES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from surecall.grammars.vocab.shared import shared_data_dir

    args.data = Path(args.data).resolve() if args.data else shared_data_dir()
    if not (args.data / "jsonschemabench").exists():
        print(f"shared data not found at {args.data} (pass --data or set SURECALL_DATA)", file=sys.stderr)
        return 2
    cache_dir = tempfile.mkdtemp(prefix="surecall-bench-")
    subsets = load_subsets(args.data, args.per_subset, args.seed, {s for s in args.subsets.split(",") if s})
    engines = [e for e in args.engines.split(",") if e]
    rows, started, num_cut = sweep(args, subsets, engines, cache_dir)
    sweep_s = time.perf_counter() - started
    catalog = seed_catalog_figures(os.path.join(cache_dir, "tables"), args.repeats) if "ours" in engines else {}
    catalogs = real_catalog_figures(args.data, os.path.join(cache_dir, "tables"), args.repeats) \
        if "ours" in engines and "xgrammar" in engines else {}
    shutil.rmtree(os.path.join(cache_dir, "tables"), ignore_errors=True)  # the engine logs stay
    report = build_report(args, rows, list(subsets), engines, catalog, sweep_s)
    report["catalogs"] = catalogs
    report["schemas_left_out_for_time"] = num_cut
    write(Path(args.out), report)
    print("\n".join(readme_table(report)))
    print(json.dumps({"bench": "compile", "sweep_s": round(sweep_s), "overall": report["overall"],
                      "goals": report["goals"], "seed_catalog": catalog, "catalogs": catalogs}, default=str))
    return 0


def sweep(args, subsets: dict, engines: list[str], cache_dir: str) -> tuple[list[dict], float, int]:
    """One row per (subset, schema, engine), in subset, schema and engine order; progress to stderr."""
    started = time.perf_counter()
    lanes = [([e for e in names if e in engines], start, stride) for names, start, stride in LANES]
    rest = [e for e in engines if all(e not in names for names, _, _ in LANES)]
    lanes = [lane for lane in [*lanes, (rest, 0, 1)] if lane[0]]
    phases = [[lane for lane in lanes if not SECOND_PHASE & set(lane[0])],
              [lane for lane in lanes if SECOND_PHASE & set(lane[0])]]
    first = [{e: Worker(e, args, cache_dir) for e in names} for names, _, _ in phases[0]]
    for lane_workers in first:
        for w in lane_workers.values():
            w.prestart()  # they load while the instances are checked and spelled here
    jobs = [(name, schema_id, schema, *confirmed_tests(schema, tests)) for name, schema_id, schema, tests in
            round_robin(subsets)]
    print(f"{len(jobs)} schemas, their instances confirmed and spelled; engine logs in {cache_dir}/*.log",
          file=sys.stderr, flush=True)
    results: dict = {}
    todo = jobs
    for phase, lanes_now in enumerate(phases):
        if not lanes_now:
            continue
        workers = first if phase == 0 else [{e: Worker(e, args, cache_dir) for e in names} for names, _, _ in lanes_now]
        try:
            with ThreadPoolExecutor(max_workers=len(lanes_now)) as pool:
                deadline = time.perf_counter() + args.max_minutes * 60
                futures = [pool.submit(_run_lane, lane_workers, todo[start::stride], started, deadline)
                           for lane_workers, (_, start, stride) in zip(workers, lanes_now)]
                results.update({key: r for f in futures for key, r in f.result().items()})
        finally:
            for lane_workers in workers:
                for w in lane_workers.values():
                    w.close()
        names = [e for lane in lanes_now for e in lane[0]]
        todo = [job for job in todo if all((job[1], e) in results for e in names)]  # the next phase runs these
    done = [job for job in jobs if all((job[1], e) in results for e in engines)]  # every engine ran it
    if len(done) < len(jobs):
        print(f"stopped at --max-minutes {args.max_minutes:g}: {len(jobs) - len(done)} of {len(jobs)} schemas "
              "not run by every engine are left out", file=sys.stderr)
    rows = [{"subset": name, "id": schema_id, "engine": e, "labels_disagreed": disagreed, **results[(schema_id, e)]}
            for name, schema_id, _, _, disagreed in sorted(done, key=lambda j: (list(subsets).index(j[0]), j[1]))
            for e in engines]
    return rows, started, len(jobs) - len(done)


def round_robin(subsets: dict) -> list[tuple]:
    """(subset, id, schema, tests): the first schema of every subset, then the second, ...; so a
    sweep cut short by --max-minutes still covers every subset evenly."""
    out, depth = [], max((len(v) for v in subsets.values()), default=0)
    for i in range(depth):
        out += [(name, *items[i]) for name, items in subsets.items() if i < len(items)]
    return out


def _run_lane(lane_workers: dict, jobs: list, started: float, deadline: float) -> dict:
    """{(schema id, engine): result} for this lane's engines over its share of the schemas."""
    out = {}
    for i, (_, schema_id, schema, confirmed, _) in enumerate(jobs):
        if time.perf_counter() > deadline:
            break
        cells = []
        for e, worker in lane_workers.items():
            r = out[(schema_id, e)] = worker.run(schema, confirmed)
            cells.append(f"{SHORT[e]} {fmt(r['ms'], 0) + ' ms' if r['ok'] else 'FAIL (' + r['reason'][:40] + ')'}")
        print(f"[{'+'.join(SHORT[e] for e in lane_workers)} {i + 1}/{len(jobs)} {time.perf_counter() - started:.0f}s] "
              f"{schema_id}: " + ", ".join(cells), file=sys.stderr, flush=True)
    return out

if __name__ == "__main__":
    sys.exit(main())
