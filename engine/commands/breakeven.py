"""`surecall breakeven`: measure t_mask, p_err, T_repair and repair success on a model, then p_break
with 95% intervals and the decision per tool. Argument parsing only: the job is
`surecall.breakeven.main_job.run_breakeven`. Writes the table to stdout, `breakeven.json` and
`breakeven.png` into --out; a progress bar runs on stderr.
"""

from __future__ import annotations

import argparse
import sys

from surecall.breakeven.main_job import load_prompts, set_cpu_threads  # noqa: F401  (old import path)
from surecall.commands.args import (
    device,
    input_file,
    non_negative_float,
    non_negative_int,
    output_dir,
    positive_int,
)


def add_measurement_arguments(parser: argparse.ArgumentParser, batch: int, max_rounds: int) -> None:
    """The measurement flags `surecall breakeven` and `surecall run` share."""
    parser.add_argument("--batch", type=positive_int, default=batch, help=f"decode batch size (default {batch})")
    parser.add_argument("--device", default=None, type=device, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--max-tokens", type=positive_int, default=256, help="token budget per call (default 256)")
    parser.add_argument("--min-rounds", type=positive_int, default=2, help="rounds of paired passes before stopping (default 2)")
    parser.add_argument("--max-rounds", type=positive_int, default=max_rounds, help=f"most rounds of paired passes (default {max_rounds})")
    parser.add_argument("--precision", type=non_negative_float, default=0.02,
                        help="stop once every p_break 95%% interval is within +- this rate (default 0.02)")
    parser.add_argument("--time-budget", type=non_negative_float, default=None, help="stop adding rounds after this many seconds")
    parser.add_argument("--repairs", type=non_negative_int, default=4, help="failed calls per tool sent back for repair (default 4)")
    parser.add_argument("--repair-rounds", type=positive_int, default=2, help="R: repair rounds per failed call (default 2)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="sampling and bootstrap seed (default 0)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="local HF model directory (default: the shipped surecall-tiny)")
    parser.add_argument("--tools", default="seed-hardened",
                        help="tools file (JSON list, JSONL, MCP list), module:attr, 'seed' (Listing 5) or 'seed-hardened' "
                             "(default: the catalog the shipped model was trained on)")
    parser.add_argument("--prompts", default=None, type=input_file, help="JSONL of {messages | prompt, tool?, arguments?} (default: the shipped held-out prompts)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts")
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, help="free-decoding temperature (default 1.0)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU intra-op threads (default: 1 for the shipped tiny model, else torch's default)")
    parser.add_argument("--out", default="runs/breakeven", type=output_dir, help="output folder (default runs/breakeven)")
    add_measurement_arguments(parser, batch=8, max_rounds=6)


def breakeven_config(args: argparse.Namespace, command: str):
    """BreakevenConfig from the shared flags; a bad value exits with status 2 and the reason."""
    from surecall.breakeven.measurement import BreakevenConfig

    try:
        return BreakevenConfig(
            batch_size=args.batch, max_tokens=args.max_tokens, temperature=getattr(args, "temperature", 1.0),
            min_rounds=args.min_rounds, max_rounds=args.max_rounds, precision=args.precision,
            time_budget_s=args.time_budget, repairs_per_tool=args.repairs, max_repair_rounds=args.repair_rounds,
            seed=args.seed)
    except ValueError as exc:
        print(f"surecall {command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from surecall.breakeven.main_job import load_llm, run_breakeven
    from surecall.commands.resolve import load_tools
    from surecall.models import default_heldout_path, default_model_dir

    cfg = breakeven_config(args, "breakeven")
    set_cpu_threads(args.threads, is_tiny=args.model is None)
    model = args.model or str(default_model_dir())
    prompts = load_prompts(args.prompts or default_heldout_path(), args.limit)
    tools = load_tools(args.tools)
    llm = load_llm(model, args.device)
    with tqdm(desc="breakeven", unit="pass", dynamic_ncols=True) as bar:
        report = run_breakeven(llm, tools, prompts, cfg, args.out, model, extra={"tools": args.tools}, progress=bar)
    print(report["table"])
    print(f"\nwrote {report['json_path']} and {report['plots'][0]}")
    return 0
