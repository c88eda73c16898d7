"""Derive the model-visible conversation (OpenAI chat messages) from the session log, incrementally.

Fed every event once as it is appended (or loaded), so building a request is O(new events), never O(session).
What the model sees: user prompts, finished (or interrupted) assistant messages with their tool calls, the result of
every top-level call (repair's synthetic results included), and operator verdicts on OUTCOME_UNKNOWN calls.
"""

from __future__ import annotations

import json
from typing import Any

from cairn.persistence.events import (
    AnyEvent,
    AssistantMessage,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
    UserMessage,
)

VERDICT_WORDS = {
    "happened": "it DID take effect",
    "did_not_happen": "it did NOT take effect",
    "unknown": "it is still unknown whether it took effect",
}


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class Transcript:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._open_calls: set[str] = set()  # top-level call ids of the latest assistant message
        self._names: dict[str, str] = {}  # call_id -> tool name, for verdict texts

    def add(self, event: AnyEvent) -> None:
        if isinstance(event, UserMessage):
            self.messages.append({"role": "user", "content": event.text})
        elif isinstance(event, AssistantMessage):
            message: dict[str, Any] = {"role": "assistant", "content": event.text or None}
            if event.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments_text(c.arguments)},
                    }
                    for c in event.tool_calls
                ]
                self._open_calls = {c.call_id for c in event.tool_calls}
                self._names.update((c.call_id, c.name) for c in event.tool_calls)
            if message["content"] is not None or event.tool_calls:
                self.messages.append(message)
        elif isinstance(event, ToolResult):
            if event.call_id in self._open_calls:
                self._open_calls.discard(event.call_id)
                self.messages.append({"role": "tool", "tool_call_id": event.call_id, "content": event.content})
        elif isinstance(event, ToolCall):
            self._names.setdefault(event.call_id, event.name)
        elif isinstance(event, RecoveryVerdict):
            name = self._names.get(event.call_id, "a tool")
            note = f" Operator's note: {event.note}" if event.note else ""
            self.messages.append(
                {
                    "role": "user",
                    "content": f"[Cairn recovery] The operator checked the interrupted call {event.call_id} "
                    f"(`{name}`): {VERDICT_WORDS[event.verdict]}.{note}",
                }
            )

    def extend(self, events: list[AnyEvent]) -> None:
        for event in events:
            self.add(event)
