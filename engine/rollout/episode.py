"""One episode's turn loop: generate from the previous ids, dispatch each call, render the results.

`Episode.run` alternates `_next_turn` (a turn a killed run had sampled but not dispatched, after
its previous owner's lease has passed; or a fresh generation from `Trajectory.token_ids`) and
`_observe` (every call through `Runtime.dispatch` in a daemon thread under (trajectory, turn,
call id), bounded by the rollout's tool timeout; the results rendered as the next segment; the
checkpoint appended). It returns why the episode ended. It does not copy workspaces, issue
capabilities or run the reward (`surecall.rollout.runner`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import threading
import time
from typing import TYPE_CHECKING

from surecall.config import SamplingParams
from surecall.dispatch.capability import Capability
from surecall.dispatch.idempotency import RecordState, derive_key
from surecall.dispatch.runtime import Observation, Runtime, Verdict
from surecall.errors import RequestError
from surecall.rollout.render import SegmentRenderer, call_message, result_message
from surecall.rollout.task import Task
from surecall.rollout.trajectory import Checkpoint, Trajectory, Turn

if TYPE_CHECKING:
    from surecall.rollout.runner import RolloutRunner


class Episode:
    """The turn loop of one trajectory."""

    def __init__(self, runner: RolloutRunner, task: Task, trajectory: Trajectory, checkpoint: Checkpoint,
                 renderer: SegmentRenderer, runtime: Runtime, capability: Capability, tools: list):
        self.r, self.task, self.traj, self.ckpt = runner, task, trajectory, checkpoint
        self.renderer, self.runtime, self.capability, self.tools = renderer, runtime, capability, tools
        self.history = _history(task.messages, trajectory.turns)

    async def run(self) -> str:
        """Turns until the episode ends; returns why it ended."""
        while True:
            turn = await self._next_turn()  # 1. a resumed, undispatched turn, or a fresh one
            if isinstance(turn, str):
                return turn
            fits = await self._observe(turn)  # 2. dispatch, render, checkpoint
            if not fits or self.traj.num_response_tokens >= self.task.max_tokens:
                return "budget"

    async def _next_turn(self) -> Turn | str:
        task, traj = self.task, self.traj
        last = traj.turns[-1] if traj.turns else None
        if last is not None and last.outcome != "call":
            return last.outcome  # resumed after a final turn
        if last is not None and "observation_dropped" in last.timings:
            return "budget"  # resumed after results that did not fit
        if last is not None and not last.is_dispatched:  # sampled before a crash: its calls may have run
            await self._await_previous_owner(last)
            return last
        if len(traj.turns) >= task.max_turns:
            return "max_turns"
        max_new = min(task.max_tokens_per_turn, task.max_tokens - traj.num_response_tokens)
        turn = await self._generate(max_new) if max_new >= 1 else None
        if turn is None:
            return "budget"  # what is left is below the shortest call this turn allows
        traj.turns.append(turn)
        self.ckpt.turn(turn)  # what was sampled, before any effect
        return turn if turn.outcome == "call" else turn.outcome

    # --- generate ---------------------------------------------------------------------------
    async def _generate(self, max_new: int) -> Turn | None:
        traj, index = self.traj, len(self.traj.turns)
        ids = traj.token_ids
        tools, choice = self._decode_tools(index)
        params = SamplingParams(temperature=self.r.config.temperature, max_tokens=max_new, seed=self._seed(index),
                                logprobs=True, unmasked_logprobs=True)
        started = time.perf_counter()
        last = None
        request_id = f"{traj.id}/t{index}/{secrets.token_hex(4)}"
        mode = {"tool_choice": choice} if tools else {"constrained": False}
        try:
            async for out in self.r.engine.generate(ids, params, request_id=request_id, tools=tools, **mode):
                last = out
        except RequestError as exc:
            if "shortest call" in str(exc):
                return None
            raise
        if last.finish_reason == "error" and last.error_kind == "decode":  # the engine failed, not the model
            raise RuntimeError(f"the engine failed at turn {index}: {last.error}")
        calls, outcome = self._calls(index, last)
        return Turn(index=index, prompt_len=len(ids), sampled_ids=list(last.token_ids), logprobs=list(last.logprobs or []),
                    unmasked_logprobs=list(last.unmasked_logprobs or []), text=last.text,
                    finish_reason=last.finish_reason, calls=calls, outcome=outcome,
                    num_cached_tokens=last.num_cached_tokens,
                    timings={"generate_s": time.perf_counter() - started, "ttft_s": last.metrics.get("ttft_s")})

    def _decode_tools(self, index: int) -> tuple[list | None, str | None]:
        """This turn's tools and the output mode (`surecall.modes`) they are decoded under."""
        task = self.task
        if task.tool_choice == "none":
            return None, None
        if task.turn_tools is not None and index < len(task.turn_tools):
            return task.turn_tools[index], "required"  # a scripted turn: its one call, exactly
        if task.forced_tool:
            return [t for t in self.tools if t.name == task.forced_tool], "required"
        return self.tools, "auto" if task.tool_choice == "auto" else "required"

    def _seed(self, index: int) -> int:
        text = json.dumps([self.r.config.seed, self.task.seed, self.traj.id, index])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")

    def _calls(self, index: int, out) -> tuple[list[dict], str]:
        """The turn's calls (every parallel call of the mode's output) and how the turn ended."""
        found = [c for c in (out.tool_calls or []) if c.parsed is not None]
        if out.mode is None and out.call is not None:  # free decoding (tool_choice "none" never gets here)
            found = [out.call]
        if out.ok and found:
            return [{"id": f"call_{index}_{k}", "name": c.name, "arguments": _arguments(c)}
                    for k, c in enumerate(found)], "call"
        if out.finish_reason == "length":
            return [], "budget"
        return [], "invalid_call" if out.error_kind else "answer"  # text without a call: the model answered

    async def _await_previous_owner(self, turn: Turn) -> None:
        """Before re-dispatching a turn a killed run had sampled, wait until no owner may still run
        its calls (the lease and the takeover margin passed); the claim then settles IN_DOUBT ones."""
        deadline = time.monotonic() + self.r.config.in_flight_wait_s
        for call in turn.calls:
            try:
                key = derive_key(self.traj.id, turn.index, call["id"], call["name"], call["arguments"],
                                 namespace=self.runtime.namespace)
            except Exception:  # noqa: BLE001 - dispatch reports a bad call itself
                continue
            while time.monotonic() < deadline:
                record = await asyncio.to_thread(self.r.store.get, key)
                if not (record.state is RecordState.IN_FLIGHT or record.owner_may_be_alive):
                    break
                await asyncio.sleep(min(0.5, self.r.config.lease_s / 4))

    # --- observe ------------------------------------------------------------------------------
    async def _observe(self, turn: Turn) -> bool:
        """Dispatch the turn's calls and append the rendered results; False when they do not fit the budget."""
        started = time.perf_counter()
        observations = [await self._dispatch(turn, call) for call in turn.calls]
        dispatched = time.perf_counter()
        assistant = call_message(turn.calls)
        results = [result_message(c, o.to_message()) for c, o in zip(turn.calls, observations, strict=True)]
        ended_with_stop = bool(turn.sampled_ids) and turn.sampled_ids[-1] in self.r.stop_ids
        ids = self.renderer.observation_ids(self.history, assistant, results, ended_with_stop)
        self.history += [assistant, *results]
        room = self.task.max_tokens - self.traj.num_response_tokens
        turn.observations = [{**o.to_dict(), "message": m["content"]} for o, m in zip(observations, results, strict=True)]
        turn.observation_ids = ids if len(ids) <= room else []  # an observation past the budget ends the episode
        if len(ids) > room:
            turn.timings["observation_dropped"] = len(ids)
        turn.timings.update(dispatch_s=dispatched - started, render_s=time.perf_counter() - dispatched)
        self.ckpt.observations(turn)
        return len(ids) <= room

    async def _dispatch(self, turn: Turn, call: dict) -> Observation:
        cfg = self.r.config
        deadline = time.monotonic() + cfg.in_flight_wait_s
        request = {"name": call["name"], "arguments": call["arguments"]}
        while True:
            future = _in_thread(self.runtime.dispatch, request, self.capability, self.traj.id, turn.index, call["id"])
            try:
                obs = await asyncio.wait_for(future, timeout=cfg.tool_timeout_s)
            except asyncio.TimeoutError:
                return _timed_out(call["name"], cfg.tool_timeout_s)
            # another owner (a killed run's lease) still holds the call: wait it out, then settle
            if obs.idempotency_state == "IN_FLIGHT" and obs.error and time.monotonic() < deadline:
                await asyncio.sleep(min(1.0, cfg.lease_s / 4))
                continue
            return obs


def _history(messages: list[dict], turns: list[Turn]) -> list[dict]:
    """The conversation so far as messages (what the template needs to render the next segment)."""
    history = list(messages)
    for turn in turns:
        if turn.is_dispatched:
            history.append(call_message(turn.calls))
            history += [result_message(c, o["message"]) for c, o in zip(turn.calls, turn.observations, strict=True)]
    return history


def _in_thread(fn, *args) -> asyncio.Future:
    """Run `fn` in a daemon thread (a hung tool never blocks the loop, the batch or exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def deliver(value, error) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the loop is gone (the run ended while a hung tool ran on)
            pass

    threading.Thread(target=work, name="surecall-dispatch", daemon=True).start()
    return future


def _timed_out(name: str, timeout_s: float) -> Observation:
    error = (f"timed out after {timeout_s:g} s: the rollout stopped waiting; the call may still finish in the "
             "background and record its result")
    return Observation(tool=name, decision=Verdict(True, "allowed; timed out"), error=error, idempotency_state="UNRECORDED")


def _arguments(call) -> dict:
    """A mode call's parsed arguments (`ModeCall.parsed`), or a free call's (`ToolCall.arguments`)."""
    parsed = getattr(call, "parsed", None)
    return parsed if parsed is not None else call.arguments
