"""An attacker's run against surecall's public surfaces: per family, how many attacks held.

Families: capabilities (forged, mutated, widened, expired, a parent presented, rights the call
lacks), sandbox (/proc/sys, host root, setuid files, network, /etc/shadow, a fork bomb, symlinks),
file tools (traversal, symlinks, a directory/symlink swap race, huge output, lost updates, ReDoS,
FIFOs), idempotency (replay, concurrent duplicates, one call id with other arguments, a stalled
lease, unscoped keys, corrupted rows) and bad input (malformed calls, deep nesting, duplicate keys,
NaN, lone surrogates, and the `surecall` CLI fed bad flags and files). Everything goes through
public APIs: `Runtime.dispatch` with `coding_tools`, `Runtime.issue/attenuate`, `Capability`,
`check_call`, the stores, and `python -m surecall` as a subprocess.

A case HOLDS only when the attack demonstrably failed: denied, refused, or its effect checked from
the host and found absent. An attack that worked, a check that could not be made, or a raise where
the API promises an Observation counts as NOT held, with the reason. Nothing here writes to /proc,
/sys or the host's /etc; the fork bomb runs only when a pids cgroup bounds it (else it is skipped).
One file past 400 lines on purpose: each attack is a short registered function, and keeping them
in one place makes the list of what was tried readable top to bottom.
Usage: python benchmarks/adversarial.py [--quick] [--family NAME ...] [--verbose]
Prints `family: tried N, held M` per family and the cases that broke, then one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import multiprocessing
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from surecall.dispatch.capability import Authority, Capability
from surecall.dispatch.runtime import Runtime
from surecall.dispatch.stores import SQLiteStore
from surecall.errors import SurecallError
from surecall.toolbox.catalog import coding_tools
from surecall.tools import SideEffect, Tool

FAMILIES = ("capabilities", "sandbox", "file_tools", "idempotency", "bad_input")
FULL_RIGHTS = ["call:*", "read", "write", "exec", "approve:*"]
CASES: list[tuple[str, str, Callable]] = []


def case(family: str, name: str):
    """Register `fn(ctx) -> (held, detail)` as one attack."""
    def register(fn):
        CASES.append((family, name, fn))
        return fn

    return register


class Skip(Exception):
    """A case that cannot be tried here (the reason is reported; it counts as neither tried nor held)."""


# --- the target: a runtime over a scratch workspace, and a secret outside it ----------------------
class Clock:
    """The runtime's clock, which an attack may move (expiry, leases)."""

    def __init__(self):
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@dataclasses.dataclass
class Target:
    root: Path
    quick: bool
    key: bytes = dataclasses.field(default_factory=lambda: secrets.token_bytes(32))
    clock: Clock = dataclasses.field(default_factory=Clock)
    secret: str = dataclasses.field(default_factory=lambda: f"SURECALL-ADV-SECRET-{secrets.token_hex(8)}")
    counter: int = 0
    redis: tuple | None = None  # (process, url) of the durable redis-server, started on first use

    def __post_init__(self):
        self.ws = self.root / "ws"
        self.outside = self.root / "outside"
        for d in (self.ws, self.outside, self.ws / "sub"):
            d.mkdir(parents=True, exist_ok=True)
        (self.outside / "secret.txt").write_text(f"{self.secret}\nEDITME\n")
        (self.ws / "file.txt").write_text("inside the workspace\nEDITME\n")
        (self.ws / "sub" / "x.txt").write_text("inside sub\n")
        self.runtime = self.new_runtime()
        self.cap = self.runtime.issue(FULL_RIGHTS, [str(self.ws)], ttl_s=3600)

    def new_runtime(self, workspace: Path | None = None, store: str | None = None, **kw) -> Runtime:
        """A runtime over `workspace` with the store at `store` (a SQLite path or a redis:// URL)."""
        from surecall.dispatch.stores import open_store

        records = open_store(store) if store else SQLiteStore(self.root / "idem.sqlite")
        return Runtime(coding_tools(workspace or self.ws), records, signing_key=self.key, clock=self.clock, **kw)

    def close(self) -> None:
        if self.redis is not None:
            self.redis[0].terminate()
            self.redis[0].wait(10)

    def call_id(self) -> str:
        self.counter += 1
        return f"adv-{self.counter}"

    def dispatch(self, call, cap=None, runtime=None, **ids):
        """(observation, None) or (None, the exception dispatch raised)."""
        rt = runtime or self.runtime
        ids = {"trajectory_id": "adversary", "turn": 0, "call_id": self.call_id(), **ids}
        try:
            return rt.dispatch(call, self.cap if cap is None else cap, **ids), None
        except Exception as exc:  # dispatch promises an Observation: a raise is itself a finding
            return None, exc

    def bash(self, command: str, cap=None, timeout_ms: int = 10_000):
        return self.dispatch({"name": "bash_execute", "arguments": {"command": command, "timeout_ms": timeout_ms}}, cap)

    def view(self, path: str, cap=None):
        return self.dispatch({"name": "file_view", "arguments": {"path": path, "offset": 1, "limit": 100}}, cap)

    def edit(self, path: str, old: str, new: str, cap=None, runtime=None, **extra):
        return self.dispatch({"name": "file_edit", "arguments": {"path": path, "old_str": old, "new_str": new, **extra}},
                             cap, runtime)

    def secret_intact(self) -> bool:
        return (self.outside / "secret.txt").read_text() == f"{self.secret}\nEDITME\n"


def raised(exc) -> tuple[bool, str]:
    return False, f"dispatch raised {type(exc).__name__}: {str(exc)[:160]}"


def denied(result, what: str = "") -> tuple[bool, str]:
    """Held when the call came back as a denied Observation."""
    obs, exc = result
    if exc is not None:
        return raised(exc)
    if not obs.decision.allowed:
        return True, f"denied ({obs.decision.code})"
    return False, f"allowed{': ' + what if what else ''} ({obs.decision.reason[:120]})"


def text_of(obs) -> str:
    return (obs.output or "") + (obs.error or "")


def no_secret(t: Target, result) -> tuple[bool, str]:
    """Held when nothing of the outside secret came back (a denial or a refusal both hold)."""
    obs, exc = result
    if exc is not None:
        return raised(exc)
    if t.secret in text_of(obs) or t.secret in json.dumps(obs.data, default=str):
        return False, "the outside secret came back"
    return True, f"no secret ({obs.decision.code}{'; ' + obs.error[:80] if obs.error else ''})"


