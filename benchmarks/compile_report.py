"""The aggregation and report of benchmarks/compile.py: per-subset summaries, goals, tables.

`summarise` folds the per-schema rows of one engine into counts, percentiles and failure
reasons; `goals` states issue 15's goals with the measured figure and whether each is met;
`readme_table` is the compact per-subset table for the README; `write` puts the JSON and the
markdown side by side. Nothing here compiles or times anything.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import Counter
from pathlib import Path

SHORT = {"ours": "ours", "xgrammar": "xgr", "llguidance": "llg", "llguidance-lenient": "llg-len", "outlines": "outl"}
# Engines whose defaults close objects (declared keys only, declared order) and that can compile open.
OPEN_ENGINES = ("ours", "xgrammar")
OURS_OPEN = ("allow_additional_properties=True, any_property_order=True (any order only for objects of at most 4 "
             "properties that take no extra keys: under the first flag, those with additionalProperties false), "
             "checked on the grammar's byte DFA")
OPEN_POLICY = (f"recompiled with undeclared keys allowed and any property order (ours: GrammarOptions {OURS_OPEN}, "
               "counted bounds spelled out, no token table; xgrammar: strict_mode=False, any_order=True)")
MB = 10**6

# --- aggregation -----------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


_COUNTS = ("valid_n", "valid_accepted", "invalid_n", "invalid_rejected", "invalid_relaxed", "walks", "walks_valid",
           "walks_unsound", "walks_relaxed", "bounds_relaxed")


def summarise(results: list[dict]) -> dict:
    ok = [r for r in results if r["ok"]]
    times = [r["ms"] for r in ok]
    tables = [r["table_bytes"] for r in ok if "table_bytes" in r]
    total = {k: sum(r.get(k, 0) for r in ok) for k in _COUNTS}
    # open: only schemas with a rejected valid instance are recompiled; the others count as they did
    # (opening objects only adds texts); a failed open compile keeps its default figure (a lower bound).
    total["valid_accepted_open"] = sum(r.get("valid_accepted_open", r.get("valid_accepted", 0)) for r in ok)
    total["open_errors"] = sum("open_error" in r for r in ok)
    reasons = Counter(r["reason"] for r in results if not r["ok"])
    return {
        "n": len(results), "compiled": len(ok), **total,
        "schemas_walks_all_valid": sum(r.get("walks_valid", 0) == r.get("walks", -1) for r in ok),
        "schemas_relaxing_bounds": sum(r.get("bounds_relaxed", 0) > 0 for r in ok),
        "check_errors": sum("check_error" in r for r in ok),
        "median_ms": _pct(times, 0.5), "p90_ms": _pct(times, 0.9), "max_ms": max(times, default=None),
        "table_p50_bytes": _pct(tables, 0.5), "table_p99_bytes": _pct(tables, 0.99),
        "table_max_bytes": max(tables, default=None),
        "peak_mib": max((r["peak_bytes"] for r in ok), default=0) / 2**20,
        "unsupported": dict(reasons.most_common(4)),
    }


def fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a: int, b: int) -> str:
    return "-" if not b else f"{a}/{b}"


def build_report(args, rows, subset_names, engines, catalog, sweep_s) -> dict:
    per_subset = {s: {e: summarise([r for r in rows if r["subset"] == s and r["engine"] == e]) for e in engines}
                  for s in subset_names}
    overall = {e: summarise([r for r in rows if r["engine"] == e]) for e in engines}
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {
        "command": " ".join(["python", "benchmarks/compile.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "settings": settings, "sweep_s": sweep_s, "per_subset": per_subset, "overall": overall,
        "goals": goals(per_subset, overall, catalog, rows), "seed_catalog": catalog,
        "our_failures": [r for r in rows if r["engine"] == "ours" and (not r["ok"] or r.get("walks_unsound")
                                                                        or r.get("valid_accepted", 0) < r.get("valid_n", 0))],
        "rows": rows,
    }


def _common_medians(rows: list[dict], a: str, b: str) -> tuple[float | None, float | None, int]:
    """Median compile ms of engines a and b over the schemas both compiled."""
    ms = {}
    for r in rows:
        if r["ok"] and r["engine"] in (a, b):
            ms.setdefault((r["subset"], r["id"]), {})[r["engine"]] = r["ms"]
    both = [v for v in ms.values() if len(v) == 2]
    return _pct([v[a] for v in both], 0.5), _pct([v[b] for v in both], 0.5), len(both)


def goals(per_subset: dict, overall: dict, catalog: dict, rows: list[dict]) -> list[dict]:
    """Issue 15's goals, each with the figure measured and whether it is met."""
    if "ours" not in overall:
        return []
    o, out = overall["ours"], []

    def goal(text, figure, met):
        out.append({"goal": text, "measured": figure, "met": bool(met)})

    goal("samples of every compiled schema 100% valid", f"{o['walks_valid']}/{o['walks']} walks valid "
         f"({o['walks_unsound']} unsound, {o['walks_relaxed']} break only a relaxed keyword)",
         o["walks"] and o["walks_valid"] == o["walks"])
    goal("no length or item bound relaxed", f"{o['schemas_relaxing_bounds']} compiled schemas relax one "
         f"({o['bounds_relaxed']} bounds)", o["schemas_relaxing_bounds"] == 0)
    goal("valid instances accepted 100%", f"{_ratio(o['valid_accepted'], o['valid_n'])} with objects closed to their "
         "declared properties in declared order (the default, as xgrammar's strict_mode)",
         o["valid_accepted"] == o["valid_n"])
    goal("valid instances accepted 100%, open objects", f"{_ratio(o['valid_accepted_open'], o['valid_n'])} "
         f"({OURS_OPEN}; {o['open_errors']} open compiles failed)",
         o["valid_accepted_open"] == o["valid_n"])
    if "xgrammar" in overall:
        behind = [f"{s} {v['ours']['compiled']}<{v['xgrammar']['compiled']}" for s, v in per_subset.items()
                  if v["ours"]["compiled"] < v["xgrammar"]["compiled"]]
        goal("coverage at least xgrammar's on every subset", "behind on: " + (", ".join(behind) or "none"), not behind)
        x = overall["xgrammar"]
        ours_ms, xgr_ms, num_both = _common_medians(rows, "ours", "xgrammar")
        goal("median compile no slower than xgrammar's", f"{fmt(o['median_ms'])} ms vs {fmt(x['median_ms'])} ms "
             f"(on the {num_both} schemas both compile: {fmt(ours_ms)} vs {fmt(xgr_ms)} ms)",
             ours_ms is not None and xgr_ms is not None and ours_ms <= xgr_ms)
    goal("no shared schema's table above 32 MB", f"max {fmt((o['table_max_bytes'] or 0) / MB)} MB, "
         f"p99 {fmt((o['table_p99_bytes'] or 0) / MB)} MB, p50 {fmt((o['table_p50_bytes'] or 0) / MB, 2)} MB",
         (o["table_max_bytes"] or 0) <= 32 * MB)
    if "cold_ms" in catalog:
        ratio = catalog.get("cold_over_xgrammar", catalog["cold_ms"] / catalog["xgrammar_ms"])
        goal("seed catalog, all bounds enforced, cold compile at most xgrammar's and table under 4 MB",
             f"cold {fmt(catalog['cold_ms'])} ms vs xgrammar {fmt(catalog['xgrammar_ms'])} ms "
             f"(median paired ratio {fmt(ratio, 2)}x over {catalog.get('repeats', '?')} interleaved repeats), table "
             f"{fmt(catalog['table_bytes'] / MB, 2)} MB, {len(catalog['relaxed'])} relaxed",
             ratio <= 1 and catalog["table_bytes"] < 4 * MB and not catalog["relaxed"])
    return out


