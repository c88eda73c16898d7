"""What the strictest chat servers accept (SPEC §7 "A session is always continuable"), as a checker of OpenAI messages.

One function, `conversation_violations`, used by the transcript tests and by the strict test server: it lists every rule a
conversation breaks instead of stopping at the first, so a failing test shows the whole picture. The rules:

- an optional leading `system` message, then the first message is `user` (`first_not_user`);
- `user` and `assistant` alternate; a run of `tool` messages sits between an assistant with `tool_calls` and what
  follows; no `system` later on, no unknown role; a request ends with `user` or `tool` (`alternation`);
- every `tool_calls` entry is answered by exactly one `tool` message with its id, in order, before the next non-tool
  message (`unanswered_tool_call`); no `tool` message without a matching open call (`orphan_tool_message`);
- every `function.arguments` is a string holding a JSON object; a malformed entry counts here too (`bad_arguments`);
- tool-call ids are non-empty strings, unique across the whole conversation (`duplicate_id`);
- user/tool `content` is a non-empty string; assistant `content` is a string or null, null only with tool calls, and an
  assistant without tool calls says something (`bad_content`);
- with `require_reasoning` (DeepSeek thinking mode), every assistant with tool calls after the last `user` message
  carries a non-empty `reasoning_content` string (`missing_reasoning`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = (
    "first_not_user",
    "alternation",
    "unanswered_tool_call",
    "orphan_tool_message",
    "bad_arguments",
    "duplicate_id",
    "missing_reasoning",
    "bad_content",
)


@dataclass(frozen=True)
class Violation:
    kind: str  # one of KINDS
    index: int  # index in the messages list
    detail: str


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def conversation_violations(messages: list[dict], *, require_reasoning: bool = False) -> list[Violation]:
    """Every rule `messages` (a request's conversation, system message included) breaks; [] when a strict server
    would accept it."""
    found: list[Violation] = []

    def flag(kind: str, index: int, detail: str) -> None:
        found.append(Violation(kind, index, detail))

    start = 1 if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    if start >= len(messages):
        flag("first_not_user", start, "no message after the system message")
        return found
    first = messages[start]
    if not isinstance(first, dict) or first.get("role") != "user":
        role = first.get("role") if isinstance(first, dict) else type(first).__name__
        flag("first_not_user", start, f"the first message is {role!r}, not 'user'")

    seen_ids: set[str] = set()
    pending: list[tuple[str, int]] = []  # (id, index of its assistant message) still waiting for a tool message
    previous: str | None = None  # role of the previous non-tool message (None before the first)
    last_role: str | None = None

    def close_pending() -> None:
        for call_id, at in pending:
            flag("unanswered_tool_call", at, f"tool call {call_id!r} has no tool message before the next message")
        pending.clear()

    for i in range(start, len(messages)):
        message = messages[i]
        if not isinstance(message, dict):
            flag("alternation", i, f"a message must be an object, not {type(message).__name__}")
            continue
        role = message.get("role")
        content = message.get("content")
        last_role = role
        if role == "tool":
            call_id = message.get("tool_call_id")
            if pending and pending[0][0] == call_id:
                pending.pop(0)
            elif any(call_id == p for p, _ in pending):
                k = next(k for k, (p, _) in enumerate(pending) if p == call_id)
                for skipped, at in pending[:k]:
                    flag("unanswered_tool_call", at, f"tool call {skipped!r} is answered out of order (after {call_id!r})")
                del pending[: k + 1]
            else:
                flag("orphan_tool_message", i, f"tool message for {call_id!r} answers no open tool call")
            if not _nonempty_str(content):
                flag("bad_content", i, f"tool content must be a non-empty string, not {content!r:.60}")
            continue

        close_pending()
        if role == "user":
            if previous == "user":
                flag("alternation", i, "two user messages in a row")
            if not _nonempty_str(content):
                flag("bad_content", i, f"user content must be a non-empty string, not {content!r:.60}")
        elif role == "assistant":
            calls = message.get("tool_calls")
            if previous == "assistant" and not (i > 0 and messages[i - 1].get("role") == "tool"):
                flag("alternation", i, "two assistant messages in a row")
            if calls is not None and (not isinstance(calls, list) or not calls):
                flag("bad_arguments", i, "tool_calls must be a non-empty list when present")
                calls = None
            if calls:
                if content is not None and not isinstance(content, str):
                    flag("bad_content", i, f"assistant content must be a string or null, not {content!r:.60}")
                for entry in calls:
                    call_id = _check_call(entry, i, flag)
                    if call_id is None:
                        continue
                    if call_id in seen_ids:
                        flag("duplicate_id", i, f"tool call id {call_id!r} is used more than once")
                    seen_ids.add(call_id)
                    pending.append((call_id, i))
            elif not _nonempty_str(content):
                flag("bad_content", i, f"an assistant message without tool calls needs text, not {content!r:.60}")
        elif role == "system":
            flag("alternation", i, "a system message is only allowed first")
        else:
            flag("alternation", i, f"unknown role {role!r}")
        previous = role if role in ("user", "assistant") else previous
    close_pending()

    if last_role not in ("user", "tool", None):
        flag("alternation", len(messages) - 1, f"a request must end with a user or tool message, not {last_role!r}")

    if require_reasoning:
        last_user = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                        default=-1)
        for i in range(last_user + 1, len(messages)):
            m = messages[i]
            if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls"):
                if not _nonempty_str(m.get("reasoning_content")):
                    flag("missing_reasoning", i, "an assistant message with tool calls in the current turn "
                                                 "needs its reasoning_content")
    return found


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_call(entry: Any, index: int, flag: Any) -> str | None:
    """Flags what is wrong with one `tool_calls` entry; its id when it has a usable one."""
    if not isinstance(entry, dict):
        flag("bad_arguments", index, f"a tool call must be an object, not {type(entry).__name__}")
        return None
    function = entry.get("function")
    if not isinstance(function, dict) or not _nonempty_str(function.get("name")):
        flag("bad_arguments", index, "a tool call needs a function with a name")
    else:
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            flag("bad_arguments", index, f"arguments must be a JSON string, not {type(arguments).__name__}")
        else:
            try:
                parsed = json.loads(arguments, parse_constant=_reject_constant)
            except ValueError:
                flag("bad_arguments", index, f"arguments are not valid JSON: {arguments!r:.60}")
            else:
                if not isinstance(parsed, dict):
                    flag("bad_arguments", index, f"arguments must be a JSON object, not {type(parsed).__name__}")
    call_id = entry.get("id")
    if not _nonempty_str(call_id):
        flag("duplicate_id", index, f"a tool call id must be a non-empty string, not {call_id!r}")
        return None
    return call_id
