"""The checkpoint policy (SPEC §3): the only place that *chooses* durability barriers.

It is a plugin on the loop's hooks, mounted beside a live session; the coordinator performs the barriers. Without it a
session still works, with write-behind durability only. `install()` registers four wrappers; `dispose()` removes them.

| barrier     | fails                                   | cancelled while pending                 |
|-------------|-----------------------------------------|-----------------------------------------|
| pre-step    | raise: the turn ends `error`            | cancellation propagates: `cancelled`    |
| pre-request | raise: provider never constructed       | provider never constructed              |
| pre-tool    | CHECKPOINT_FAILED outcome, body not run | re-checked after the barrier: aborted   |
| turn-end    | reported, never raised                  | –                                       |
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import anyio
import anyio.lowlevel

from cairn.persistence.coordinator import CoordinatorClosed
from cairn.persistence.errors import CheckpointFailed, StaleWriter
from cairn.persistence.events import CHECKPOINT_FAILED
from cairn.persistence.session import LiveSession

from .hooks import Hooks, StepContext, StreamContext, ToolOutcome, ToolRunContext, TurnContext

Report = Callable[[str], None]


class CheckpointPolicy:
    def __init__(self, session: LiveSession, report: Report | None = None) -> None:
        self.session = session
        self.report: Report = report or (lambda message: None)
        self._removers: list[Callable[[], None]] = []
        self.barriers: list[str] = []  # names of barriers taken, in order (for tests and diagnostics)

    def install(self, hooks: Hooks) -> "CheckpointPolicy":
        self._removers = [
            hooks.add("before_step", self.pre_step),
            hooks.add("around_stream", self.pre_request),
            hooks.add("around_tool", self.pre_tool),
            hooks.add("after_turn", self.turn_end),
        ]
        return self

    def dispose(self) -> None:
        for remove in self._removers:
            remove()
        self._removers = []

    async def barrier(self, name: str) -> None:
        if not self.session.live:
            raise CheckpointFailed(CoordinatorClosed())
        self.barriers.append(name)
        await self.session.flush()

    async def pre_step(self, ctx: StepContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        await self.barrier("pre-step")
        return await call_next()

    async def pre_request(self, ctx: StreamContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        await self.barrier("pre-request")
        return await call_next()

    async def pre_tool(self, ctx: ToolRunContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        if ctx.parent_call_id is not None:
            return await call_next()  # the parent's barrier already covers a nested call
        try:
            await self.barrier("pre-tool")
        except CheckpointFailed as e:
            return ToolOutcome(f"Not run: the checkpoint before this call failed ({e.cause}).", CHECKPOINT_FAILED)
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled while the barrier ran: the body must not start
        return await call_next()

    async def turn_end(self, ctx: TurnContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        try:
            await self.barrier("turn-end")
        except CheckpointFailed as e:
            if isinstance(e.cause, StaleWriter):
                return await call_next()  # fenced: nothing will ever be written again; the close says so, once
            coordinator = self.session.coordinator
            durable = (f"events up to seq {coordinator.durable_seq} are durable"
                       if coordinator.durable_seq >= 0 else "none of its events is durable yet")
            self.report(f"turn {ctx.turn} ended but is not durable: {e}; {durable}, the {coordinator.queued} after "
                        "them are held in memory and Cairn tries to write them again at its next checkpoint and when "
                        "it closes the session (it says so if that fails too)")
        return await call_next()
