"""`surecall breakeven`: measure t_mask, p_err and T_repair on a model, then p_break and the decision.

Writes a readable table to stdout, `breakeven.json` and one PNG per row (`breakeven_<tool>.png`)
into --out. A progress bar runs on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from surecall.commands.args import (
    device,
    input_file,
    non_negative_float,
    non_negative_int,
    output_dir,
    positive_int,
)
from surecall.errors import RequestError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="local HF model directory (default: the shipped surecall-tiny)")
    parser.add_argument("--tools", default="seed", help="tools file (JSON list, JSONL, MCP list), module:attr or 'seed' (default)")
    parser.add_argument("--prompts", default=None, type=input_file, help="JSONL of {messages | prompt, tool?, arguments?} (default: the shipped held-out prompts)")
    parser.add_argument("--batch", type=positive_int, default=16, help="decode batch size (default 16)")
    parser.add_argument("--device", default=None, type=device, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts")
    parser.add_argument("--max-tokens", type=positive_int, default=256, help="token budget per call (default 256)")
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, help="free-decoding temperature (default 1.0)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="paired free/constrained timing repeats (default 3)")
    parser.add_argument("--repairs", type=non_negative_int, default=16, help="repair rounds to run and time (default 16)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU intra-op threads (default: 1 for the shipped tiny model, else torch's default)")
    parser.add_argument("--out", default="runs/breakeven", type=output_dir, help="output folder (default runs/breakeven)")


def load_prompts(path: str | Path, limit: int | None = None):
    """Prompts from JSONL: each row has `messages` (chat) or `prompt` (text), optional `tool`/`arguments`."""
    from surecall.breakeven_run import Prompt

    prompts = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
        messages = row.get("messages") or ([{"role": "user", "content": row["prompt"]}] if row.get("prompt") else None)
        if not messages:
            raise RequestError(f"{path}:{lineno}: expected 'messages' or 'prompt'")
        prompts.append(Prompt(messages=messages, tool=row.get("tool"), arguments=row.get("arguments")))
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise RequestError(f"{path}: no prompts")
    return prompts


def set_cpu_threads(threads: int | None, is_tiny: bool) -> None:
    """Tiny models decode fastest on one intra-op thread: more threads only add OpenMP
    synchronisation per small matmul (~100x slower on a loaded 2-core machine)."""
    import torch

    if threads is not None and threads < 1:
        raise ValueError(f"Invalid threads: expected >= 1, got {threads}")
    if threads or is_tiny:
        torch.set_num_threads(threads or 1)


def run(args: argparse.Namespace) -> int:
    report = measure_and_write(args)
    print(report["table"])
    print(f"\nwrote {report['json_path']} and {len(report['plots'])} plot(s) in {args.out}")
    return 0


def measure_and_write(args: argparse.Namespace) -> dict:
    from tqdm import tqdm

    from surecall.breakeven import format_table, plot
    from surecall.breakeven_run import BreakevenConfig, measure
    from surecall.commands.resolve import load_tools
    from surecall.llm import LLM
    from surecall.models import default_heldout_path, default_model_dir

    cfg = BreakevenConfig(args.batch, args.max_tokens, args.temperature, args.repeats, args.repairs, args.seed)
    model_dir = args.model or str(default_model_dir())
    set_cpu_threads(getattr(args, "threads", None), is_tiny=args.model is None)
    prompts = load_prompts(args.prompts or default_heldout_path(), args.limit)
    tools = load_tools(args.tools)
    from surecall.config import EngineConfig

    # No compaction: free and constrained batches must shrink alike for t_mask (a per-step
    # difference) to be the mask's cost and not a difference in how early rows finished.
    llm = LLM(model_dir, device=args.device, config=EngineConfig(compact_batches=False))
    with tqdm(desc="breakeven", unit="pass", dynamic_ncols=True) as bar:
        result = measure(llm, tools, prompts, cfg, progress=bar)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    for row in result.rows:
        if math.isfinite(row.t_repair_s) and row.num_calls:
            path = out / f"breakeven_{row.tool}.png"
            plot(row, str(path))
            plots.append(str(path))
    payload = {
        "model": model_dir,
        "tools": args.tools,
        "num_prompts": len(prompts),
        "config": vars(cfg),
        "rows": [r.to_dict() for r in result.rows],
        "constrained_parse_rate": result.constrained_parse_rate,
        "constrained_valid_rate": result.constrained_valid_rate,
        "step_s_free": result.step_s_free,
        "step_s_constrained": result.step_s_constrained,
        "repairs": result.repairs,
        "device": str(llm.device) if hasattr(llm, "device") else args.device,
    }
    json_path = out / "breakeven.json"
    json_path.write_text(json.dumps(payload, indent=1))
    return {"table": format_table(result.rows), "json_path": str(json_path), "plots": plots, "payload": payload}
