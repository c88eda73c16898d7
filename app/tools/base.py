"""Tools: what they are to the loop (name, schema, safety, an async body) and the errors a body may raise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

Safety = Literal["read_only", "idempotent", "side_effecting"]

OUTPUT_LIMIT = 32 * 1024  # characters of tool output a tool keeps (each tool truncates with its own notice)
RESULT_LIMIT = OUTPUT_LIMIT + 4096  # the loop's safety net for any result, room left for the tools' own notices


class ToolFailure(Exception):
    """A tool body failed in a way the model should hear about. `code` is a SPEC §2 error code."""

    code = "TOOL_ERROR"


class BadArguments(ToolFailure):
    code = "BAD_ARGUMENTS"


@dataclass
class ToolContext:
    workspace: Path  # resolved, absolute
    call_id: str  # the model-visible id; the idempotency key (run_command exports it as CAIRN_CALL_ID)
    turn: int
    step: int
    parent_call_id: str | None
    # Run another tool through the registry as a nested call of this one (records tool/call with parent_call_id).
    dispatch: Callable[[str, dict[str, Any]], Awaitable[str]]
    # Record that the body started a process (pid, start time in ms): appends `tool/progress` (write-behind).
    progress: Callable[[int, int], None] = lambda pid, started: None
    # a file tool's fingerprint (files.Fingerprint) recorded on its tool/call: the body refuses when the file changed
    fingerprint: Any = None


ToolBody = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema for the arguments object
    safety: Safety
    body: ToolBody


def truncate_output(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Keep the head and the tail of long output (a command's summary is often at the end) and say visibly how much
    was cut in between."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    cut = len(text) - head - tail
    return f"{text[:head]}\n[output truncated: {cut} characters not shown]\n{text[-tail:]}"
