"""How a Cairn session looks to an ACP client: session events as `session/update` payloads.

Two views of the same log, both derived from events only (the log is the source of truth):

- `live_updates(event)` follows the loop while a turn runs: `agent_thought_chunk` for each reasoning chunk,
  `agent_message_chunk` for each assistant chunk;
  `tool_call` (status `pending`) for each call the model asks for, as soon as its `assistant/message` is recorded;
  `tool_call_update` `in_progress` when its `tool/call` is recorded (approved, about to run); `tool_call_update`
  `completed` or `failed` with the result's text when its `tool/result` is recorded. A denied call never gets
  `in_progress`: it goes straight from `pending` to `failed` with DENIED.
- `replay(events)` redraws the whole history for `session/load`: every prompt as `user_message_chunk`, every step's
  reasoning (`assistant/message.reasoning`) as one `agent_thought_chunk` and its assistant text as one
  `agent_message_chunk`, and every tool call once, as a `tool_call` carrying its final status and
  result. A replay describes finished work, so one update per call with its outcome is what a client needs; it is also
  what a client that only renders `tool_call` shows correctly. Calls closed by crash repair come out `failed`, their
  text starting with TOOL_NOT_STARTED or TOOL_OUTCOME_UNKNOWN (the repair's own explanation, which the model sees too).

Text sent to the editor is data, not terminal output, so control characters go out as JSON escapes, unchanged. Lone
surrogates are the exception (`wire`): the package's encoder would send them as `\ud800` escapes, which strict JSON
parsers (Rust's serde_json, in Zed) refuse, losing the whole message; they go out as U+FFFD, as the log stores them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar, Union

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    ToolKind,
    UserMessageChunk,
)

from cairn.persistence.events import (
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    RecoveryVerdict,
    StepEnd,
    ToolCall,
    ToolResult,
    UserMessage,
)

from .render import result_status, summarize_arguments

Update = Union[UserMessageChunk, AgentMessageChunk, AgentThoughtChunk, ToolCallStart, ToolCallProgress]

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


def wire(value: T) -> T:
    """`value` (a string, or JSON-like data holding strings) with lone surrogates replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {wire(k): wire(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, (list, tuple)):
        return [wire(v) for v in value]  # type: ignore[return-value]
    return value

TOOL_KINDS: dict[str, ToolKind] = {
    "list_dir": "read",
    "read_file": "read",
    "search_text": "search",
    "write_file": "edit",
    "edit_file": "edit",
    "run_command": "execute",
}


def tool_title(name: str, arguments: Any) -> str:
    return wire(f"{name}({summarize_arguments(arguments)})")


def tool_kind(name: str) -> ToolKind:
    return TOOL_KINDS.get(name, "other")


def tool_locations(arguments: Any, workspace: Path) -> list[ToolCallLocation] | None:
    """The file a file tool touches, so an editor can show or follow it."""
    if isinstance(arguments, dict) and isinstance(arguments.get("path"), str):
        return [ToolCallLocation(path=wire(str(workspace / arguments["path"])))]
    return None


def result_text(result: ToolResult) -> str:
    """The result as the model saw it; an error is prefixed with its status word unless its text already starts with
    its code (repair's texts do: "TOOL_OUTCOME_UNKNOWN: …")."""
    if not result.is_error or (result.error_code and result.content.startswith(result.error_code)):
        return result.content
    return f"{result_status(result)}: {result.content}"


def final_status(result: ToolResult) -> ToolCallStatus:
    return "failed" if result.is_error else "completed"


def start_call(call_id: str, name: str, arguments: Any, status: ToolCallStatus, workspace: Path,
               text: str | None = None) -> ToolCallStart:
    return start_tool_call(
        wire(call_id), tool_title(name, arguments), kind=tool_kind(name), status=status,
        content=[tool_content(text_block(wire(text)))] if text is not None else None,
        locations=tool_locations(arguments, workspace), raw_input=wire(arguments),
    )


def live_updates(event: AnyEvent, workspace: Path) -> list[Update]:
    """What the client should see now that `event` was appended during a turn."""
    if isinstance(event, AssistantChunk):
        return [update_agent_message_text(wire(event.delta))]
    if isinstance(event, ReasoningChunk):
        return [update_agent_thought_text(wire(event.delta))]
    if isinstance(event, AssistantMessage):
        return [start_call(c.call_id, c.name, c.arguments, "pending", workspace) for c in event.tool_calls]
    if isinstance(event, ToolCall):
        if event.parent_call_id is None:
            return [update_tool_call(wire(event.call_id), status="in_progress")]
        # a nested call (a tool calling another) was never announced by the model: it starts here
        return [start_call(event.call_id, event.name, event.arguments, "in_progress", workspace)]
    if isinstance(event, ToolResult):
        return [update_tool_call(wire(event.call_id), status=final_status(event),
                                 content=[tool_content(text_block(wire(result_text(event))))])]
    return []


def replay(events: list[AnyEvent], workspace: Path) -> list[Update]:
    """The history of a session as updates, for `session/load` (see the module docstring)."""
    out: list[Update] = []
    requested: dict[str, tuple[str, Any]] = {}  # call_id -> (name, arguments)
    results: dict[str, str] = {}  # call_id -> result text (a verdict is shown beside it)
    chunks: list[str] = []  # assistant text of a step whose assistant/message was never written (crash mid-stream)
    thoughts: list[str] = []  # the same for its reasoning

    def flush_chunks() -> None:
        if thoughts:
            out.append(update_agent_thought_text(wire("".join(thoughts))))
            thoughts.clear()
        if chunks:
            out.append(update_agent_message_text(wire("".join(chunks))))
            chunks.clear()

    for e in events:
        if isinstance(e, UserMessage):
            out.append(update_user_message_text(wire(e.text)))
        elif isinstance(e, AssistantChunk):
            chunks.append(e.delta)
        elif isinstance(e, ReasoningChunk):
            thoughts.append(e.delta)
        elif isinstance(e, AssistantMessage):
            chunks.clear()  # the message holds the whole text (and reasoning), interrupted or not
            thoughts.clear()
            if e.reasoning:
                out.append(update_agent_thought_text(wire(e.reasoning)))
            if e.text:
                out.append(update_agent_message_text(wire(e.text)))
            for c in e.tool_calls:
                requested[c.call_id] = (c.name, c.arguments)
        elif isinstance(e, ToolCall):
            requested[e.call_id] = (e.name, e.arguments)
        elif isinstance(e, ToolResult):
            name, arguments = requested.get(e.call_id, ("tool", {}))
            results[e.call_id] = wire(result_text(e))
            out.append(start_call(e.call_id, name, arguments, final_status(e), workspace, results[e.call_id]))
        elif isinstance(e, StepEnd):
            flush_chunks()
        elif isinstance(e, RecoveryVerdict) and e.call_id in results:
            verdict = f"Operator's verdict: {e.verdict}" + (f" ({e.note})" if e.note else "")
            out.append(update_tool_call(wire(e.call_id), content=[tool_content(text_block(results[e.call_id])),
                                                                  tool_content(text_block(wire(verdict)))]))
    flush_chunks()
    return out
