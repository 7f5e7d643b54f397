"""The two jobs behind the CLI: `run_breakeven` (measure, then table, JSON and figure) and
`run_main_job` (what `surecall run` and `make run` do) on one model loaded once.

The main job: 1. constrained calls for the held-out prompts, decoded against the catalog grounded
in a seeded scratch workspace and dispatched through `Runtime` (validated, authorized by a signed
capability, run at most once; the seeded files are restored between calls, each request being its
own task on the same snapshot), counting calls that ran and calls that did what was asked;
2. the break-even measurement on the seed catalog; 3. the catalog cost with the model's tokenizer.
Everything lands in `out` (report.json, report.md, breakeven.json, breakeven.png). No network.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from surecall.breakeven.measurement import BreakevenConfig, Prompt, measure, tool_batches
from surecall.breakeven.report import environment, format_table, payload, plot
from surecall.breakeven.workspace import FILE_TOOLS, grounded_tools, matches_request, seed_workspace
from surecall.errors import RequestError


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from JSONL: each row has `messages` (chat) or `prompt` (text), optional `tool`/`arguments`."""
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


def load_llm(model: str | Path, device: str | None):
    """The LLM for both jobs (batch compaction on: a timing pair whose passes compacted differently
    is left out of t_mask by the measurement)."""
    from surecall.llm import LLM

    return LLM(str(model), device=device)


def run_breakeven(llm, tools: list, prompts: list[Prompt], cfg: BreakevenConfig, out: str | Path,
                  model: str, extra: dict | None = None, progress=None) -> dict:
    """Measure, then write breakeven.json and breakeven.png into `out`; returns table and payload."""
    result = measure(llm, tools, prompts, cfg, progress=progress)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = payload(result, cfg, environment(llm, model, cfg.batch_size), {"model": model, "num_prompts": len(prompts), **(extra or {})})
    json_path = out / "breakeven.json"
    json_path.write_text(json.dumps(record, indent=1))
    plot_path = out / "breakeven.png"
    plot(result.rows, result.samples, cfg.estimator(), str(plot_path))
    table = format_table(result.rows)
    table += (f"\nprecision: rounds {cfg.min_rounds}-{cfg.max_rounds} until every row is decided or each p_break "
              f"interval is within +-{cfg.precision:.1%}; ran {result.num_rounds} round(s), {len(result.passes)} timing "
              f"pairs ({result.num_pairs_unequal} left out: unequal steps); clock {result.clock}; stopped: {result.stop_reason}")
    return {"table": table, "json_path": str(json_path), "plots": [str(plot_path)], "payload": record}


@dataclass
class MainJobConfig:
    limit: int = 64  # held-out prompts
    device: str | None = None
    threads: int | None = 1
    out: str = "runs/main"
    ground: bool = True  # narrow the dispatch grammar to the seeded workspace (False: the plain catalog)
    breakeven: BreakevenConfig = field(default_factory=BreakevenConfig)

    def __post_init__(self):
        if self.limit < 1:
            raise ValueError(f"Invalid limit: expected >= 1 prompts, got {self.limit}")


def run_main_job(cfg: MainJobConfig, echo=print) -> dict:
    """Dispatch, break-even and catalog cost on the shipped model (loaded once); writes the report."""
    from surecall.models import default_heldout_path, default_model_dir
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    set_cpu_threads(cfg.threads, is_tiny=True)
    started = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = default_model_dir()
    prompts = load_prompts(default_heldout_path(), cfg.limit)
    echo(f"surecall run: model {model_dir.name}, {len(prompts)} held-out prompts, seed {cfg.breakeven.seed}, report in {out}/")
    llm = load_llm(model_dir, cfg.device)
    phase_s = {"load": time.perf_counter() - started}
    # 1. constrained calls -> Runtime.dispatch into a seeded scratch workspace
    echo(f"\n[1/3] constrained decoding ({'grounded in the workspace' if cfg.ground else 'plain catalog'}) + dispatch")
    dispatch = decode_and_dispatch(llm, prompts, seed_tools(), cfg.breakeven, ground=cfg.ground)
    echo(dispatch_summary(dispatch))
    phase_s["dispatch"] = time.perf_counter() - started - sum(phase_s.values())
    # 2. the break-even measurement on the seed catalog
    echo("\n[2/3] break-even: paired free/constrained passes per tool, real repair rounds")
    breakeven = run_breakeven(llm, seed_tools(), prompts, cfg.breakeven, out, str(model_dir))
    echo(breakeven["table"])
    phase_s["breakeven"] = time.perf_counter() - started - sum(phase_s.values())
    # 3. catalog cost with the model's own tokenizer
    echo("\n[3/3] catalog cost")
    cost = catalog_cost(model_dir)
    echo(cost["text"])
    report = {"model": str(model_dir), "num_prompts": len(prompts), "dispatch": dispatch,
              "breakeven": breakeven["payload"], "catalog_cost": cost["report"],
              "phase_s": phase_s, "wall_s": time.perf_counter() - started}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(_markdown(report, breakeven["table"], cost["text"]))
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in phase_s.items())
    echo(f"\nwrote {out}/report.json, report.md, breakeven.json and breakeven.png in {report['wall_s']:.0f} s ({phases})")
    return report


