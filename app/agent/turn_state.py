"""What a turn holds while it runs: the loop's state, kept apart so the loop reads as the turn/step machine (what a
turn returns, `TurnResult`, is in notices.py, where faces hear it). A step's answer so far is the exchange's
`Streamed`; each call's progress is a `CallState`, which is what closing a cut turn looks at (asked but not decided,
recorded, running, answered)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cairn.persistence.events import ToolCallRequest, ToolResult, TurnError

from .exchange import Streamed
from .hooks import ToolRunContext


class TurnFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class CallState:
    request: ToolCallRequest  # as the model wrote it: what runs (SPEC §10 rev 4)
    shown: ToolCallRequest  # the same with secrets masked, as stored: what an approval shows
    asked: bool = False  # approval/asked appended, approval/decided not yet
    call_seq: int | None = None  # seq of its tool/call
    run: ToolRunContext | None = None
    result: ToolResult | None = None


@dataclass
class TurnState:
    turn: int
    step: int = 0  # the open step (0: none open)
    streamed: Streamed = field(default_factory=Streamed)  # the open step's answer so far
    calls: list[CallState] = field(default_factory=list)
    last_text: str = ""
    error: TurnError | None = None