# --- output ----------------------------------------------------------------------------------
def catalog_lines(report: dict) -> list[str]:
    """Real tool catalogs as one tagged union each, cold, ours vs xgrammar (no goal: a known gap)."""
    rows = [(name, c) for name, c in report.get("catalogs", {}).items() if "cold_ms" in c]
    if not rows:
        return []
    return ["## Real tool catalogs (tagged union of every tool, cold, in a fresh process)", "",
            "| catalog | tools | ours cold ms | xgrammar ms (8 threads) | paired ratio | states | table MB |",
            "|---|---|---|---|---|---|---|",
            *[f"| {name} | {c['tools']} | {fmt(c['cold_ms'], 0)} | {fmt(c['xgrammar_ms'], 0)} | "
              f"{fmt(c['cold_over_xgrammar'], 1)}x | {c['states']} | {fmt(c['table_bytes'] / MB, 2)} |" for name, c in rows]]


def readme_table(report: dict) -> list[str]:
    """The compact per-subset table for the README."""
    engines = list(report["overall"])
    checked = [e for e in engines if e != "llguidance-lenient"]
    timed = [e for e in engines if e != "llguidance-lenient"]
    opened = [e for e in engines if e in OPEN_ENGINES]
    head = (f"| subset | n | compiled {' / '.join(SHORT[e] for e in engines)} | valid accepted "
            f"{' / '.join(SHORT[e] for e in checked)} | valid accepted, open {' / '.join(SHORT[e] for e in opened)} "
            f"| invalid rejected {' / '.join(SHORT[e] for e in checked)} "
            f"| our samples valid | median ms {' / '.join(SHORT[e] for e in timed)} | our table p50 / max MB |")
    lines = [head, "|---" * 9 + "|"]
    for name, s in [*report["per_subset"].items(), ("**all**", report["overall"])]:
        ours = s.get("ours", {})
        lines.append(" | ".join([
            f"| {name}", str(s[engines[0]]["n"]), " / ".join(str(s[e]["compiled"]) for e in engines),
            " / ".join(_ratio(s[e]["valid_accepted"], s[e]["valid_n"]) for e in checked),
            " / ".join(_ratio(s[e]["valid_accepted_open"], s[e]["valid_n"]) for e in opened) or "-",
            " / ".join(_ratio(s[e]["invalid_rejected"], s[e]["invalid_n"]) for e in checked),
            _ratio(ours.get("walks_valid", 0), ours.get("walks", 0)),
            " / ".join(fmt(s[e]["median_ms"], 0) for e in timed),
            f"{fmt((ours.get('table_p50_bytes') or 0) / MB)} / {fmt((ours.get('table_max_bytes') or 0) / MB)} |"]))
    return lines


