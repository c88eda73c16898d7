"""Text form: the conversation for servers whose chat template has no `tool` role (SPEC §7 rev 3, "No tool role").

Some chat templates (llama.cpp serving Gemma-style templates) refuse any `tool` message or assistant `tool_calls` with a
400 ("Conversation roles must alternate user/assistant/…"). In text form each tool call is written into its assistant
message and each result into the next user message — recovery notes and verdicts included, since they are results and
user text — and roles strictly alternate. Tool definitions still go in `tools`: a server that uses them keeps working.
"""

from __future__ import annotations

import json
from typing import Any

from ..providers.base import HTTPStatusError, ProviderError

# What such servers say (llama.cpp's Jinja error, and the wordings of servers that reject the role outright).
REFUSAL_WORDS = (
    "roles must alternate", "unable to generate parser for this template", "tool role", "role 'tool'",
    'role "tool"', "does not support tool", "tool_calls is not supported",
)


def refuses_tool_role(error: ProviderError) -> bool:
    """Whether a provider error is a chat template refusing the tool role or tool calls."""
    if not (isinstance(error, HTTPStatusError) and error.status in (400, 422, 500)):
        return False
    return error.says(*REFUSAL_WORDS)


def as_text_form(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with tool calls and results written as text, consecutive messages of one role merged, and the first
    message after the system prompt a user message."""
    out: list[dict[str, Any]] = []

    def say(role: str, text: str) -> None:
        if not text:
            return
        if out and out[-1]["role"] == role and role != "system":
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})

    for message in messages:
        role = message.get("role")
        content = message.get("content") or ""
        if role == "tool":
            say("user", f"[result of tool call {message.get('tool_call_id')}]\n{content}")
        elif role == "assistant":
            calls = [f"[I call the tool {c.get('function', {}).get('name')} as {c.get('id')} with "
                     f"{_arguments(c.get('function', {}).get('arguments'))}]" for c in message.get("tool_calls") or []]
            say("assistant", "\n".join([content, *calls]).strip())
        else:
            say(str(role), content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
    first = 1 if out and out[0]["role"] == "system" else 0
    if len(out) > first and out[first]["role"] != "user":
        out.insert(first, {"role": "user", "content": "(the conversation so far)"})
    return out


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
