"""Multi-turn agent episodes over the four coding tools (deterministic from a seed).

An episode is OpenAI-style chat messages: a user request, assistant turns that either call
tools (`tool_calls`, one or two per turn) or answer in text, and `tool` messages with what the
toolbox would have returned (synthetic, in the toolbox's own output format). Kinds: a call then
a text answer, a chain (the result decides the next call), two parallel calls, a request
answered in text alone, and a follow-up user turn. The single-call requests come from
corpus.py; this module does not tokenize or train (train.py) and runs no tool.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from surecall.models.training import corpus as cp
from surecall.models.training import snippets as sn

KINDS = ("answer", "chain", "parallel", "text", "followup")
_KIND_WEIGHTS = (0.33, 0.25, 0.15, 0.15, 0.12)
_Result = tuple[str, dict]  # (tool message content, facts an answer or a next call may use)


def call_message(calls: list[tuple[str, dict]]) -> dict:
    """An assistant turn with one or more calls (arguments as objects)."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}}
                           for n, a in calls]}


def text_message(text: str) -> dict:
    return {"role": "assistant", "content": text}


def tool_message(name: str, content: str) -> dict:
    return {"role": "tool", "name": name, "content": content}


def gold_calls(message: dict) -> list[tuple[str, dict]]:
    """(name, arguments) of an assistant turn's calls; [] for a text answer."""
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def _phrase(rng: random.Random, split: str, shared: list[str], reserved: list[str]) -> str:
    """A phrasing; `reserved` ones only in the held-out split (30% of its draws)."""
    if split == "heldout" and rng.random() < 0.3:
        return rng.choice(reserved)
    return rng.choice(shared)


def _q(text: str) -> str:
    return f"`{text}`" if "\n" not in text and "`" not in text else "it"


# --- synthetic tool results (the toolbox's output format) ----------------------------------
def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:>6}\t{line}" for i, line in enumerate(lines))


def _view_result(rng, args, split, must_contain: str | None = None) -> _Result:
    path, offset, limit = args["path"], args.get("offset", 1), args.get("limit", 2000)
    if offset > 1 and (offset > 2_000 and rng.random() < 0.5 or rng.random() < 0.06):
        num = rng.randint(0, min(offset - 1, 900))  # the toolbox refuses offset > max(num, 1)
        return (f"error: offset {offset} is past the end of {path!r}, which has {num} lines",
                {"ok": False, "num_lines": num})
    shown = [sn.code_line(rng, split) for _ in range(min(limit, rng.randint(2, 5)))]
    if must_contain is not None:
        shown[rng.randrange(len(shown))] = must_contain
    last = offset + len(shown) - 1
    at_end = len(shown) < limit or rng.random() < 0.4
    num = last if at_end else last + rng.randint(1, 400)
    note = (f"[end of file: lines {offset}-{last} of {num}]" if at_end
            else f"[lines {offset}-{last} of {num}; next offset {last + 1}]")
    return f"{_numbered(shown, offset)}\n{note}", {"ok": True, "num_lines": num, "first": offset,
                                                   "last": last}


def _edit_result(rng, args, split) -> _Result:
    path = args["path"]
    if rng.random() < 0.12:
        return (f"error: old_str was not found in {path!r} (0 matches); the file is unchanged",
                {"ok": False})
    count = rng.randint(2, 6) if args.get("allow_multiple") else 1
    line = rng.randint(1, 300)
    new_lines = args["new_str"].split("\n")[:4] if args["new_str"] else []
    context = [sn.code_line(rng, split)] + new_lines + [sn.code_line(rng, split)]
    first = max(line - 1, 1)
    text = (f"Edited {path}: replaced {count} occurrence(s), first at line {line}.\n"
            f"{_numbered(context, first)}")
    return text, {"ok": True, "count": count, "line": line}


def _grep_result(rng, args, split) -> _Result:
    num = rng.choice([0, 1, 1, 2, 2, 3, 4])
    matches = [(sn.path(rng, split), rng.randint(1, 900), sn.code_line(rng, split))
               for _ in range(num)]
    files = rng.randint(max(num, 1), 60)
    lines = [f"{p}:{n}: {t}" for p, n, t in matches]
    lines.append(f"[{num} match(es) in {files} file(s) searched]")
    facts = {"ok": True, "num": num, "files": files}
    if matches:
        facts |= {"first_path": matches[0][0], "first_line": matches[0][1]}
    return "\n".join(lines), facts


_TEST_COMMANDS = ("pytest -q", "make test", "npm test", "cargo test", "go test ./...")


