"""The loop's extension points. Each is a chain of wrappers `async (ctx, call_next)`; the first registered is the
outermost. The checkpoint policy is one such plugin; anything else (tracing, rate limits) can sit beside it. They are
a control seam, not a way for faces to listen: faces hear the session's events and the loop's notices (notices.py).

- before_step:  after `step/start` (+ `user/message`), before the request is derived.
- around_stream: wraps *opening* the provider stream; the innermost call constructs it, so a wrapper that raises
  guarantees the provider is never contacted.
- around_tool:  wraps one tool execution after approval and after `tool/call` was appended; the innermost call runs the
  body. Nested calls (a tool dispatching another) go through it too, with `parent_call_id` set.
- after_tool:   after a top-level call's `tool/result` was appended, before the next call or `step/end`.
- after_turn:   after `turn/end` was appended, before the loop reports idle or starts a queued turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:
    from cairn.persistence.session import LiveSession

    from ..providers.base import ModelRequest
    from ..tools.file_writes import Fingerprint


@dataclass
class StepContext:
    session: "LiveSession"
    turn: int
    step: int


@dataclass
class StreamContext:
    session: "LiveSession"
    turn: int
    step: int
    request: "ModelRequest"


@dataclass
class ToolRunContext:
    session: "LiveSession"
    turn: int
    step: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    safety: str
    parent_call_id: str | None
    body_started: bool = False  # set by the innermost call; tells cancellation "aborted before dispatch" from "unknown"
    fingerprint: "Fingerprint | None" = None  # a file tool's, recorded on its tool/call before the barrier


@dataclass
class TurnContext:
    session: "LiveSession"
    turn: int
    reason: str


@dataclass
class ToolOutcome:
    """What a tool execution produced; a wrapper may return one without calling the body (e.g. CHECKPOINT_FAILED)."""

    content: str
    error_code: str | None = None

    @property
    def is_error(self) -> bool:
        return self.error_code is not None


Wrapper = Callable[[Any, Callable[[], Awaitable[Any]]], Awaitable[Any]]
POINTS = ("before_step", "around_stream", "around_tool", "after_tool", "after_turn")


@dataclass
class Hooks:
    chains: dict[str, list[Wrapper]] = field(default_factory=lambda: {p: [] for p in POINTS})

    def add(self, point: str, wrapper: Wrapper) -> Callable[[], None]:
        """Register a wrapper; returns a function that removes exactly this registration."""
        if point not in self.chains:
            raise ValueError(f"unknown hook point {point!r}; known: {', '.join(POINTS)}")
        self.chains[point].append(wrapper)
        return lambda: self.chains[point].remove(wrapper)

    async def run(self, point: str, ctx: Any, innermost: Callable[[], Awaitable[Any]]) -> Any:
        chain = tuple(self.chains[point])  # a snapshot: (un)registering mid-call does not shift the chain

        async def call(i: int) -> Any:
            if i == len(chain):
                return await innermost()
            return await chain[i](ctx, lambda: call(i + 1))

        return await call(0)

    def count(self) -> int:
        return sum(len(c) for c in self.chains.values())


async def nothing() -> None:
    return None
