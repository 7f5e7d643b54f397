"""`surecall run` (what `make run` does): the main job on the embedded default, surecall-tiny.

1. constrained calls for the held-out prompts, each dispatched through `Runtime` into a scratch
   workspace (validated, authorized by a signed capability, run at most once);
2. the break-even measurement (free vs constrained, real repair rounds): table, JSON and plot;
3. the catalog cost of the four-tool catalog with the model's own tokenizer and template.
Everything lands in --out (report.json, report.md, breakeven_*.png). No network, no shared data.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path, PurePosixPath

from surecall.commands.args import device, non_negative_int, output_dir, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/main", type=output_dir, help="report folder (default runs/main)")
    parser.add_argument("--limit", type=positive_int, default=64, help="held-out prompts to use (default 64)")
    parser.add_argument("--batch", type=positive_int, default=16, help="decode batch size (default 16)")
    parser.add_argument("--device", default=None, type=device, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--repeats", type=positive_int, default=2, help="paired timing repeats for t_mask (default 2)")
    parser.add_argument("--repairs", type=non_negative_int, default=8, help="repair rounds to run and time (default 8)")
    parser.add_argument("--max-tokens", type=positive_int, default=256, help="token budget per call (default 256)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU intra-op threads (default 1: fastest for the tiny model)")


def run(args: argparse.Namespace) -> int:
    from surecall.commands.breakeven import load_prompts, measure_and_write, set_cpu_threads
    from surecall.models import default_heldout_path, default_model_dir

    set_cpu_threads(args.threads, is_tiny=True)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir, prompts_path = default_model_dir(), default_heldout_path()
    prompts = load_prompts(prompts_path, args.limit)
    print(f"surecall run: model {model_dir.name}, {len(prompts)} held-out prompts, report in {out}/")

    # 1. constrained calls -> Runtime.dispatch into a scratch workspace
    print("\n[1/3] constrained decoding + dispatch")
    dispatch = _decode_and_dispatch(model_dir, prompts, args)
    print(_dispatch_summary(dispatch))

    # 2. the break-even measurement
    print("\n[2/3] break-even: free vs constrained, with real repair rounds")
    be_args = argparse.Namespace(
        model=str(model_dir), tools="seed", prompts=str(prompts_path), batch=args.batch, device=args.device,
        limit=args.limit, max_tokens=args.max_tokens, temperature=1.0, repeats=args.repeats,
        repairs=args.repairs, seed=args.seed, threads=args.threads, out=str(out),
    )
    breakeven = measure_and_write(be_args)
    print(breakeven["table"])

    # 3. catalog cost with the model's own tokenizer
    print("\n[3/3] catalog cost")
    cost = _catalog_cost(model_dir)
    print(cost["text"])

    report = {
        "model": str(model_dir),
        "num_prompts": len(prompts),
        "dispatch": dispatch,
        "breakeven": breakeven["payload"],
        "catalog_cost": cost["report"],
        "wall_s": time.perf_counter() - started,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(_markdown(report, breakeven["table"], cost["text"]))
    print(f"\nwrote {out}/report.json, {out}/report.md and {len(breakeven['plots'])} plot(s) in {report['wall_s']:.0f} s")
    return 0


def _decode_and_dispatch(model_dir: Path, prompts, args) -> dict:
    from surecall.config import SamplingParams
    from surecall.dispatch.runtime import Runtime
    from surecall.dispatch.stores import SQLiteStore
    from surecall.llm import LLM
    from surecall.toolbox.catalog import coding_tools
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    llm = LLM(str(model_dir), device=args.device)
    sampling = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens, seed=args.seed + i) for i in range(len(prompts))]
    results = []
    for lo in range(0, len(prompts), args.batch):
        batch = prompts[lo : lo + args.batch]
        results += llm.generate([p.messages for p in batch], tools=seed_tools(), sampling=sampling[lo : lo + args.batch], constrained=True)
    scratch = Path(tempfile.mkdtemp(prefix="surecall-workspace-"))
    _seed_workspace(scratch, prompts)
    runtime = Runtime(coding_tools(scratch), SQLiteStore(scratch.parent / f"{scratch.name}.idem.sqlite"), signing_key=_fresh_key())
    cap = runtime.issue(["call:*", "read", "write", "exec", "approve:bash_execute"], [str(scratch)], ttl_s=600)
    rows = []
    for i, (prompt, res) in enumerate(zip(prompts, results)):
        exact = res.call is not None and res.call.name == prompt.tool and res.call.arguments == prompt.arguments
        row = {"prompt": i, "tool": res.call.name if res.call else None, "parsed": res.call is not None, "exact": exact,
               "error": res.error, "tokens": res.num_tokens}
        if res.call is not None:
            obs = runtime.dispatch(res.call, cap, trajectory_id="make-run", turn=0, call_id=f"call-{i}")
            row.update(allowed=obs.decision.allowed, code=obs.decision.code, ok=obs.ok,
                       tool_error=obs.error, idempotency=obs.idempotency_state, output=obs.output[:200])
        rows.append(row)
    return {"workspace": str(scratch), "rows": rows}


def _dispatch_summary(dispatch: dict) -> str:
    rows = dispatch["rows"]
    n = len(rows)
    parsed = sum(r["parsed"] for r in rows)
    exact = sum(r["exact"] for r in rows)
    allowed = sum(bool(r.get("allowed")) for r in rows)
    ran_ok = sum(bool(r.get("ok")) for r in rows)
    by_tool = Counter(r["tool"] for r in rows)
    codes = Counter(r.get("code") for r in rows if r.get("code") and r.get("code") != "allowed")
    lines = [
        f"  calls parsed: {parsed}/{n} ({parsed / n:.0%}); exact match with the expected call: {exact}/{n} ({exact / n:.0%})",
        f"  dispatched: {allowed} allowed, {n - allowed} denied; ran without a tool error: {ran_ok}",
        "  by tool: " + ", ".join(f"{k} {v}" for k, v in sorted(by_tool.items(), key=lambda kv: str(kv[0]))),
    ]
    if codes:
        lines.append("  denials: " + ", ".join(f"{k} {v}" for k, v in codes.items()))
    lines.append(f"  workspace: {dispatch['workspace']}")
    return "\n".join(lines)


def _seed_workspace(root: Path, prompts) -> None:
    """Files the held-out requests talk about, so that views, edits and searches find something."""
    for p in prompts:
        args = p.arguments or {}
        rel = args.get("path")
        if not isinstance(rel, str) or not _safe_relative(rel):
            continue
        target = root / rel
        if args.get("glob") or p.tool == "grep_search":
            target.mkdir(parents=True, exist_ok=True)
            (target / "example.py").write_text("# TODO: handle errors\nprint('hello')\n")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        body = [f"line {n}" for n in range(1, 601)]
        if isinstance(args.get("old_str"), str):
            body.insert(10, args["old_str"])
        target.write_text("\n".join(body) + "\n")


def _safe_relative(rel: str) -> bool:
    path = PurePosixPath(rel)
    return bool(rel) and not path.is_absolute() and ".." not in path.parts and len(rel) < 200


def _fresh_key() -> bytes:
    import secrets

    return secrets.token_bytes(32)


def _catalog_cost(model_dir: Path) -> dict:
    from surecall.catalog_cost import measure
    from surecall.commands.catalog_cost import render
    from surecall.tokenizer_io import load_counting_tokenizer
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    tok = load_counting_tokenizer(model_dir)
    report = measure(seed_tools(), tok.encode, tok.hf, num_turns=10, context_window=tok.context_window, tokenizer_name=tok.name).to_dict()
    return {"report": report, "text": render(report, top=4)}


def _markdown(report: dict, table: str, cost_text: str) -> str:
    return "\n".join([
        "# surecall run report",
        "",
        f"model: `{report['model']}`; prompts: {report['num_prompts']}; wall time: {report['wall_s']:.0f} s",
        "",
        "## Dispatch of constrained calls",
        "```",
        _dispatch_summary(report["dispatch"]),
        "```",
        "",
        "## Break-even",
        "```",
        table,
        "```",
        "",
        "## Catalog cost",
        "```",
        cost_text,
        "```",
        "",
    ])