def from_dict_or_refused(data: dict):
    """A capability rebuilt from (tampered) data; None when the library refuses to build it."""
    try:
        return Capability.from_dict(data)
    except (SurecallError, ValueError, TypeError, KeyError):
        return None


def narrow_cap(t: Target, rights=("call:file_view", "read"), objects=None, **kw):
    return t.runtime.issue(list(rights), [str(o) for o in (objects or [t.ws])], **kw)


# === capabilities ===============================================================================
@case("capabilities", "forged: random signature")
def _(t):
    data = t.cap.to_dict()
    data["signature"] = secrets.token_hex(32)
    forged = from_dict_or_refused(data)
    return (True, "refused at construction") if forged is None else denied(t.view("file.txt", forged))


@case("capabilities", "forged: no signature")
def _(t):
    data = t.cap.to_dict()
    data["signature"] = ""
    forged = from_dict_or_refused(data)
    return (True, "refused at construction") if forged is None else denied(t.view("file.txt", forged))


@case("capabilities", "forged: signed by a foreign key")
def _(t):
    foreign = Authority(secrets.token_bytes(32)).issue(FULL_RIGHTS, [str(t.ws)])
    return denied(t.view("file.txt", foreign))


def _mutations(t: Target):
    later = t.clock() + 10 * 86400
    return {
        "rights widened": lambda d: d.update(rights=sorted({*d["rights"], "exec", "approve:*", "call:*", "write"})),
        "objects widened to /": lambda d: d.update(objects=["/"]),
        "cost ceiling removed": lambda d: d.update(max_cost=None),
        "expiry extended": lambda d: d.update(expires_at=later),
        "issued_at moved": lambda d: d.update(issued_at=0.0),
        "signature bit flipped": lambda d: d.update(signature=d["signature"][:-1] + ("0" if d["signature"][-1] != "0" else "1")),
    }


for _name in ("rights widened", "objects widened to /", "cost ceiling removed", "expiry extended",
              "issued_at moved", "signature bit flipped"):
    @case("capabilities", f"mutated: {_name}")
    def _(t, _name=_name):
        base = narrow_cap(t, rights=["call:file_view", "read"], objects=[t.ws / "sub"], max_cost=1.0, ttl_s=60)
        data = base.to_dict()
        _mutations(t)[_name](data)
        forged = from_dict_or_refused(data)
        if forged is None:
            return True, "refused at construction"
        # rights/objects: try what only the widened capability could do; the rest: what the original could
        # (so a denial can only come from the signature, not from the original's own limits)
        if "rights" in _name:
            return denied(t.bash("true", forged))
        return denied(t.view("file.txt" if "objects" in _name else "sub/x.txt", forged))


for _field, _value in (("rights", ["call:*", "read", "write", "exec", "approve:*"]), ("objects", ["/"]),
                       ("max_cost", 1e9), ("expires_at", "later")):
    @case("capabilities", f"widened by attenuate: {_field}")
    def _(t, _field=_field, _value=_value):
        parent = narrow_cap(t, rights=["call:file_view", "read"], objects=[t.ws], max_cost=5.0, ttl_s=60)
        value = t.clock() + 86400 if _value == "later" else _value
        try:
            child = t.runtime.attenuate(parent, **{_field: value})
        except (SurecallError, ValueError) as exc:
            return True, f"refused: {type(exc).__name__}"
        wider = {
            "rights": lambda c: "exec" in c.rights, "objects": lambda c: "/" in c.objects,
            "max_cost": lambda c: c.max_cost is None or c.max_cost > parent.max_cost,
            "expires_at": lambda c: c.expires_at > parent.expires_at,
        }[_field](child)
        return (False, f"attenuate returned a child wider in {_field}") if wider else (True, "the child stayed narrow")


@case("capabilities", "child's rights rewritten to the root's (signature kept)")
def _(t):
    child = t.runtime.attenuate(t.cap, rights=["call:file_view", "read"])
    data = child.to_dict()
    data["rights"] = sorted(FULL_RIGHTS)
    forged = from_dict_or_refused(data)
    return (True, "refused at construction") if forged is None else denied(t.bash("true", forged))


@case("capabilities", "expired: used after its expiry")
def _(t):
    cap = narrow_cap(t, ttl_s=1)
    t.clock.offset_s = 3600
    try:
        return denied(t.view("file.txt", cap))
    finally:
        t.clock.offset_s = 0.0


@case("capabilities", "not yet valid: issued in the future")
def _(t):
    t.clock.offset_s = 3600
    cap = narrow_cap(t, ttl_s=7200)
    t.clock.offset_s = 0.0
    return denied(t.view("file.txt", cap))


@case("capabilities", "presenting the parent a child carries")
def _(t):
    child = t.runtime.attenuate(t.cap, rights=["call:file_view", "read"])
    wire = json.loads(json.dumps(child.to_dict()))  # all a sub-agent would be handed
    candidates = [d for d in _nested_capabilities(wire) if d is not wire]
    in_memory = getattr(child, "parent", None)
    if isinstance(in_memory, Capability):
        candidates.append(in_memory.to_dict())
    if not candidates:
        return True, "the child carries no recoverable parent capability"
    for data in candidates:
        parent = from_dict_or_refused(data)
        if parent is None:
            continue
        obs, exc = t.bash("echo parent-works", parent)
        if exc is None and obs.decision.allowed:
            return False, "the recovered parent ran bash_execute (every right is back)"
    return True, "the recovered parent was refused"