def _bash_result(rng, args, split) -> _Result:
    timeout = args.get("timeout_ms", 120_000)
    if rng.random() < 0.06:
        return (f"error: command timed out after {timeout} ms; its whole process tree was killed",
                {"ok": False, "timed_out": True, "timeout": timeout})
    status = 0 if rng.random() < 0.7 else rng.choice([1, 1, 2, 127])
    if args["command"] in _TEST_COMMANDS:
        passed = rng.randint(1, 240)
        out = (f"{passed} passed in {rng.randint(1, 90) / 10:.2f}s" if status == 0 else
               f"{rng.randint(1, 5)} failed, {passed} passed in {rng.randint(1, 90) / 10:.2f}s")
    else:
        out = "\n".join(sn.word(rng) for _ in range(rng.randint(0, 3)))
    body = f"{out}\n[exit status {status}]" if out else f"[exit status {status}]"
    return body, {"ok": True, "status": status}


_RESULTS: dict[str, Callable] = {"file_view": _view_result, "file_edit": _edit_result,
                                 "grep_search": _grep_result, "bash_execute": _bash_result}


# --- short text answers about one result ---------------------------------------------------
def _answer(tool: str, args: dict, facts: dict) -> str:
    if tool == "file_view":
        if not facts["ok"]:
            return (f"I couldn't show {_q(args['path'])}: offset {args.get('offset', 1)} is past "
                    f"its end ({facts['num_lines']} lines).")
        return (f"{_q(args['path'])} has {facts['num_lines']} lines; shown are lines "
                f"{facts['first']}-{facts['last']}.")
    if tool == "file_edit":
        if not facts["ok"]:
            return f"The edit failed: that text is not in {_q(args['path'])}, so the file is unchanged."
        return (f"Done: {_q(args['path'])} changed in {facts['count']} place(s), first at line "
                f"{facts['line']}.")
    if tool == "grep_search":
        if facts["num"] == 0:
            return f"No matches for {_q(args['pattern'])} in {facts['files']} file(s)."
        return (f"Found {facts['num']} match(es); the first is in {_q(facts['first_path'])} at "
                f"line {facts['first_line']}.")
    if not facts["ok"]:
        return f"The command timed out after {facts['timeout']} ms and was killed."
    if facts["status"] == 0:
        return "The command succeeded (exit status 0)."
    return f"The command failed with exit status {facts['status']}."


def _first_call(rng: random.Random, split: str, tool: str | None = None) -> tuple[str, str, dict]:
    """(request text, tool, arguments) of a single-call request from corpus.py."""
    row = cp.request(rng, split, tool)
    return row["messages"][0]["content"], row["tool"], row["arguments"]


def _run(rng, split, tool, args, **kw) -> _Result:
    return _RESULTS[tool](rng, args, split, **kw)


# --- episode kinds ----------------------------------------------------------------------------
def _answer_episode(rng, split) -> list[dict]:
    text, tool, args = _first_call(rng, split)
    content, facts = _run(rng, split, tool, args)
    return [{"role": "user", "content": text}, call_message([(tool, args)]),
            tool_message(tool, content), text_message(_answer(tool, args, facts))]


def _chain_grep_view(rng, split):
    pat = sn.pattern(rng, split)
    text = _phrase(rng, split, [
        "Find {r} and open the first file that matches", "Search for {r}, then show me the first file with a match",
        "grep {r} and view the first hit"], ["Where is {r} used? Open whichever file comes up first."]
    ).format(r=cp.show(pat))
    args = {"pattern": pat}
    content, facts = _grep_result(rng, args, split)
    steps = [{"role": "user", "content": text}, call_message([("grep_search", args)]),
             tool_message("grep_search", content)]
    if facts["num"] == 0:
        return steps + [text_message(f"No matches for {_q(pat)}, so there is no file to open.")]
    view = {"path": facts["first_path"]}
    return steps + _then(rng, split, "file_view", view)


def _chain_view_edit(rng, split):
    path, old, new = sn.path(rng, split), sn.code_line(rng, split), sn.code_line(rng, split)
    text = _phrase(rng, split, [
        "Open {p}, then change {o} to {n} there", "Show me {p} and replace {o} with {n} in it",
        "Look at {p} first, then edit {o} into {n}"], ["Have a look at {p}; once you see {o}, make it {n}."]
    ).format(p=cp.show(path), o=cp.show(old), n=cp.show(new))
    view = {"path": path}
    content, facts = _view_result(rng, view, split, must_contain=old)
    steps = [{"role": "user", "content": text}, call_message([("file_view", view)]),
             tool_message("file_view", content)]
    if not facts["ok"]:
        return steps + [text_message(_answer("file_view", view, facts))]
    return steps + _then(rng, split, "file_edit", {"path": path, "old_str": old, "new_str": new})


def _chain_edit_test(rng, split):
    path, old, new = sn.path(rng, split), sn.code_line(rng, split), sn.code_line(rng, split)
    cmd = rng.choice(_TEST_COMMANDS)
    text = _phrase(rng, split, [
        "In {p} change {o} to {n}, then run {c}", "Replace {o} with {n} in {p} and run the tests with {c}",
        "Edit {p}: {o} becomes {n}. Afterwards run {c}"], ["Fix {p} by turning {o} into {n}, and check it with {c}."]
    ).format(p=cp.show(path), o=cp.show(old), n=cp.show(new), c=cp.show(cmd))
    edit = {"path": path, "old_str": old, "new_str": new}
    content, facts = _edit_result(rng, edit, split)
    steps = [{"role": "user", "content": text}, call_message([("file_edit", edit)]),
             tool_message("file_edit", content)]
    if not facts["ok"]:
        return steps + [text_message(f"The edit failed: that text is not in {_q(path)}, so I did "
                                     "not run the tests.")]
    return steps + _then(rng, split, "bash_execute", {"command": cmd})


