"""Failpoints: a test seam for the crash harness. With `CAIRN_FAILPOINT=NAME` and `CAIRN_FAILPOINT_MARKER=FILE` set,
the process stops at NAME: it writes one JSON line (`{"failpoint", "session", "pid"}`) to FILE and then hangs, so a test
can SIGKILL it at exactly that point. Installed as ordinary hook wrappers *inside* the checkpoint policy's, so a
failpoint sits after the barrier at the same point. Without the variables nothing is installed.

**Failpoints stop; they never flush** (GUIDE §7). What is durable when one stops is what the product itself made
durable by then — a failpoint that flushed would hide a missing barrier from every crash test that stops there. The
last column says what that is; an event marked *write-behind* reaches the OS within the coordinator's window (SPEC §1)
and is durable only at the next barrier, so a test that needs it written waits for it (on the stored log), not for
the marker alone.

| NAME              | where it stops                              | durable then, by the product itself          |
|-------------------|---------------------------------------------|----------------------------------------------|
| prompt-accepted   | after the first pre-step barrier of a turn  | the prompt (pre-step)                        |
| approval          | while a call waits for approval (headless   | through `request/header` (pre-request); the  |
|                   | approver)                                   | answer and `approval/asked` are write-behind |
| after-tool-result | after the first top-level tool result was   | through its `tool/call` (pre-tool); the      |
|                   | appended, before step/end                   | result is write-behind                       |
| turn-ended        | after the turn-end barrier                  | the whole turn (turn-end)                    |
| tool-body-start   | after the first top-level call's pre-tool   | its `tool/call` (pre-tool)                   |
|                   | barrier, before its body runs               |                                              |
| tool-body-done    | after the first top-level call's body       | its `tool/call` (pre-tool)                   |
|                   | returned, before its result is appended     |                                              |
| rewind-planned    | after a rewind's plan, before its first     | the plan (the barrier before any file)       |
|                   | file is touched                             |                                              |
| rewind-restored   | after a rewind restored its first file and  | the plan and that `rewind/file` (the         |
|                   | recorded it                                 | barrier after each restored path)            |
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import anyio

from cairn.persistence.session import LiveSession

from .approval import ApprovalRequest, Approver
from .hooks import Hooks

NAMES = ("prompt-accepted", "approval", "after-tool-result", "turn-ended", "tool-body-start", "tool-body-done",
         "rewind-planned", "rewind-restored")


class Failpoint:
    def __init__(self, name: str, marker: str, session: LiveSession) -> None:
        if name not in NAMES:
            raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(NAMES)}")
        self.name, self.marker, self.session = name, marker, session

    async def stop_here(self) -> None:
        line = json.dumps({"failpoint": self.name, "session": self.session.id, "pid": os.getpid()}) + "\n"
        with open(self.marker, "a") as f:
            f.write(line)
            f.flush()
        await anyio.sleep_forever()

    def install(self, hooks: Hooks) -> None:
        async def prompt_accepted(ctx: Any, call_next: Callable[[], Any]) -> Any:
            if ctx.step == 1:
                await self.stop_here()
            return await call_next()

        async def after_tool(ctx: Any, call_next: Callable[[], Any]) -> Any:
            await self.stop_here()  # the result is appended; write-behind hands it to the OS, nothing here forces it

        async def turn_ended(ctx: Any, call_next: Callable[[], Any]) -> Any:
            await self.stop_here()

        if self.name == "prompt-accepted":
            hooks.add("before_step", prompt_accepted)
        elif self.name == "after-tool-result":
            hooks.add("after_tool", after_tool)
        elif self.name == "turn-ended":
            hooks.add("after_turn", turn_ended)
        elif self.name in ("tool-body-start", "tool-body-done"):
            hooks.add("around_tool", self._around_tool)

    async def _around_tool(self, ctx: Any, call_next: Callable[[], Any]) -> Any:
        if ctx.parent_call_id is not None:
            return await call_next()
        if self.name == "tool-body-start":
            await self.stop_here()
        outcome = await call_next()
        await self.stop_here()  # tool-body-done: the body's effect is real, its result is not in the log
        return outcome

    def wrap_approver(self, approver: Approver) -> Approver:
        if self.name != "approval":
            return approver

        async def waiting(request: ApprovalRequest) -> Any:
            await self.stop_here()  # approval/asked is appended (write-behind), as a live dialog would have it

        return waiting


def from_env(session: LiveSession, env: Mapping[str, str] | None = None) -> Failpoint | None:
    env = os.environ if env is None else env
    name, marker = env.get("CAIRN_FAILPOINT"), env.get("CAIRN_FAILPOINT_MARKER")
    if not name or not marker:
        return None
    return Failpoint(name, marker, session)


async def rewind_point(name: str, session: LiveSession, env: Mapping[str, str] | None = None) -> None:
    """Stop at a rewind's failpoint `name` when CAIRN_FAILPOINT names it (the engine calls this; nothing otherwise).
    Nothing is flushed here: the engine's own barriers made the plan (and each restored path's record) durable."""
    env = os.environ if env is None else env
    if env.get("CAIRN_FAILPOINT") == name and env.get("CAIRN_FAILPOINT_MARKER"):
        await Failpoint(name, env["CAIRN_FAILPOINT_MARKER"], session).stop_here()