def _nested_capabilities(value) -> list[dict]:
    """Every object in `value` that looks like a signed capability (rights and a signature)."""
    found, stack = [], [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "rights" in node and node.get("signature"):
                found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


@case("capabilities", "right missing: call:file_view cap runs bash")
def _(t):
    return denied(t.bash("echo hi", narrow_cap(t)))


@case("capabilities", "approval missing: bash without approve:bash_execute")
def _(t):
    return denied(t.bash("echo hi", narrow_cap(t, rights=["call:*", "read", "write", "exec"])))


@case("capabilities", "sibling prefix: /ws admits /ws_evil")
def _(t):
    evil = t.root / "ws_evil"
    evil.mkdir(exist_ok=True)
    (evil / "x.txt").write_text("x")
    authority = Authority(t.key)
    cap = authority.issue(["read"], [str(t.ws)])
    decision = authority.approve(cap, "read", str(evil / "x.txt"))
    return (not decision.allowed, f"{'denied' if not decision.allowed else 'allowed'}: {decision.reason[:100]}")


@case("capabilities", "exec without write: bash writes the workspace")
def _(t):
    cap = narrow_cap(t, rights=["call:bash_execute", "exec", "approve:bash_execute"])
    target = t.ws / f"written-{secrets.token_hex(4)}.txt"
    obs, exc = t.bash(f"echo pwned > {target.name}", cap)
    if exc is not None:
        return raised(exc)
    wrote = target.exists()
    target.unlink(missing_ok=True)
    return (not wrote, "the file was written" if wrote else f"no write ({obs.decision.code})")


@case("capabilities", "exec without read: bash reads the workspace")
def _(t):
    cap = narrow_cap(t, rights=["call:bash_execute", "exec", "approve:bash_execute"])
    obs, exc = t.bash("cat file.txt", cap)
    if exc is not None:
        return raised(exc)
    leaked = "inside the workspace" in text_of(obs)
    return (not leaked, "the workspace file was read" if leaked else f"not read ({obs.decision.code})")


@case("capabilities", "cost ceiling: max_cost=1 runs a 300 s command")
def _(t):
    cap = narrow_cap(t, rights=["call:bash_execute", "exec", "read", "write", "approve:bash_execute"], max_cost=1.0)
    return denied(t.bash("true", cap, timeout_ms=300_000), "the ceiling did not bind")


@case("capabilities", "a forged dict presented (signature of another body)")
def _(t):
    # the signed dict form is accepted (it verifies); a copy of a narrow child with wider rights must not be
    data = t.runtime.attenuate(t.cap, rights=["call:file_view", "read"]).to_dict()
    data["rights"] = sorted(set(data["rights"]) | {"exec", "call:bash_execute", "approve:bash_execute"})
    return denied(t.bash("true", data))


@case("capabilities", "malformed fields: NaN expiry")
def _(t):
    data = t.cap.to_dict()
    data["expires_at"] = float("nan")
    forged = from_dict_or_refused(data)
    return (True, "refused at construction") if forged is None else denied(t.view("file.txt", forged))


# === sandbox ======================================================================================
def bash_output(t: Target, command: str, timeout_ms: int = 10_000) -> tuple[str | None, str]:
    obs, exc = t.bash(command, timeout_ms=timeout_ms)
    if exc is not None:
        return None, f"dispatch raised {type(exc).__name__}: {exc}"
    if not obs.decision.allowed:
        return None, f"denied: {obs.decision.reason[:100]}"
    if obs.error and "sandbox" in obs.error.lower() and "refused" in obs.error.lower():
        return None, obs.error[:120]
    return obs.output, ""


def sandbox_check(t: Target, command: str, broke_if: Callable[[str], bool], what: str) -> tuple[bool, str]:
    out, why = bash_output(t, command)
    if out is None:
        return True, f"the command did not run ({why})"
    return (False, what) if broke_if(out) else (True, f"not {what}")


@case("sandbox", "/proc/sys writable (core_pattern)")
def _(t):
    return sandbox_check(t, "test -w /proc/sys/kernel/core_pattern && echo WRITABLE || echo READONLY",
                         lambda out: "WRITABLE" in out, "/proc/sys/kernel/core_pattern is writable (host escape on crash)")


@case("sandbox", "/proc/sysrq-trigger writable")
def _(t):
    return sandbox_check(t, "test -w /proc/sysrq-trigger && echo WRITABLE || echo READONLY",
                         lambda out: "WRITABLE" in out, "/proc/sysrq-trigger is writable")


@case("sandbox", "command runs as host root")
def _(t):
    name = f"owner-{secrets.token_hex(4)}"
    out, why = bash_output(t, f"touch {name}; id -u")
    path = t.ws / name
    if out is None or not path.exists():
        return True, f"no file made ({why or 'touch failed'})"
    uid = path.stat().st_uid
    path.unlink()
    if os.geteuid() != 0:
        return True, f"the runtime is not root (uid {os.geteuid()}): the file is owned by uid {uid}"
    return (uid != 0, f"a file the command made is owned by host uid {uid}")


@case("sandbox", "setuid-root file made in the workspace")
def _(t):
    name = f"suid-{secrets.token_hex(4)}"
    bash_output(t, f"cp /bin/bash {name} && chmod 4755 {name}")
    path = t.ws / name
    if not path.exists():
        return True, "no copy made"
    st = path.stat()
    path.unlink()
    broke = bool(st.st_mode & stat.S_ISUID) and st.st_uid == 0
    return (not broke, "a setuid-root bash exists on the host" if broke else f"mode {oct(st.st_mode)}, uid {st.st_uid}")


@case("sandbox", "network: connect to a host loopback listener")
def _(t):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(3.0)
        port = server.getsockname()[1]
        result = {}
        thread = threading.Thread(target=lambda: result.update(out=bash_output(
            t, f"(exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED) 2>&1", timeout_ms=5000)))
        thread.start()
        try:
            server.accept()[0].close()
            accepted = True
        except OSError:
            accepted = False
        thread.join()
    return (not accepted, "the sandbox reached a host loopback port" if accepted else "no connection reached the host")


@case("sandbox", "network: resolve and reach the internet")
def _(t):
    return sandbox_check(t, "(getent hosts example.com && echo RESOLVED); (exec 3<>/dev/tcp/1.1.1.1/53 && echo CONNECTED) 2>&1",
                         lambda out: "RESOLVED" in out or "CONNECTED" in out, "network reachable")


@case("sandbox", "read /etc/shadow")
def _(t):
    return sandbox_check(t, "cat /etc/shadow /etc/gshadow /proc/1/root/etc/shadow 2>&1",
                         lambda out: "root:" in out, "/etc/shadow was read")


@case("sandbox", "read ssh host keys")
def _(t):
    return sandbox_check(t, "cat /etc/ssh/ssh_host_*_key 2>&1", lambda out: "PRIVATE KEY" in out, "a host key was read")


@case("sandbox", "read a host file outside the workspace")
def _(t):
    return sandbox_check(t, f"cat {t.outside}/secret.txt 2>&1", lambda out: t.secret in out, "the outside secret was read")


@case("sandbox", "escape via a symlink made inside")
def _(t):
    return sandbox_check(t, f"ln -sfn {t.outside} esc-link && cat esc-link/secret.txt 2>&1; rm -f esc-link",
                         lambda out: t.secret in out, "the outside secret was read through a symlink")


@case("sandbox", "write the host's system folders")
def _(t):
    name = f"surecall-adv-{secrets.token_hex(4)}"
    bash_output(t, f"for d in /usr /etc /bin /var/tmp; do echo x > $d/{name}; done 2>&1")
    made = [d for d in ("/usr", "/etc", "/bin", "/var/tmp") if os.path.exists(f"{d}/{name}")]
    for d in made:
        os.unlink(f"{d}/{name}")
    return (not made, f"wrote {made}" if made else "no host folder written")


@case("sandbox", "signal a host process")
def _(t):
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        out, why = bash_output(t, f"kill -0 {sentinel.pid} 2>&1 && echo SEEN || echo HIDDEN")
        seen = out is not None and "SEEN" in out
        return (not seen, "a host process is visible and signalable" if seen else "host processes are out of reach")
    finally:
        sentinel.kill()
        sentinel.wait()


@case("sandbox", "fill /dev or /dev/shm past its bound")
def _(t):
    # /dev's tmpfs cannot be sized by bubblewrap: it must be read-only to the command; /dev/shm is sized
    out, why = bash_output(t, "touch /dev/surecall-x 2>/dev/null && echo DEVWRITE; "
                              "dd if=/dev/zero of=/dev/shm/fill bs=1M count=2048 2>/dev/null; "
                              "du -B1 -s /dev/shm 2>/dev/null | cut -f1", timeout_ms=60_000)
    if out is None:
        return True, why
    if "DEVWRITE" in out:
        return False, "the command wrote into /dev"
    filled = [int(s) for s in out.split() if s.isdigit()]
    big = [n for n in filled if n > 1 << 30]
    return (not big, f"/dev/shm took {big[0]} bytes" if big else f"/dev read-only, /dev/shm stopped at {filled} bytes")


@case("sandbox", "fork bomb")
def _(t):
    obs, _ = t.bash("true")
    enforcer = (obs.data.get("limits") or {}).get("max_processes_enforced_by", "") if obs else ""
    if "cgroup" not in enforcer and os.geteuid() == 0:
        raise Skip(f"the process count is bounded by '{enforcer}' only; unsafe on a shared host")
    before = _count_host_bash()
    started = time.monotonic()
    obs, exc = t.bash(":(){ :|:& };:", timeout_ms=2000)
    took = time.monotonic() - started
    if exc is not None:
        return raised(exc)
    time.sleep(0.5)
    extra = _count_host_bash() - before
    held = took < 20 and extra < 50
    return held, f"returned after {took:.1f} s; {extra} more bash processes on the host afterwards"


def _count_host_bash() -> int:
    return subprocess.run(["ps", "-e", "-o", "comm="], capture_output=True, text=True).stdout.split().count("bash")


# === file tools ===================================================================================
_TRAVERSALS = ["../outside/secret.txt", "sub/../../outside/secret.txt", "./../outside/secret.txt",
               "sub//..//..//outside/secret.txt", "ABS", "/proc/self/root/ABS"]
for _path in _TRAVERSALS:
    @case("file_tools", f"traversal: file_view {_path}")
    def _(t, _path=_path):
        path = _path.replace("ABS", str(t.outside / "secret.txt").lstrip("/") if _path.startswith("/proc") else str(t.outside / "secret.txt"))
        return no_secret(t, t.view(path))


@case("file_tools", "traversal: file_edit ../outside/secret.txt")
def _(t):
    obs, exc = t.edit("../outside/secret.txt", "EDITME", "PWNED")
    if exc is not None:
        return raised(exc)
    return (t.secret_intact(), "the outside file was edited" if not t.secret_intact() else f"unchanged ({obs.decision.code})")


@case("file_tools", "traversal: grep_search path ..")
def _(t):
    return no_secret(t, t.dispatch({"name": "grep_search", "arguments": {"pattern": "SURECALL-ADV", "path": ".."}}))


def _links(t: Target):
    file_link, dir_link = t.ws / "link-file", t.ws / "link-dir"
    for link, dest in ((file_link, t.outside / "secret.txt"), (dir_link, t.outside)):
        if not link.is_symlink():
            link.symlink_to(dest)
    return file_link, dir_link


@case("file_tools", "symlink: file_view a link to an outside file")
def _(t):
    _links(t)
    return no_secret(t, t.view("link-file"))


@case("file_tools", "symlink: file_view through a link to an outside folder")
def _(t):
    _links(t)
    return no_secret(t, t.view("link-dir/secret.txt"))


@case("file_tools", "symlink: file_edit a link to an outside file")
def _(t):
    _links(t)
    obs, exc = t.edit("link-file", "EDITME", "PWNED")
    if exc is not None:
        return raised(exc)
    return (t.secret_intact(), "the outside file was edited" if not t.secret_intact() else f"unchanged ({obs.decision.code})")


@case("file_tools", "symlink: grep_search walks into a linked outside folder")
def _(t):
    _links(t)
    return no_secret(t, t.dispatch({"name": "grep_search", "arguments": {"pattern": "SURECALL-ADV", "path": "."}}))


@case("file_tools", "symlink: a loop does not hang")
def _(t):
    loop = t.ws / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    started = time.monotonic()
    obs, exc = t.view("loop")
    took = time.monotonic() - started
    if exc is not None:
        return raised(exc)
    return took < 10, f"returned in {took:.2f} s ({obs.decision.code})"


@case("file_tools", "a FIFO in the workspace does not hang file_view")
def _(t):
    fifo = t.ws / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=t.view("fifo")), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the stuck open() by becoming its writer
        with contextlib.suppress(OSError), open(fifo, "w"):
            pass
        worker.join(5)
        return False, "file_view blocked on a FIFO for 10 s"
    obs, exc = result["r"]
    return (True, f"returned ({obs.decision.code}: {(obs.error or '')[:60]})") if exc is None else raised(exc)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False where the kernel/libc lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _swap_race(t: Target, attempt: Callable[[], bool], iterations: int) -> tuple[int, int, str]:
    """Flip ws/race between a real folder and a symlink to outside while `attempt()` runs."""
    race, spare = t.ws / "race", t.ws / ".race-spare"
    for p in (race, spare):
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
    race.mkdir()
    (race / "secret.txt").write_text("inside copy\nEDITME\n")
    spare.symlink_to(t.outside)
    if not _exchange(race, spare):
        return 0, 0, "renameat2(RENAME_EXCHANGE) unavailable"
    _exchange(race, spare)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            _exchange(race, spare)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    hits = 0
    try:
        for _ in range(iterations):
            hits += attempt()
    finally:
        stop.set()
        flipper.join()
    return hits, iterations, ""


