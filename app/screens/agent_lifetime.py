"""The chat's agent, from start-up to ordered stop: built in a worker right after the first frame (usable first, P8) or
at once when a prompt needs it, and taken down in the reverse order it was built.

The chat says how to build the agent and what to hear from it; this object says when, and keeps it alive until `stop`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent stack (loop, tools, providers, MCP) is imported after the first frame (P8)
    from textual.dom import DOMNode
    from textual.worker import Worker

    from ..compose import Agent

AFTER_FIRST_FRAME = 0.15  # seconds between the first frame and building the agent stack (a prompt sent sooner waits)
SLICE_PAUSE = 0.004  # seconds the event loop is let go between two of the agent stack's imports


# Imported after the first frame one module at a time, leaves first, with the event loop let go between two: each is
# a few milliseconds, so keys typed meanwhile are echoed at once instead of after the whole stack (P8). The agent stack
# (loop, policy, tools, providers; the approval dialog) and the Markdown renderer the first answer needs. A module left
# out of this list is simply imported with the first one that needs it; a package comes whole (markdown_it's
# __init__ imports all of it: ~25 ms that cannot be cut smaller).
AGENT_STACK = (
    "html.entities", "markdown_it", "pygments.lexer", "rich.syntax", "rich.markdown",
    "cairn.widgets.answer_markdown", "anyio._backends._asyncio", "cairn.app.agent.hooks", "cairn.app.providers.base",
    "cairn.app.agent.compaction", "anyio.lowlevel", "ctypes", "cairn.app.tools.base", "cairn.app.tools.files",
    "cairn.app.tools.command", "cairn.app.agent.loop", "cairn.app.compose", "cairn.app.agent.approval",
    "cairn.app.screens.approval",
)


async def load_agent_stack() -> None:
    """Import the agent stack after the first frame, on the event loop's own thread: importing in a worker thread while
    this thread imports cairn modules too (a screen, the rewind engine) can hand one of them a half-initialised module
    (seen in a fresh install: ApprovalModal missing, so no approval could open). A test seam: hold it to keep the TUI
    without an agent."""
    import importlib

    for name in AGENT_STACK:
        if name not in sys.modules:
            importlib.import_module(name)
            # long enough for a key typed meanwhile to go all the way through (app, screen, prompt, update timer: a
            # few hops of the event loop each), not just one turn of the loop
            await asyncio.sleep(SLICE_PAUSE)


class AgentLifetime:
    """Starts the agent once, hands it out when it is ready, and stops it in order.

    `build` mounts the agent stack on the exit stack it is given (entered in order: persistence → policy → loop);
    `ready` is told the agent before any prompt can reach it (the chat subscribes to what it wants to hear)."""

    def __init__(self, build: Callable[[AsyncExitStack], Awaitable[Agent]], ready: Callable[[Agent], None]) -> None:
        self.agent: Agent | None = None
        self._build = build
        self._ready = ready
        self._stop = asyncio.Event()
        self._agent_ready = asyncio.Event()
        self._agent_wanted = asyncio.Event()  # a prompt waits for the agent: build it now, not a moment later
        self._frame_drawn = asyncio.Event()  # the first frame is out: the agent stack may be built a moment later
        self._worker: Worker[None] | None = None

    def start(self, owner: DOMNode) -> None:
        """The worker (run by `owner`, so it goes with it) that builds the agent stack right after the first frame, so
        the screen is drawn first. A prompt sent before it is ready waits for it."""
        if self._worker is None and not self._stop.is_set():
            self._worker = owner.run_worker(self._run(), name="agent", exit_on_error=True)

    def first_frame_drawn(self) -> None:
        self._frame_drawn.set()

    async def wanted(self) -> Agent:
        """The agent, built now if it is not yet (a prompt waits for it)."""
        self._agent_wanted.set()
        await self._agent_ready.wait()
        assert self.agent is not None
        return self.agent

    async def stop(self) -> None:
        """Cancel the running turn and wait until the loop is idle (its real closing events are written) and the
        policy is removed. Safe to call twice."""
        self._stop.set()
        if self._worker is not None:
            await self._worker.wait()

    async def _run(self) -> None:
        # a moment after the first frame (keys typed right after the screen appears are echoed before the imports
        # begin, P8), at once if a prompt is already waiting. Waited here, in the worker: a Textual timer would reach
        # the screen through its message queue, which a prompt waiting for the agent holds (a deadlock)
        wanted, drawn, stop = (asyncio.ensure_future(e.wait()) for e in (self._agent_wanted, self._frame_drawn,
                                                                           self._stop))
        try:
            await asyncio.wait((wanted, drawn, stop), return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait((wanted, stop), timeout=AFTER_FIRST_FRAME, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (wanted, drawn, stop):
                waiting.cancel()
        if self._stop.is_set():
            return  # the app closes before the agent was ever needed
        await load_agent_stack()
        async with AsyncExitStack() as stack:
            self.agent = await self._build(stack)
            self._ready(self.agent)
            self._agent_ready.set()
            await self._stop.wait()
        # leaving the stack: the loop cancelled its turn and wrote the real closing events; the policy is removed