def _chain_run_view(rng, split):
    cmd, path = sn.command(rng, split), sn.path(rng, split)
    text = _phrase(rng, split, [
        "Run {c} and then show me {p}", "Execute {c}, then open {p}", "First run {c}; after that display {p}"],
        ["Kick off {c} and, once it's done, pull up {p}."]).format(c=cp.show(cmd), p=cp.show(path))
    run = {"command": cmd}
    content, _ = _bash_result(rng, run, split)
    steps = [{"role": "user", "content": text}, call_message([("bash_execute", run)]),
             tool_message("bash_execute", content)]
    return steps + _then(rng, split, "file_view", {"path": path})


def _then(rng, split, tool, args) -> list[dict]:
    content, facts = _run(rng, split, tool, args)
    return [call_message([(tool, args)]), tool_message(tool, content),
            text_message(_answer(tool, args, facts))]


def _chain_episode(rng, split):
    return rng.choice([_chain_grep_view, _chain_view_edit, _chain_edit_test, _chain_run_view])(rng, split)


def _parallel_episode(rng, split):
    tools = rng.choice([("file_view", "file_view"), ("grep_search", "bash_execute"),
                        ("bash_execute", "bash_execute"), ("file_view", "grep_search"),
                        ("grep_search", "grep_search"), ("file_edit", "bash_execute")])
    (t1, n1, a1), (t2, n2, a2) = (_first_call(rng, split, t) for t in tools)
    text = _phrase(rng, split, ["Two things. First: {a} Second: {b}", "{a}\nAlso: {b}",
                                "Do both at once:\n1. {a}\n2. {b}"],
                   ["In parallel, please:\n- {a}\n- {b}"]).format(a=t1, b=t2)
    (c1, f1), (c2, f2) = _run(rng, split, n1, a1), _run(rng, split, n2, a2)
    return [{"role": "user", "content": text}, call_message([(n1, a1), (n2, a2)]),
            tool_message(n1, c1), tool_message(n2, c2),
            text_message(_answer(n1, a1, f1) + " " + _answer(n2, a2, f2))]


def _text_episode(rng, split, tools: list[dict]):
    r = rng.random()
    if r < 0.25:
        q = _phrase(rng, split, ["hi", "Hello", "hey there", "Hi!", "good morning"], ["Howdy"])
        a = "Hello! I can view, edit and search files and run commands. What do you need?"
    elif r < 0.45:
        q = _phrase(rng, split, ["What tools do you have?", "Which tools can you use?",
                                 "list your tools", "What can you do?"],
                    ["Tell me which tools are available to you."])
        a = "I have four tools: " + ", ".join(t["name"] for t in tools[:-1]) + f" and {tools[-1]['name']}."
    elif r < 0.8:
        tool = rng.choice(tools)
        q = _phrase(rng, split, ["What does {t} do?", "Explain the {t} tool", "what is {t} for?"],
                    ["Describe {t} briefly."]).format(t=tool["name"])
        a = f"{tool['name']}: {tool['description']}"
    else:
        q = _phrase(rng, split, ["thanks", "Thank you!", "great, thanks", "ok thanks"], ["Cheers, that's all."])
        a = "You're welcome."
    return [{"role": "user", "content": q}, text_message(a)]


def _followup_episode(rng, split, tools):
    first = _answer_episode(rng, split)
    if rng.random() < 0.4:
        return first + _text_episode(rng, split, tools)
    return first + _answer_episode(rng, split)


def _episode(rng: random.Random, split: str, tools: list[dict]) -> dict:
    kind = rng.choices(KINDS, _KIND_WEIGHTS)[0]
    if kind == "answer":
        messages = _answer_episode(rng, split)
    elif kind == "chain":
        messages = _chain_episode(rng, split)
    elif kind == "parallel":
        messages = _parallel_episode(rng, split)
    elif kind == "text":
        messages = _text_episode(rng, split, tools)
    else:
        messages = _followup_episode(rng, split, tools)
    return {"kind": kind, "messages": messages}


def generate_episodes(config: cp.CorpusConfig, tools: list[dict]) -> list[dict]:
    """`config.num_rows` episodes, a pure function of (seed, split) and the tool list."""
    rng = random.Random(config.seed * 1_000_033 + 17 + cp.SPLIT_SALT[config.split])
    return [_episode(rng, config.split, tools) for _ in range(config.num_rows)]


def user_texts(episode: dict) -> list[str]:
    return [m["content"] for m in episode["messages"] if m["role"] == "user"]