@case("file_tools", "swap race: file_view reads outside")
def _(t):
    inside_reads = []

    def attempt():
        obs, exc = t.view("race/secret.txt")
        inside_reads.append(exc is None and "inside copy" in text_of(obs))
        return bool(exc is None and t.secret in text_of(obs))

    hits, n, why = _swap_race(t, attempt, 300 if t.quick else 3000)
    if why:
        raise Skip(why)
    if not any(inside_reads):  # every view failed: the race was never exercised, so nothing is shown
        return False, f"not exercised: no view of the inside copy succeeded in {n} tries"
    return hits == 0, f"outside secret returned {hits}/{n} times ({sum(inside_reads)} inside reads)"


@case("file_tools", "swap race: file_edit rewrites outside")
def _(t):
    successes = []

    def inside_text() -> str:  # the real folder is whichever of the two names is not the symlink
        for name in ("race", ".race-spare"):
            with contextlib.suppress(OSError):
                if not (t.ws / name).is_symlink():
                    return (t.ws / name / "secret.txt").read_text()
        return ""

    def attempt():  # toggle EDITME <-> EDITMX in the inside copy
        old, new = ("EDITME", "EDITMX") if "EDITME" in inside_text() else ("EDITMX", "EDITME")
        obs, exc = t.edit("race/secret.txt", old, new)
        successes.append(exc is None and obs.ok)
        return False

    before = (t.outside / "secret.txt").stat()
    hits, n, why = _swap_race(t, attempt, 200 if t.quick else 3000)
    if why:
        raise Skip(why)
    after = (t.outside / "secret.txt").stat()
    rewritten = (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns) or not t.secret_intact()
    if rewritten:
        return False, f"the outside file was rewritten ({sum(successes)}/{n} edits reported success)"
    if not any(successes):
        return False, f"not exercised: no edit of the inside copy succeeded in {n} tries"
    return True, f"outside file untouched over {n} edits ({sum(successes)} inside edits)"