def decode_and_dispatch(llm, prompts: list[Prompt], tools: list[dict], bcfg: BreakevenConfig, ground: bool = True) -> dict:
    """Greedy constrained calls (prompt: the plain catalog; grammar: grounded unless told), each dispatched."""
    from surecall.config import SamplingParams
    from surecall.core.prompts import render_prompt
    from surecall.dispatch.runtime import Runtime
    from surecall.dispatch.stores import SQLiteStore
    from surecall.toolbox.catalog import coding_tools

    t0 = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="surecall-workspace-"))
    ws = seed_workspace(scratch, prompts)
    grounded = grounded_tools(tools, ws) if ground else tools
    llm.compile(grounded)
    t1 = time.perf_counter()
    ids = [render_prompt(p.messages, llm.tokenizer, tools, i) for i, p in enumerate(prompts)]
    results: list = [None] * len(prompts)
    for _tool, batch in tool_batches(prompts, bcfg.batch_size):  # similar lengths per batch: short tails
        sampling = [SamplingParams(temperature=0.0, max_tokens=bcfg.max_tokens, seed=bcfg.seed + i) for i in batch]
        for i, res in zip(batch, llm.generate([ids[i] for i in batch], tools=grounded, sampling=sampling, constrained=True),
                          strict=True):
            results[i] = res
    t2 = time.perf_counter()
    runtime = Runtime(coding_tools(scratch), SQLiteStore(scratch.parent / f"{scratch.name}.idem.sqlite"),
                      signing_key=secrets.token_bytes(32))
    cap = runtime.issue(["call:*", "read", "write", "exec", "approve:bash_execute"], [str(scratch)], ttl_s=600)
    rows = []
    for i, (prompt, res) in enumerate(zip(prompts, results, strict=True)):
        ws.restore()
        rows.append(_dispatch_one(runtime, cap, i, prompt, res, tools))
    seconds = {"seed_and_compile": t1 - t0, "decode": t2 - t1, "dispatch": time.perf_counter() - t2}
    return {"workspace": str(scratch), "seeded_files": len(ws.files), "seeded_dirs": len(ws.dirs), "grounded": ground,
            "seconds": seconds, "rows": rows}


def _dispatch_one(runtime, cap, i: int, prompt: Prompt, res, tools: list[dict]) -> dict:
    row = {"prompt": i, "requested_tool": prompt.tool, "tool": res.call.name if res.call else None,
           "parsed": res.call is not None, "matches_request": matches_request(res.call, prompt, tools),
           "error": res.error, "tokens": res.num_tokens, "arguments": res.call.arguments if res.call else None}
    if res.call is not None:
        obs = runtime.dispatch(res.call, cap, trajectory_id="make-run", turn=0, call_id=f"call-{i}")
        row.update(allowed=obs.decision.allowed, code=obs.decision.code, ok=bool(obs.ok),
                   tool_error=obs.error, idempotency=obs.idempotency_state, output=(obs.output or "")[:200])
    row["did_what_was_asked"] = bool(row["matches_request"] and row.get("ok"))
    return row


def dispatch_summary(dispatch: dict) -> str:
    rows = dispatch["rows"]
    n = len(rows)
    parsed = sum(r["parsed"] for r in rows)
    allowed = sum(bool(r.get("allowed")) for r in rows)
    ran_ok = sum(bool(r.get("ok")) for r in rows)
    asked = sum(r["did_what_was_asked"] for r in rows)
    files = [r for r in rows if r["tool"] in FILE_TOOLS]
    files_ok = sum(bool(r.get("ok")) for r in files)
    by_tool = Counter(str(r["tool"]) for r in rows)
    errors = Counter((r.get("tool_error") or "").split(":")[0][:60] for r in rows if r.get("tool_error"))
    lines = [
        f"  calls parsed: {parsed}/{n}; dispatched: {allowed} allowed, {n - allowed} denied; ran without a tool error: {ran_ok}/{n}",
        f"  file_view/file_edit calls that ran: {files_ok}/{len(files)}; calls that did what was asked "
        f"(requested tool and arguments, ran): {asked}/{n}",
        "  by tool: " + ", ".join(f"{k} {v}" for k, v in sorted(by_tool.items())),
        f"  workspace: {dispatch['workspace']} ({dispatch['seeded_files']} files, {dispatch['seeded_dirs']} directories seeded "
        "from the prompts; " + ("paths and old_str constrained to them)" if dispatch.get("grounded") else "grammar not narrowed)"),
    ]
    if errors:
        lines.append("  tool errors: " + "; ".join(f"{k} x{v}" for k, v in errors.most_common(4)))
    return "\n".join(lines)


def catalog_cost(model_dir: Path) -> dict:
    from surecall.breakeven.catalog_cost import measure as measure_cost
    from surecall.breakeven.catalog_cost import render
    from surecall.models.tokenizers import load_counting_tokenizer
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    tok = load_counting_tokenizer(model_dir)
    report = measure_cost(seed_tools(), tok.encode, tok.hf, num_turns=10, context_window=tok.context_window,
                          tokenizer_name=tok.name).to_dict()
    return {"report": report, "text": render(report, top=4)}


def _markdown(report: dict, table: str, cost_text: str) -> str:
    env = report["breakeven"]["environment"]
    return "\n".join([
        "# surecall run report", "",
        f"model: `{report['model']}`; prompts: {report['num_prompts']}; wall time: {report['wall_s']:.0f} s; "
        f"device {env['device']}, torch {env['torch']}, load average {env['load_average']}, {env['cpu_count']} CPUs", "",
        "## Dispatch of constrained calls", "```", dispatch_summary(report["dispatch"]), "```", "",
        "## Break-even", "```", table, "```", "",
        "## Catalog cost", "```", cost_text, "```", "",
    ])
