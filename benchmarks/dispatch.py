"""Per-call overhead of the dispatch core: validate + approve + derive key + claim + complete.

Runs an A2 `file_edit`-shaped call through the four steps with the SQLiteStore and with a
RedisStore (a private `redis-server` started on a free port; skipped if the binary is absent),
in one process and in 8 concurrent processes. Before timing, it checks correctness: each
unique call executes exactly once, and when all processes send the same calls at once every
call is executed exactly once overall (no lost, no duplicated execution). Also times each step
alone, with the pure-Python `jsonschema` validator as the peer of jsonschema-rs.
Usage: python benchmarks/dispatch.py [--calls 2000] [--procs 8] [--repeats 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from surecall.dispatch.capability import Authority
from surecall.dispatch.idempotency import RecordState, derive_key, hold_lease
from surecall.dispatch.stores import open_store
from surecall.dispatch.validate import validate_arguments
from surecall.tools import SideEffect, Tool
from surecall.tools.catalog import hardened_seed_tools as seed_tools

KEY = b"benchmark-signing-key-32-bytes!!"
CTX = multiprocessing.get_context("fork")


def make_tool() -> Tool:
    spec = next(t for t in seed_tools() if t["name"] == "file_edit")
    return Tool.from_schema(spec["name"], spec["parameters"], spec["description"], level=SideEffect.A2)


def call_args(workspace: str, i: int) -> dict:
    return {"path": f"{workspace}/src/module_{i % 50}.py", "old_str": f"value = {i}", "new_str": f"value = {i + 1}"}


def one_call(tool, auth, cap, store, workspace: str, traj: str, i: int) -> tuple[float, bool]:
    """(seconds, executed) for one call through the four steps; the tool itself is a no-op."""
    args = call_args(workspace, i)
    t0 = time.perf_counter()
    validate_arguments(tool, args)
    auth.approve(cap, "write", args["path"]).raise_if_denied()
    key = derive_key(traj, i, f"call-{i}", tool.name, args)
    claim = store.claim(key, lease_s=30.0)
    if claim.acquired:
        store.complete(key, claim.owner, {"ok": True, "replaced": 1}, token=claim.token)
    return time.perf_counter() - t0, claim.acquired


def worker(url: str, workspace: str, traj: str, start: int, count: int, warmup: int, barrier, out) -> None:
    tool, auth = make_tool(), Authority(KEY)
    cap = auth.issue({"write", "call:file_edit"}, [workspace], ttl_s=3600)
    store = open_store(url)
    for i in range(warmup):
        one_call(tool, auth, cap, store, workspace, traj + "-warm", start + i)
    barrier.wait()
    lat, executed = [], []
    for i in range(start, start + count):
        dt, ran = one_call(tool, auth, cap, store, workspace, traj, i)
        lat.append(dt)
        if ran:
            executed.append(i)
    store.close()
    out.put((lat, executed))


def run_config(url: str, workspace: str, procs: int, count: int, shared: bool, tag: str) -> dict:
    """`procs` workers; unique calls per worker, or (shared) every worker sends the same calls."""
    barrier, out = CTX.Barrier(procs), CTX.Queue()
    traj = f"{tag}-{time.time_ns()}"
    ps = [CTX.Process(target=worker, args=(url, workspace, traj, 0 if shared else p * count, count, 50, barrier, out))
          for p in range(procs)]
    for p in ps:
        p.start()
    results = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    lat = sorted(x for r, _ in results for x in r)
    executed = [i for _, e in results for i in e]
    expected = count if shared else procs * count
    store = open_store(url)
    tool = make_tool()
    states = {store.get(derive_key(traj, i, f"call-{i}", tool.name, call_args(workspace, i))).state
              for i in range(expected if not shared else count)}
    store.close()
    return {
        "calls": len(lat), "executions": len(executed), "unique_calls": expected,
        "duplicated": len(executed) - len(set(executed)), "lost": expected - len(set(executed)),
        "all_completed": states == {RecordState.COMPLETED},
        "p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
    }


def step_breakdown(workspace: str, url: str, n: int) -> dict:
    """Median microseconds of each step alone, plus the pure-Python jsonschema peer."""
    tool, auth = make_tool(), Authority(KEY)
    cap = auth.issue({"write", "call:file_edit"}, [workspace], ttl_s=3600)
    store = open_store(url)
    args = [call_args(workspace, i) for i in range(n)]
    keys = [derive_key(f"steps-{time.time_ns()}", i, "c", tool.name, a) for i, a in enumerate(args)]
    held = {}

    def hold(i: int) -> None:  # what Runtime adds around a run: a lease check and a heartbeat
        with hold_lease(store, keys[i], held[i], lease_s=30.0):
            pass

    steps = {
        "validate (jsonschema-rs)": lambda i: validate_arguments(tool, args[i]),
        "approve (HMAC + realpath)": lambda i: auth.approve(cap, "write", args[i]["path"]),
        "derive_key (RFC 8785 + SHA-256)": lambda i: derive_key("t", i, "c", tool.name, args[i]),
        "claim": lambda i: held.__setitem__(i, store.claim(keys[i])),
        "hold_lease (heartbeat registration)": hold,
        "complete": lambda i: store.complete(keys[i], held[i].owner, {"ok": True}, token=held[i].token),
    }
    try:
        import jsonschema

        peer = jsonschema.Draft202012Validator(tool.input_schema)
        steps["peer: validate (python jsonschema)"] = lambda i: peer.validate(args[i])
    except ImportError:
        pass
    out = {}
    for name, fn in steps.items():
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - t0)
        out[name] = sorted(times)[n // 2] * 1e6
    store.close()
    return out


def start_redis(workdir: str) -> tuple[subprocess.Popen | None, str | None]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # durable, as RedisStore requires by default (AOF, fsync every second, no eviction)
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
                             "--appendfsync", "everysec", "--maxmemory-policy", "noeviction", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    return None, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per process (single process)")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per timed configuration (best p50 kept)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="surecall-bench-")
    workspace = os.path.join(tmp, "work")
    os.makedirs(os.path.join(workspace, "src"))
    redis_proc, redis_url = start_redis(tmp)
    stores = {"sqlite": os.path.join(tmp, "records.db")}
    if redis_url:
        stores["redis"] = redis_url
    rows, steps = [], {}
    try:
        for name, url in stores.items():
            steps[name] = step_breakdown(workspace, url, 1000)
            # correctness first: all processes send the same calls at once
            check = run_config(url, workspace, args.procs, 200, shared=True, tag=f"{name}-shared")
            rows.append({"store": name, "procs": args.procs, "mode": "same calls from every process", **check})
            for procs, count in ((1, args.calls), (args.procs, max(1, args.calls // args.procs))):
                # the machine is shared: keep the round with the lowest p50, list every round's p50
                rounds = [run_config(url, workspace, procs, count, shared=False, tag=f"{name}-{procs}-{r}")
                          for r in range(args.repeats)]
                best = min(rounds, key=lambda r: r["p50_us"])
                best["round_p50s_us"] = [round(r["p50_us"], 1) for r in rounds]
                best["duplicated"] = sum(r["duplicated"] for r in rounds)
                best["lost"] = sum(r["lost"] for r in rounds)
                best["all_completed"] = all(r["all_completed"] for r in rounds)
                rows.append({"store": name, "procs": procs, "mode": "unique calls", **best})
    finally:
        if redis_proc:
            redis_proc.terminate()
            redis_proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    ok = all(r["duplicated"] == 0 and r["lost"] == 0 and r["all_completed"] for r in rows)
    report(rows, steps, ok, args)
    return 0 if ok else 1


def report(rows: list[dict], steps: dict, ok: bool, args) -> None:
    base = next(r["p50_us"] for r in rows if r["store"] == "sqlite" and r["procs"] == 1 and r["mode"] == "unique calls")
    lines = ["| store | processes | calls | p50 us | p99 us | p50 vs SQLite 1 proc | p50 of each round | executions | duplicated | lost |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        label = r["mode"] if r["mode"] != "unique calls" else ""
        lines.append(f"| {r['store']} | {r['procs']} {label} | {r['calls']} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | "
                     f"{r['p50_us'] / base:.2f}x | {', '.join(f'{x:.0f}' for x in r.get('round_p50s_us', [])) or '-'} | "
                     f"{r['executions']} | {r['duplicated']} | {r['lost']} |")
    step_lines = ["| step | " + " | ".join(f"{s} us (p50)" for s in steps) + " |", "| --- |" + " --- |" * len(steps)]
    for step in next(iter(steps.values())):
        step_lines.append(f"| {step} | " + " | ".join(f"{steps[s][step]:.1f}" for s in steps) + " |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = f"{platform.machine()} {os.cpu_count()} CPUs (load average {load}), {platform.platform()}, Python {platform.python_version()}"
    command = "python " + " ".join(sys.argv)
    text = "\n".join([
        "# Dispatch core: per-call overhead (validate + approve + derive key + claim + complete)", "",
        f"Command: `{command}`  ", f"Machine: {machine}  ", f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        *lines, "", "Per step, one process (the store's column is its claim/complete):", "", *step_lines, "",
        f"Correctness: {'every call executed exactly once, none lost' if ok else 'FAILED: lost or duplicated executions'}.",
        "Timed rows: the best of the rounds by p50 (executions are that round's; duplicated/lost summed over all rounds).",
        "p99 on this shared 2-core machine is dominated by other tenants' processes (see the load average).",
        "Goal: p50 < 200 us with SQLite, one process.",
    ])
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dispatch.md"), "w") as fh:
        fh.write(text + "\n")
    summary = {"bench": "dispatch", "ok": ok, "machine": machine, "command": command, "rows": rows, "steps_us": steps}
    with open(os.path.join(args.out, "dispatch.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    sqlite1 = next(r for r in rows if r["store"] == "sqlite" and r["procs"] == 1 and r["mode"] == "unique calls")
    print(json.dumps({"bench": "dispatch", "ok": ok, "sqlite_p50_us": round(sqlite1["p50_us"], 1),
                      "sqlite_p99_us": round(sqlite1["p99_us"], 1), "goal_p50_us": 200,
                      "rows": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}))


if __name__ == "__main__":
    sys.exit(main())