@case("file_tools", "huge output: file_edit multiplies a 4 KiB file")
def _(t):
    path = t.ws / "small.txt"
    path.write_text("a" * (1024 if t.quick else 4096))
    obs, exc = t.edit("small.txt", "a", "b" * 32768, allow_multiple=True)
    if exc is not None:
        return raised(exc)
    size = path.stat().st_size
    path.unlink()
    return size <= 8 * 2**20, f"file is {size} bytes after one call ({obs.decision.code}; {(obs.error or '')[:60]})"


@case("file_tools", "huge output: bash prints 50 MB")
def _(t):
    obs, exc = t.bash("head -c 50000000 /dev/zero | tr '\\0' a")
    if exc is not None:
        return raised(exc)
    return len(obs.output) <= 256 * 1024, f"observation holds {len(obs.output)} characters"


@case("file_tools", "huge output: grep_search over 20k matching lines")
def _(t):
    (t.ws / "many.txt").write_text("match this line\n" * 20000)
    obs, exc = t.dispatch({"name": "grep_search", "arguments": {"pattern": "match", "path": "many.txt"}})
    if exc is not None:
        return raised(exc)
    return len(obs.output) <= 1 << 20, f"observation holds {len(obs.output)} characters"


@case("file_tools", "lost updates: concurrent file_edits on one file")
def _(t):
    n = 16 if t.quick else 160
    path = t.ws / "shared.txt"
    path.write_text("".join(f"slot-{i:04d}\n" for i in range(n)))
    reports = [None] * n

    def one(i):
        obs, exc = t.edit("shared.txt", f"slot-{i:04d}", f"done-{i:04d}")
        reports[i] = exc is None and obs.ok

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    text = path.read_text()
    lost = [i for i in range(n) if reports[i] and f"done-{i:04d}" not in text]
    succeeded = sum(bool(r) for r in reports)
    if succeeded < 2 and not lost:
        return False, f"not exercised: only {succeeded}/{n} edits succeeded"
    return not lost, f"{len(lost)}/{succeeded} edits reported success but are missing"


@case("file_tools", "ReDoS: grep_search (a+)+$ over 'aaaa...b'")
def _(t):
    from surecall.toolbox.search import SearchLimits

    budget_s = SearchLimits().time_budget_s
    (t.ws / "redos.txt").write_text("a" * 5000 + "b\n")
    started = time.monotonic()
    obs, exc = t.dispatch({"name": "grep_search", "arguments": {"pattern": "(a+)+$", "path": "redos.txt"}})
    took = time.monotonic() - started
    if exc is not None:
        return raised(exc)
    # held when the search keeps to twice its own time budget (slack for a loaded machine)
    return took < 2 * budget_s, f"returned in {took:.1f} s, budget {budget_s} s ({(obs.error or 'no error')[:60]})"


@case("file_tools", "regex bomb: grep_search ((a{100}){100}){100}")
def _(t):
    started = time.monotonic()
    obs, exc = t.dispatch({"name": "grep_search", "arguments": {"pattern": "((a{100}){100}){100}", "path": "file.txt"}})
    took = time.monotonic() - started
    if exc is not None:
        return raised(exc)
    return took < 15, f"returned in {took:.1f} s ({(obs.error or 'no error')[:60]})"


