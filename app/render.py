"""Plain-text rendering of events for headless output (`cairn run` progress lines, `cairn show`)."""

from __future__ import annotations

import json
import time
from typing import Any

from cairn.persistence.events import (
    AnyEvent,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    IgnorableEvent,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)

STATUS_WORDS = {
    None: "ok",
    "TOOL_NOT_STARTED": "NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN": "OUTCOME_UNKNOWN",
}


def summarize_arguments(arguments: Any, limit: int = 80) -> str:
    if isinstance(arguments, dict):
        text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    else:
        text = repr(arguments)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def result_status(result: ToolResult) -> str:
    return STATUS_WORDS.get(result.error_code, result.error_code or "ok")


def first_line(text: str, limit: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def format_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000))


def render_session(events: list[AnyEvent], repair_from: int | None = None) -> str:
    """A readable transcript. Events at index >= repair_from are marked as added by repair (not yet written)."""
    out: list[str] = []
    names: dict[str, str] = {}
    for i, e in enumerate(events):
        mark = "  [repair]" if repair_from is not None and i >= repair_from else ""
        if isinstance(e, TurnStart):
            out.append(f"── turn {e.turn} ──")
        elif isinstance(e, UserMessage):
            out.append(f"> {e.text}")
        elif isinstance(e, AssistantMessage):
            flag = " (interrupted)" if e.interrupted else ""
            if e.text:
                out.append(e.text.rstrip() + flag)
            elif e.interrupted:
                out.append("(interrupted before any text)")
            for c in e.tool_calls:
                names[c.call_id] = c.name
        elif isinstance(e, ToolCall):
            names[e.call_id] = e.name
            nested = f" (nested in {e.parent_call_id})" if e.parent_call_id else ""
            out.append(f"  → {e.name}({summarize_arguments(e.arguments)}) [{e.safety}] {e.call_id}{nested}")
        elif isinstance(e, ApprovalDecided):
            out.append(f"  ? approval for {e.call_id}: {e.decision}")
        elif isinstance(e, ToolResult):
            name = names.get(e.call_id, "tool")
            out.append(f"  ← {name} {e.call_id}: {result_status(e)} — {first_line(e.content)}{mark}")
        elif isinstance(e, RecoveryVerdict):
            note = f" ({e.note})" if e.note else ""
            out.append(f"  ✓ verdict on {e.call_id}: {e.verdict}{note}")
        elif isinstance(e, TurnEnd):
            err = f": {e.error.code} {e.error.message}" if e.error else ""
            out.append(f"── turn {e.turn} {e.reason}{err} ──{mark}")
        elif isinstance(e, IgnorableEvent):
            out.append(f"  (ignored event {e.type})")
    # chunks of a step that never got its assistant/message (crash mid-stream) are still worth seeing
    dangling = _dangling_chunks(events)
    if dangling:
        out.append(f"(partial answer before the crash: {dangling!r})")
    return "\n".join(out)


def _dangling_chunks(events: list[AnyEvent]) -> str:
    parts: list[str] = []
    for e in events:
        if isinstance(e, AssistantChunk):
            parts.append(e.delta)
        elif isinstance(e, AssistantMessage):
            parts = []
    return "".join(parts)
