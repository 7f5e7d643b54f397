"""Per-call latency of the four coding tools through `Runtime.dispatch`, and what the sandbox costs.

Rows: each tool end to end (validate + approve + claim/record where the level needs it +
execute, SQLite store), the same tool called directly (the peer: no runtime), and
`bash_execute` sandboxed (bubblewrap) against unsandboxed (the floor). Before timing it checks
each call's output. p50/p99 in microseconds; ends with one JSON line and saves it (with the
command and the machine) under benchmarks/results/toolbox.json.
Usage: python benchmarks/toolbox.py [--calls 300] [--shell-calls 40]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from surecall.dispatch.runtime import Runtime
from surecall.dispatch.stores import SQLiteStore
from surecall.toolbox.bash import BashExecuteArgs, bash_execute
from surecall.toolbox.catalog import coding_tools
from surecall.toolbox.files import FileViewArgs, file_view
from surecall.toolbox.sandbox import Sandbox, SandboxConfig
from surecall.toolbox.search import GrepSearchArgs, grep_search

KEY = b"benchmark-signing-key-32-bytes!!"


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e6, ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6


def timed(fn, n: int, warmup: int = 5) -> list[float]:
    for i in range(warmup):
        fn(-1 - i)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "src").mkdir(parents=True)
    for i in range(50):
        (ws / "src" / f"m{i}.py").write_text("".join(f"value_{j} = {j}\n" for j in range(200)))
    return ws


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shell-calls", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp))
        rt = Runtime(coding_tools(ws), SQLiteStore(Path(tmp) / "r.db"), KEY)
        cap = rt.issue(["call:*", "read", "write", "exec", "approve:bash_execute"], [str(ws)])
        sandbox, floor = Sandbox(), Sandbox(SandboxConfig(bwrap_path="/nonexistent", allow_unsandboxed=True))

        def disp(name, arguments, i):
            return rt.dispatch({"name": name, "arguments": arguments}, cap, "bench", 0, f"{name}-{i}")

        def edit_args(i):
            k = i % 50 if i >= 0 else 49
            return {"path": f"src/m{k}.py", "old_str": f"value_{i // 50 + 10} = ", "new_str": f"edited_{i} = "}

        # 1. correctness before timing
        assert "value_3 = 3" in disp("file_view", {"path": "src/m0.py", "limit": 5}, 0).output
        assert len(disp("grep_search", {"pattern": r"value_199 ", "path": "src"}, 0).data["matches"]) == 50
        assert disp("bash_execute", {"command": "ls src | wc -l"}, 0).output.strip() == "50" if sandbox.is_available() else True
        probe = disp("file_edit", {"path": "src/m0.py", "old_str": "value_0 = 0\n", "new_str": "v0 = 0\n"}, 0)
        assert probe.ok and "v0 = 0" in (ws / "src" / "m0.py").read_text()
        # 2. time
        rows = {
            "file_view runtime": timed(lambda i: disp("file_view", {"path": "src/m1.py", "offset": 50, "limit": 100}, i), args.calls),
            "file_view direct": timed(lambda i: file_view(FileViewArgs(path="src/m1.py", offset=50, limit=100), ws), args.calls),
            "file_edit runtime": timed(lambda i: disp("file_edit", edit_args(i), i), args.calls),
            "grep_search runtime": timed(lambda i: disp("grep_search", {"pattern": r"value_1\d\d ", "path": "src/m2.py"}, i), args.calls),
            "grep_search direct": timed(lambda i: grep_search(GrepSearchArgs(pattern=r"value_1\d\d ", path="src/m2.py"), ws), args.calls),
            "bash unsandboxed": timed(lambda i: bash_execute(BashExecuteArgs(command="true"), ws, floor), args.shell_calls),
        }
        if sandbox.is_available():
            rows["bash sandboxed direct"] = timed(lambda i: bash_execute(BashExecuteArgs(command="true"), ws, sandbox), args.shell_calls)
            rows["bash sandboxed runtime"] = timed(lambda i: disp("bash_execute", {"command": "true"}, i), args.shell_calls)
    # 3. report
    stats = {name: percentiles(samples) for name, samples in rows.items()}
    print(f"{'row':<24}{'p50 us':>12}{'p99 us':>12}")
    for name, (p50, p99) in stats.items():
        print(f"{name:<24}{p50:>12.0f}{p99:>12.0f}")
    ratios = {
        "runtime_over_direct_file_view": stats["file_view runtime"][0] / stats["file_view direct"][0],
        "sandbox_over_unsandboxed_bash": (stats["bash sandboxed direct"][0] / stats["bash unsandboxed"][0]) if "bash sandboxed direct" in stats else None,
    }
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x" if value else f"{name}: n/a (no sandbox)")
    summary = {
        "bench": "toolbox", "p50_us": {k: round(v[0], 1) for k, v in stats.items()},
        "p99_us": {k: round(v[1], 1) for k, v in stats.items()}, "ratios": ratios,
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "toolbox.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