# === idempotency ==================================================================================
def start_redis(root: Path, durable: bool) -> tuple[subprocess.Popen, str]:
    """A private redis-server on a free port: (process, url); Skip where it is not installed."""
    server = shutil.which("redis-server")
    if server is None:
        raise Skip("redis-server not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = root / f"redis-{port}"
    workdir.mkdir()
    persistence = (["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"] if durable
                   else ["--appendonly", "no"])
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence,
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
            return proc, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    proc.kill()
    raise Skip("redis-server did not start")


def store_url(t: Target, kind: str, name: str) -> str:
    """Where a case's records live: its own SQLite file, or the run's (durable) redis-server."""
    if kind == "sqlite":
        return str(t.root / f"{name}.sqlite")
    if t.redis is None:
        t.redis = start_redis(t.root, durable=True)
    return t.redis[1]


def _append_file(t: Target, name: str) -> Path:
    path = t.ws / name
    path.write_text("X\n")
    return path


def _append_call(name: str) -> dict:
    """An edit that changes the file again on every run (new_str holds old_str): runs are countable."""
    return {"name": "file_edit", "arguments": {"path": name, "old_str": "X", "new_str": "XX"}}


def _runs(path: Path) -> int:
    return path.read_text().count("X") - 1


for _kind in ("sqlite", "redis"):
    @case("idempotency", f"{_kind}: replay: the same call twice")
    def _(t, _kind=_kind):
        path = _append_file(t, f"replay-{_kind}.txt")
        rt = t.new_runtime(store=store_url(t, _kind, "replay"))
        ids = {"trajectory_id": f"adv-replay-{_kind}", "turn": 1, "call_id": "c1"}
        for _ in range(2):
            _, exc = t.dispatch(_append_call(path.name), runtime=rt, **ids)
            if exc is not None:
                return raised(exc)
        return _runs(path) == 1, f"the edit ran {_runs(path)} time(s)"

    @case("idempotency", f"{_kind}: replay after a runtime restart")
    def _(t, _kind=_kind):
        path = _append_file(t, f"restart-{_kind}.txt")
        url = store_url(t, _kind, "restart")
        ids = {"trajectory_id": f"adv-restart-{_kind}", "turn": 1, "call_id": "c1"}
        for rt in (t.new_runtime(store=url), t.new_runtime(store=url)):
            _, exc = t.dispatch(_append_call(path.name), runtime=rt, **ids)
            if exc is not None:
                return raised(exc)
        return _runs(path) == 1, f"the edit ran {_runs(path)} time(s)"

    @case("idempotency", f"{_kind}: concurrent duplicates from 8 processes")
    def _(t, _kind=_kind):
        path = _append_file(t, f"dup-{_kind}.txt")
        url = store_url(t, _kind, "dup")
        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(8)
        procs = [ctx.Process(target=_duplicate_worker, args=(t, url, barrier, _append_call(path.name), _kind))
                 for _ in range(8)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(60)
        return _runs(path) == 1, f"the edit ran {_runs(path)} time(s) for 8 simultaneous duplicates"

    @case("idempotency", f"{_kind}: same call id, different arguments")
    def _(t, _kind=_kind):
        (t.ws / f"ka-{_kind}.txt").write_text("A\n")
        (t.ws / f"kb-{_kind}.txt").write_text("B\n")
        rt = t.new_runtime(store=store_url(t, _kind, "samekey"))
        ids = {"trajectory_id": f"adv-key-{_kind}", "turn": 3, "call_id": "c1"}
        first, exc = t.dispatch({"name": "file_edit", "arguments": {"path": f"ka-{_kind}.txt", "old_str": "A", "new_str": "A1"}},
                                runtime=rt, **ids)
        second, exc2 = t.dispatch({"name": "file_edit", "arguments": {"path": f"kb-{_kind}.txt", "old_str": "B", "new_str": "B1"}},
                                  runtime=rt, **ids)
        if exc or exc2:
            return raised(exc or exc2)
        confused = second.replayed and second.output == first.output
        return not confused, ("B got A's stored result" if confused else
                              f"B {'refused' if second.error else 'ran on its own'} ({(second.error or '')[:60]})")

    @case("idempotency", f"{_kind}: a worker stalled past its lease lets the call run twice")
    def _(t, _kind=_kind):
        runs = []

        def slow(**_):  # stalls (a GC pause, a slow disk) before its effect lands
            time.sleep(1.5)
            runs.append(1)
            return "done"

        def probe(_arguments):  # like file_edit's: is the effect there? Not yet, while the owner stalls
            return bool(runs)

        tool = Tool(name="slow_effect", description="", input_schema={"type": "object", "properties": {}},
                    level=SideEffect.A2, handler=slow, probe=probe)
        from surecall.dispatch.stores import open_store

        rt = Runtime([tool], open_store(store_url(t, _kind, "lease")), signing_key=t.key, lease_s=0.3)
        cap = rt.issue(["call:*"], [str(t.ws)])
        call, ids = {"name": "slow_effect", "arguments": {}}, {"trajectory_id": f"adv-lease-{_kind}", "turn": 0, "call_id": "c"}
        first = threading.Thread(target=lambda: rt.dispatch(call, cap, **ids))
        first.start()
        time.sleep(0.7)  # past the 0.3 s lease while the first run is still going
        try:
            rt.dispatch(call, cap, **ids)
        except Exception as exc:
            return raised(exc)
        finally:
            first.join()
        return len(runs) == 1, f"the effect ran {len(runs)} time(s)"

    @case("idempotency", f"{_kind}: keys not scoped: two workspaces share a store")
    def _(t, _kind=_kind):
        ws2 = t.root / f"ws2-{_kind}"
        ws2.mkdir(exist_ok=True)
        for ws in (t.ws, ws2):
            (ws / "scoped.txt").write_text("X\n")
        url = store_url(t, _kind, "scoped")
        rt1, rt2 = t.new_runtime(t.ws, store=url), t.new_runtime(ws2, store=url)
        ids = {"trajectory_id": f"adv-scope-{_kind}", "turn": 0, "call_id": "c1"}
        rt1.dispatch(_append_call("scoped.txt"), rt1.issue(FULL_RIGHTS, [str(t.ws)]), **ids)
        try:
            obs = rt2.dispatch(_append_call("scoped.txt"), rt2.issue(FULL_RIGHTS, [str(ws2)]), **ids)
        except Exception as exc:
            return raised(exc)
        edited = (ws2 / "scoped.txt").read_text() == "XX\n"
        return edited, ("the second workspace ran its own edit" if edited else
                        f"the second runtime got the first one's stored result (replayed={obs.replayed})")


def _duplicate_worker(t: Target, url: str, barrier, call: dict, kind: str):
    rt = t.new_runtime(store=url)
    cap = rt.issue(FULL_RIGHTS, [str(t.ws)])
    barrier.wait()
    rt.dispatch(call, cap, trajectory_id=f"adv-dup-{kind}", turn=2, call_id="same")


@case("idempotency", "sqlite: a corrupted store row on replay")
def _(t):
    import sqlite3

    url = store_url(t, "sqlite", "corrupt")
    rt = t.new_runtime(store=url)
    _append_file(t, "corrupt.txt")
    ids = {"trajectory_id": "adv-corrupt", "turn": 0, "call_id": "c1"}
    t.dispatch(_append_call("corrupt.txt"), runtime=rt, **ids)
    with sqlite3.connect(url) as conn:
        conn.execute("UPDATE surecall_records SET result = '{not json', state = 'COMPLETED'")
    obs, exc = t.dispatch(_append_call("corrupt.txt"), runtime=rt, **ids)
    return (True, f"an observation ({obs.idempotency_state}; {(obs.error or '')[:60]})") if exc is None else raised(exc)


@case("idempotency", "a reconciliation probe that raises")
def _(t):
    def fails(**_):
        raise RuntimeError("crashed mid-effect")

    def probe(_arguments):
        raise OSError("probe cannot reach the resource")

    tool = Tool(name="flaky", description="", input_schema={"type": "object", "properties": {}}, level=SideEffect.A2,
                handler=fails, probe=probe)
    rt = Runtime([tool], SQLiteStore(t.root / "probe.sqlite"), signing_key=t.key)
    cap = rt.issue(["call:*"], [str(t.ws)])
    call = {"name": "flaky", "arguments": {}}
    try:
        rt.dispatch(call, cap, trajectory_id="adv-probe", turn=0, call_id="c")
        obs = rt.dispatch(call, cap, trajectory_id="adv-probe", turn=0, call_id="c")
    except Exception as exc:
        return raised(exc)
    return True, f"an observation ({obs.idempotency_state})"


@case("idempotency", "ENAMETOOLONG recorded as IN_DOUBT though nothing ran")
def _(t):
    obs, exc = t.edit("n" * 300 + ".txt", "X", "Y")
    if exc is not None:
        return raised(exc)
    return obs.idempotency_state != "IN_DOUBT", f"state {obs.idempotency_state} ({(obs.error or '')[:60]})"


@case("idempotency", "redis: a server without durable persistence is accepted")
def _(t):
    from surecall.dispatch.stores import RedisStore

    proc, url = start_redis(t.root, durable=False)
    try:
        try:
            RedisStore(url).claim("adv-durability-probe", lease_s=1.0)
        except SurecallError as exc:
            return True, f"refused: {str(exc)[:80]}"
        return False, "a server with appendonly=no was accepted and used"
    finally:
        proc.terminate()
        proc.wait(10)


# === bad input ====================================================================================
_MALFORMED = {
    "None as the call": None, "a string as the call": "file_view", "a number as the call": 42,
    "name is not a string": {"name": None, "arguments": {}},
    "arguments is a string": {"name": "file_view", "arguments": "path=file.txt"},
    "arguments is a list": {"name": "file_view", "arguments": [1, 2]},
    "argument of the wrong type": {"name": "file_view", "arguments": {"path": 5, "offset": 1, "limit": 10}},
    "unknown extra argument": {"name": "file_view", "arguments": {"path": "file.txt", "offset": 1, "limit": 10, "x": 1}},
    "NaN argument": {"name": "bash_execute", "arguments": {"command": "true", "timeout_ms": float("nan")}},
    "integer beyond 2^53": {"name": "file_view", "arguments": {"path": "file.txt", "offset": 2**60, "limit": 10}},
    "lone surrogate in an argument": {"name": "file_view", "arguments": {"path": "\ud800.txt", "offset": 1, "limit": 10}},
    "2 MiB argument": {"name": "file_edit", "arguments": {"path": "file.txt", "old_str": "EDITME", "new_str": "x" * (2 << 20)}},
}
for _name, _call in _MALFORMED.items():
    @case("bad_input", f"dispatch: {_name}")
    def _(t, _call=_call):
        return denied(t.dispatch(_call))


def _nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@case("bad_input", "dispatch: arguments nested 100k deep")
def _(t):
    return denied(t.dispatch({"name": "file_view", "arguments": {"path": _nested(100_000), "offset": 1, "limit": 1}}))


@case("bad_input", "dispatch: NaN turn")
def _(t):
    obs, exc = t.dispatch({"name": "file_edit", "arguments": {"path": "file.txt", "old_str": "EDITME", "new_str": "EDITME"}},
                          turn=float("nan"))
    return raised(exc) if exc is not None else (True, f"an observation ({obs.decision.code}, {obs.idempotency_state})")


@case("bad_input", "dispatch: lone surrogate in the call id")
def _(t):
    obs, exc = t.dispatch({"name": "file_edit", "arguments": {"path": "file.txt", "old_str": "EDITME", "new_str": "EDITME"}},
                          call_id="\udc00")
    return raised(exc) if exc is not None else (True, f"an observation ({obs.decision.code}, {obs.idempotency_state})")


def _check(text: str) -> tuple[bool, str]:
    """Held when check_call rejects `text` (returns an error) without raising."""
    from surecall.tools.calls import check_call
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    try:
        result = check_call(text, "json", seed_tools())
    except RecursionError:
        return False, "check_call raised RecursionError"
    except Exception as exc:
        return False, f"check_call raised {type(exc).__name__}: {str(exc)[:80]}"
    return (result.error is not None, f"rejected ({result.error_kind})" if result.error else
            f"accepted as {result.call.name}({json.dumps(result.call.arguments)[:80]})")


@case("bad_input", "check_call: 100k nested [")
def _(t):
    return _check('{"name": "file_view", "arguments": {"path": ' + "[" * 100_000 + "]" * 100_000 + "}}")


@case("bad_input", "check_call: duplicate \"name\" key")
def _(t):
    return _check('{"name": "file_view", "name": "bash_execute", "arguments": {"command": "id", "timeout_ms": 1000}}')


@case("bad_input", "check_call: duplicate argument key")
def _(t):
    return _check('{"name": "file_view", "arguments": {"path": "file.txt", "path": "../outside/secret.txt", "offset": 1, "limit": 10}}')


@case("bad_input", "check_call: NaN literal")
def _(t):
    return _check('{"name": "bash_execute", "arguments": {"command": "true", "timeout_ms": NaN}}')


def _cli(argv: list[str], timeout_s: float = 60, env_extra: dict | None = None, stdin_close: bool = False) -> tuple[bool, str]:
    """Held when `surecall ARGV` exits 2 with exactly one stderr line and no traceback, in time."""
    env = {**os.environ, **(env_extra or {})}
    try:
        proc = subprocess.run([sys.executable, "-m", "surecall", *argv], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return False, f"did not finish in {timeout_s:.0f} s (hangs)"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if "Traceback" in proc.stderr:
        return False, f"traceback (exit {proc.returncode}): {lines[-1][:100] if lines else ''}"
    if proc.returncode != 2 or len(lines) != 1:
        return False, f"exit {proc.returncode}, {len(lines)} stderr line(s): {(lines[0] if lines else '')[:100]}"
    return True, lines[0][:120]


def _cli_files(t: Target) -> dict[str, Path]:
    files = {"deep": t.root / "deep.json", "empty": t.root / "empty.json", "fifo": t.root / "cli-fifo",
             "schema": t.root / "schema.json"}
    if not files["deep"].exists():
        files["deep"].write_text("[" * 200_000 + "]" * 200_000)
        files["empty"].write_text("")
        os.mkfifo(files["fifo"])
        files["schema"].write_text('{"type": "object", "properties": {"a": {"type": "boolean"}}}')
    return files


_CLI_CASES = {
    "compile --format xml": ["compile", "SCHEMA", "--tokenizer", "shared:gpt2", "--format", "xml"],
    "sample --n -3": ["sample", "SCHEMA", "--tokenizer", "shared:gpt2", "--n", "-3"],
    "sample --seed -5": ["sample", "SCHEMA", "--tokenizer", "shared:gpt2", "--seed", "-5"],
    "breakeven --prompts missing.jsonl": ["breakeven", "--prompts", "missing-adv.jsonl"],
    "breakeven --device tpu": ["breakeven", "--device", "tpu"],
    "breakeven --batch 0": ["breakeven", "--batch", "0"],
    "breakeven --temperature -1": ["breakeven", "--temperature", "-1"],
    "run --out /proc/nope": ["run", "--out", "/proc/nope"],
    "catalog-cost --turns -1": ["catalog-cost", "--tokenizer", "shared:gpt2", "--tools", "seed", "--turns", "-1"],
    "lint a 200k-deep file": ["lint", "DEEP"],
    "compile a 200k-deep file": ["compile", "DEEP", "--tokenizer", "shared:gpt2"],
    "sample a 200k-deep file": ["sample", "DEEP", "--tokenizer", "shared:gpt2"],
    "lint /dev/zero": ["lint", "/dev/zero"],
    "lint a FIFO": ["lint", "FIFO"],
    "lint an empty file": ["lint", "EMPTY"],
}
for _name, _argv in _CLI_CASES.items():
    @case("bad_input", f"cli: {_name}")
    def _(t, _argv=_argv):
        files = _cli_files(t)
        argv = [str(files[a.lower()]) if a in ("SCHEMA", "DEEP", "FIFO", "EMPTY") else a for a in _argv]
        return _cli(argv, timeout_s=20 if "FIFO" in _argv else 60)


@case("bad_input", "cli: breakeven --device cuda without a GPU")
def _(t):
    try:
        import torch

        if torch.cuda.is_available():
            raise Skip("a CUDA device is visible")
    except ImportError:
        pass
    return _cli(["breakeven", "--device", "cuda"])


@case("bad_input", "cli: vocab --json | head -c1 (broken pipe)")
def _(t):
    from surecall.models import default_model_dir

    proc = subprocess.Popen([sys.executable, "-m", "surecall", "vocab", str(default_model_dir()), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write, as when `head` has exited
    err = proc.stderr.read().decode(errors="replace")
    status = proc.wait(60)
    if "Traceback" in err or "Exception ignored" in err:
        return False, f"traceback on a closed pipe (exit {status})"
    return True, f"quiet exit {status}"


# === the run ======================================================================================
def run_cases(t: Target, families: set[str], verbose: bool) -> list[dict]:
    outcomes = []
    for family, name, fn in CASES:
        if family not in families:
            continue
        started = time.monotonic()
        try:
            held, detail = fn(t)
        except Skip as why:
            held, detail = None, f"skipped: {why}"
        except Exception as exc:  # the harness could not make its check: never counted as held
            held, detail = False, f"harness error {type(exc).__name__}: {str(exc)[:160]}"
        row = {"family": family, "case": name, "held": held, "detail": detail, "seconds": round(time.monotonic() - started, 3)}
        outcomes.append(row)
        if verbose:
            mark = "skip" if held is None else ("held" if held else "BROKE")
            print(f"  [{mark:5}] {family}: {name}: {detail}", flush=True)
    return outcomes


def summarise(outcomes: list[dict]) -> dict:
    summary = {}
    for family in FAMILIES:
        rows = [o for o in outcomes if o["family"] == family]
        tried = [o for o in rows if o["held"] is not None]
        if rows:
            summary[family] = {"tried": len(tried), "held": sum(bool(o["held"]) for o in tried),
                               "skipped": len(rows) - len(tried)}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer race iterations and smaller payloads (< 60 s)")
    parser.add_argument("--family", action="append", choices=FAMILIES, help="run only this family (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="print every case as it runs")
    args = parser.parse_args(argv)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="surecall-adversarial-"))
    target = None
    try:
        target = Target(root=root, quick=args.quick)
        outcomes = run_cases(target, set(args.family or FAMILIES), args.verbose)
    finally:
        if target is not None:
            target.close()
        shutil.rmtree(root, ignore_errors=True)
    summary = summarise(outcomes)
    for family, s in summary.items():
        skipped = f" ({s['skipped']} skipped)" if s["skipped"] else ""
        print(f"{family}: tried {s['tried']}, held {s['held']}{skipped}")
    broken = [o for o in outcomes if o["held"] is False]
    if broken:
        print(f"\n{len(broken)} attack(s) not held:")
        for o in broken:
            print(f"  {o['family']}: {o['case']}: {o['detail']}")
    for o in outcomes:
        if o["held"] is None:
            print(f"  skipped {o['family']}: {o['case']}: {o['detail']}")
    total_tried = sum(s["tried"] for s in summary.values())
    total_held = sum(s["held"] for s in summary.values())
    print(json.dumps({"benchmark": "adversarial", "quick": args.quick, "uid": os.geteuid(), "tried": total_tried,
                      "held": total_held, "families": summary, "broken": [f"{o['family']}: {o['case']}" for o in broken],
                      "seconds": round(time.monotonic() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
