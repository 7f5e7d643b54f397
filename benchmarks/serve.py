"""Server benchmark: `surecall serve` versus `transformers serve --continuous-batching`, same model.

Both servers run as subprocesses on 127.0.0.1 (free ports, bounded waits, always stopped) with
the shipped surecall-tiny. One request mix for both: the held-out prompts with the hardened seed
catalog as OpenAI tools, tool_choice alternating auto / required, streamed, seeded, T=1. At each
offered load (C closed-loop clients) we send R requests and measure: requests/s, output
tokens/s, *valid tool calls per second* (calls whose arguments parse as JSON and validate against
the tool's schema, per second of wall time), TTFT and inter-chunk latency p50/p99, and the share
of requests that returned at least one valid call (a peer's calls are read from `tool_calls`;
calls it left as `<tool_call>` text in the content are counted separately). Correctness is
checked on the same responses that are timed; a warm-up request goes first. Ends with one JSON line.
The peer needs `accelerate` besides the serve extra (`transformers serve` loads with a device map).
Usage: python benchmarks/serve.py [--loads 1,4,16] [--requests 8,16,32] [--peer/--no-peer] [--out benchmarks/results/serve_cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[1]
CALL_TEXT = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def _pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload(n: int):
    from surecall.models import default_heldout_path
    from surecall.tools import hardened_seed_tools

    seed = hardened_seed_tools()
    tools = [{"type": "function", "function": t} for t in seed]
    schemas = {t["name"]: t["parameters"] for t in seed}
    rows = [json.loads(line) for line in default_heldout_path().read_text().splitlines() if line.strip()]
    reqs = [{"messages": rows[i % len(rows)]["messages"], "tool_choice": "required" if i % 2 else "auto", "seed": i}
            for i in range(n)]
    return reqs, tools, schemas


# --- servers ------------------------------------------------------------------------------------
def start_server(kind: str, model_dir: Path, log_path: Path, timeout_s: float):
    port = _free_port()
    if kind == "surecall":
        cmd = [sys.executable, "-m", "surecall", "serve", "--port", str(port), "--max-num-seqs", "64"]
        model_id = "surecall-tiny"
    else:
        cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
               "serve", "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
               str(model_dir)]
        model_id = str(model_dir)
    log = open(log_path, "w")  # noqa: SIM115 - closed in stop_server
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.close()
            raise RuntimeError(f"{kind} server exited ({proc.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, log, base, model_id
        except OSError:
            time.sleep(0.5)
    stop_server(proc, log)
    raise RuntimeError(f"{kind} server not healthy within {timeout_s}s; see {log_path}")


def stop_server(proc, log) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    log.close()


# --- one request, streamed -----------------------------------------------------------------------
def _valid(name: str, arguments: str, schemas: dict) -> bool:
    try:
        jsonschema.validate(json.loads(arguments), schemas[name])
        return True
    except Exception:  # noqa: BLE001 - a bad call of any kind counts as invalid
        return False


async def one(client, model_id: str, req: dict, tools, schemas, max_tokens: int, timeout_s: float) -> dict:
    start = time.perf_counter()
    stamps, content, calls, usage, finish, error = [], "", {}, None, None, None
    try:
        stream = await asyncio.wait_for(client.chat.completions.create(
            model=model_id, messages=req["messages"], tools=tools, tool_choice=req["tool_choice"],
            max_tokens=max_tokens, temperature=1.0, seed=req["seed"], stream=True,
            stream_options={"include_usage": True}), timeout_s)
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                d = ch.delta
                if d.content or d.tool_calls:
                    stamps.append(time.perf_counter())
                content += d.content or ""
                for tc in d.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    if tc.function is not None:
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
                finish = ch.finish_reason or finish
    except Exception as exc:  # noqa: BLE001 - recorded per request
        error = f"{type(exc).__name__}: {exc}"[:200]
    end = time.perf_counter()
    structured = [_valid(c["name"], c["arguments"], schemas) for c in calls.values()]
    in_text = []
    for m in CALL_TEXT.finditer(content):
        try:
            obj = json.loads(m.group(1))
            in_text.append(_valid(obj.get("name", ""), json.dumps(obj.get("arguments")), schemas))
        except Exception:  # noqa: BLE001
            in_text.append(False)
    return {"ttft_s": stamps[0] - start if stamps else None, "gaps_s": [b - a for a, b in zip(stamps, stamps[1:])],
            "latency_s": end - start, "num_calls": len(structured), "num_valid": sum(structured),
            "num_text_calls": len(in_text), "num_text_valid": sum(in_text), "finish": finish, "error": error,
            "completion_tokens": usage.completion_tokens if usage else None}


async def run_load(base: str, model_id: str, reqs, tools, schemas, concurrency: int, max_tokens: int,
                   cap_s: float) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=cap_s)
    sem = asyncio.Semaphore(concurrency)

    async def bounded(r):
        async with sem:
            return await one(client, model_id, r, tools, schemas, max_tokens, cap_s)

    start = time.perf_counter()
    try:
        results = await asyncio.gather(*[bounded(r) for r in reqs])
    finally:
        await client.close()
    wall = time.perf_counter() - start
    ok = [r for r in results if r["error"] is None]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    gaps = [g for r in ok for g in r["gaps_s"]]
    tokens = sum(r["completion_tokens"] or 0 for r in ok)
    valid = sum(r["num_valid"] for r in ok)
    return {
        "concurrency": concurrency, "requests": len(reqs), "completed": len(ok), "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 3), "output_tokens_per_s": round(tokens / wall, 1),
        "valid_calls_per_s": round(valid / wall, 3),
        "ttft_p50_s": _r(_pct(ttft, 0.5)), "ttft_p99_s": _r(_pct(ttft, 0.99)),
        "itl_p50_s": _r(_pct(gaps, 0.5)), "itl_p99_s": _r(_pct(gaps, 0.99)),
        "latency_p99_s": _r(_pct([r["latency_s"] for r in ok], 0.99)),
        "calls": sum(r["num_calls"] for r in ok), "valid_calls": valid,
        "requests_with_valid_call": sum(1 for r in ok if r["num_valid"] > 0),
        "text_calls": sum(r["num_text_calls"] for r in ok), "text_calls_valid": sum(r["num_text_valid"] for r in ok),
        "errors": sorted({r["error"] for r in results if r["error"]})[:3],
    }


def _r(x):
    return None if x is None else round(x, 4)


def bench_server(kind: str, args, reqs_by_load, tools, schemas, model_dir: Path, out_dir: Path) -> dict:
    proc, log, base, model_id = start_server(kind, model_dir, out_dir / f"{kind}.log", args.start_timeout_s)
    try:
        warm, _, _ = workload(1)
        asyncio.run(run_load(base, model_id, warm, tools, schemas, 1, args.max_tokens, args.cap_s))
        rows = []
        for conc, reqs in reqs_by_load:
            row = asyncio.run(run_load(base, model_id, reqs, tools, schemas, conc, args.max_tokens, args.cap_s))
            print(f"  {kind:>12} C={conc:<3} {row['completed']}/{row['requests']} done, {row['requests_per_s']} req/s, "
                  f"{row['valid_calls_per_s']} valid calls/s, ttft p50 {row['ttft_p50_s']} s", flush=True)
            rows.append(row)
            if proc.poll() is not None:
                print(f"  {kind}: the server exited with {proc.returncode} during the run", flush=True)
        died = proc.poll()  # a server that died under load says so in the report
        return {"server": kind, "loads": rows, **({"exit_code_during_run": died} if died is not None else {})}
    finally:
        stop_server(proc, log)


def table(results: list[dict]) -> str:
    head = ("| server | C | done | req/s | out tok/s | valid calls/s | valid share | TTFT p50/p99 (s) | "
            "ITL p50/p99 (ms) | latency p99 (s) | calls in text (valid) |")
    lines = [head, "|" + "---|" * 11]
    for res in results:
        for r in res["loads"]:
            share = f"{r['requests_with_valid_call']}/{r['completed']}"
            itl = f"{_ms(r['itl_p50_s'])} / {_ms(r['itl_p99_s'])}"
            lines.append(f"| {res['server']} | {r['concurrency']} | {r['completed']}/{r['requests']} | "
                         f"{r['requests_per_s']} | {r['output_tokens_per_s']} | {r['valid_calls_per_s']} | {share} | "
                         f"{r['ttft_p50_s']} / {r['ttft_p99_s']} | {itl} | {r['latency_p99_s']} | {r['text_calls']} ({r['text_calls_valid']}) |")
    return "\n".join(lines)


def _ms(x):
    return "-" if x is None else f"{x * 1000:.1f}"


def markdown(report: dict) -> str:
    skipped = "".join(f"\n- {k} did not run: {v}" for k, v in report.get("skipped", {}).items())
    return (f"# Server benchmark (CPU)\n\nCommand: `{report['command']}`  \nMachine: {report['machine']}  \n"
            f"Model: {report['model']}, max_tokens {report['max_tokens']}, T=1, streamed, tool_choice auto/required "
            f"alternating, hardened seed catalog as tools, held-out prompts.\n\n{table(report['results'])}\n"
            f"\n*valid calls/s*: tool calls in `tool_calls` whose arguments parse and validate, per second of wall "
            f"time. *valid share*: requests with at least one such call. *calls in text*: `<tool_call>` blocks a "
            f"server left in `content` (an OpenAI client does not see them as calls) and how many of those would "
            f"validate.{skipped}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", default="1,4,16", help="closed-loop client counts (default 1,4,16)")
    ap.add_argument("--requests", default="8,16,32", help="requests per load (default 8,16,32)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--cap-s", type=float, default=180.0, help="per-request timeout (default 180)")
    ap.add_argument("--start-timeout-s", type=float, default=180.0)
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                    help="also run transformers serve --continuous-batching (default on)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/serve_cpu"))
    ap.add_argument("--render", default=None, metavar="JSON", help="only rewrite the .md of an earlier run's JSON")
    args = ap.parse_args()
    if args.render:
        report = json.loads(Path(args.render).read_text())
        Path(args.render).with_suffix(".md").write_text(markdown(report))
        return
    from surecall.models import default_model_dir

    loads = [int(x) for x in args.loads.split(",")]
    counts = [int(x) for x in args.requests.split(",")]
    if len(counts) != len(loads):
        raise SystemExit(f"--requests needs one count per load ({len(loads)}), got {len(counts)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    reqs, tools, schemas = workload(max(counts))
    reqs_by_load = [(c, reqs[:n]) for c, n in zip(loads, counts, strict=True)]
    model_dir = default_model_dir()
    results, skipped = [], {}
    logs = Path(tempfile.mkdtemp(prefix="serve-bench-"))  # server logs, named in the report
    for kind in ["surecall"] + (["transformers"] if args.peer else []):
        try:
            results.append(bench_server(kind, args, reqs_by_load, tools, schemas, model_dir, logs))
        except Exception as exc:  # noqa: BLE001 - a peer that does not run is reported, not fatal
            skipped[kind] = f"{type(exc).__name__}: {exc}"
            print(f"  {kind}: skipped ({skipped[kind]})", flush=True)
    text = table(results)
    print(text)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    report = {"machine": machine, "logs": str(logs), "model": "surecall-tiny", "max_tokens": args.max_tokens, "loads": loads,
              "requests": counts, "results": results, "skipped": skipped,
              "command": "python benchmarks/serve.py " + " ".join(sys.argv[1:])}
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(json.dumps({"bench": "serve", **{r["server"]: r["loads"][-1]["valid_calls_per_s"] for r in results},
                      "skipped": list(skipped)}))


if __name__ == "__main__":
    main()
