"""Failpoints: a test seam for the crash harness. With `CAIRN_FAILPOINT=NAME` and `CAIRN_FAILPOINT_MARKER=FILE` set,
the process stops at NAME: it writes one JSON line (`{"failpoint", "session", "pid"}`) to FILE and then hangs, so a test
can SIGKILL it at exactly that point. Installed as ordinary hook wrappers *inside* the checkpoint policy's, so a
failpoint sits after the barrier at the same point. Without the variables nothing is installed.

| NAME              | where it stops                                                              |
|-------------------|-----------------------------------------------------------------------------|
| prompt-accepted   | after the first pre-step barrier of a turn (the prompt is durable)           |
| approval          | while a call waits for approval (headless approver)                         |
| after-tool-result | after the first top-level tool result was appended and written, before step/end |
| turn-ended        | after the turn-end barrier                                                   |
| tool-body-start   | after the first top-level call's pre-tool barrier, before its body runs      |
| tool-body-done    | after the first top-level call's body returned, before its result is appended |
| rewind-planned    | after a rewind's plan is durable, before its first file is touched          |
| rewind-restored   | after a rewind restored (and recorded) its first file                       |
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
REWIND_POINTS = ("rewind-planned", "rewind-restored")


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
            await self.session.flush()  # "written": make sure the result reached the file before we stop
            await self.stop_here()

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
            await self.session.flush()  # approval/asked is on disk, as a live UI would have it after its write window
            await self.stop_here()

        return waiting


def from_env(session: LiveSession, env: Mapping[str, str] | None = None) -> Failpoint | None:
    env = os.environ if env is None else env
    name, marker = env.get("CAIRN_FAILPOINT"), env.get("CAIRN_FAILPOINT_MARKER")
    if not name or not marker:
        return None
    return Failpoint(name, marker, session)


async def rewind_point(name: str, session: LiveSession, env: Mapping[str, str] | None = None) -> None:
    """Stop at a rewind's failpoint `name` when CAIRN_FAILPOINT names it (the engine calls this; nothing otherwise)."""
    env = os.environ if env is None else env
    if env.get("CAIRN_FAILPOINT") == name and env.get("CAIRN_FAILPOINT_MARKER"):
        await session.flush()
        await Failpoint(name, env["CAIRN_FAILPOINT_MARKER"], session).stop_here()