def write(base: Path, report: dict) -> None:
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    base.with_suffix(".md").write_text("\n".join(markdown(report)) + "\n")
    print(f"wrote {base.with_suffix('.md')} and .json", file=sys.stderr)


def markdown(report: dict) -> list[str]:
    st = report["settings"]
    engines = list(report["overall"])
    lines = [
        "# Compile benchmark: surecall vs xgrammar vs llguidance vs outlines-core (Llama-3 vocabulary)", "",
        f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ",
        f"Sweep: {report['sweep_s']:.0f} s; {st['per_subset']} schemas per subset (seed {st['seed']} per subset), "
        f"compile timeout {st['timeout_s']} s, check timeout {st['check_timeout_s']} s, worker address space "
        f"{st['rss_gib']} GiB, {st['walks']} random walks per schema (half cut at the fewest tokens + 2). "
        f"ours, xgr, llg and llg-len run first, one after another on every schema; outlines-core then runs the "
        f"same schemas in two lanes of its own, so the timed engines do not share the cores with it (timings "
        f"still include the machine's load). "
        f"Schemas left out at --max-minutes {st['max_minutes']:g}: {report.get('schemas_left_out_for_time', 0)} "
        "(the sweep goes round-robin over the subsets).", "",
        "Engines: ours = surecall TokenTable (defaults); xgr = xgrammar compile_json_schema(any_whitespace=False, "
        "strict_mode default); llg = llguidance defaults, llg-len = llguidance lenient (unknown keywords ignored), "
        "both timed as matcher construction + first mask (no table); outl = outlines-core Index over its regex "
        "(whitespace `[ ]?`).", "",
        "Instances: the schemas' own tests whose label jsonschema (no format checker) confirms. A valid one counts "
        "as accepted if any of three spellings is (one-space, compact, our grammar's key order); an invalid one as "
        "rejected if every spelling is, counted only where the violated keyword is enforced (ours: not in "
        "`relaxed`; the peers list nothing, so all count). Samples: our random walks that parse and validate "
        "against the original schema with every keyword (relaxed ones too).", "",
        "Object policy: by default ours and xgr close an object without `additionalProperties` to its declared "
        "properties and demand declared order (stricter than JSON Schema, never looser; OpenAI strict mode does "
        "the same), so a valid instance with an undeclared key or another key order is rejected. \"Valid accepted, "
        f"open\" measures the alternative: the schemas with a rejected valid instance are {OPEN_POLICY}.", "",
        "## README table", "", *readme_table(report), "",
        "## Goals (issue 15)", "", "| goal | measured | met |", "|---|---|---|",
        *[f"| {g['goal']} | {g['measured']} | {'yes' if g['met'] else '**no**'} |" for g in report["goals"]], "",
        "## Per engine and subset", "",
        "| subset | engine | compiled | compile med/p90/max ms | table p50/p99/max MB | peak MiB | valid acc | "
        "invalid rej | walks valid | failures |", "|---" * 10 + "|"]
    for name, s in [*report["per_subset"].items(), ("all", report["overall"])]:
        for e in engines:
            x = s[e]
            tables = "/".join(fmt((x[k] or 0) / MB, 2) if x[k] is not None else "-"
                              for k in ("table_p50_bytes", "table_p99_bytes", "table_max_bytes"))
            reasons = "; ".join(f"{k} x{v}" for k, v in x["unsupported"].items())
            lines.append(f"| {name} | {e} | {x['compiled']}/{x['n']} | "
                         + "/".join(fmt(x[k], 0) for k in ("median_ms", "p90_ms", "max_ms"))
                         + f" | {tables} | {fmt(x['peak_mib'], 0)} | {_ratio(x['valid_accepted'], x['valid_n'])} | "
                         f"{_ratio(x['invalid_rejected'], x['invalid_n'])} | {_ratio(x['walks_valid'], x['walks'])} | "
                         f"{reasons} |")
    lines += ["", "## Seed four-tool catalog (tagged union, with its bounds)", "", "```",
              json.dumps(report["seed_catalog"], indent=1, default=str), "```", "", *catalog_lines(report), "",
              "## Our failures (first 40)", ""]
    for r in report["our_failures"][:40]:
        what = r.get("reason") or (f"walks unsound: {r.get('walk_errors')}" if r.get("walks_unsound")
                                   else f"valid rejected: {r.get('rejected_valid')}; {_open_note(r)}")
        lines.append(f"- {r['subset']} `{r['id']}`: {what}")
    return lines


def _open_note(row: dict) -> str:
    if "open_error" in row:
        return f"open compile failed ({row['open_error']})"
    if "valid_accepted_open" not in row:
        return "open: not run"
    if row["valid_accepted_open"] == row["valid_n"]:
        return "all accepted open"
    return f"open {row['valid_accepted_open']}/{row['valid_n']}, still rejected: {row.get('rejected_valid_open')}"
