"""The `demo` provider (SPEC §7): keyless, offline, deterministic. It reads plain-language prompts, uses the real tools,
and streams its answers at a readable pace, so every part of the UI and of recovery can be tried without a key.

Understood prompts: "list files [in DIR]", "read PATH", "write PATH: TEXT", "edit PATH: OLD -> NEW", "search TEXT",
"run COMMAND". After a tool result it reports what came back; anything else gets a short guide.
"""

from __future__ import annotations

import json
import re
from typing import Any, AsyncIterator

import anyio

from ..render import fence
from .base import ModelRequest, NoServer, RawToolCall, StreamEnd, StreamItem, TextDelta

HELP = (
    "I'm the offline **demo** model: no key, no network, but real tools. Try:\n\n"
    "- `list files` (or `list files in src`)\n"
    "- `read README.md`\n"
    "- `write notes.txt: hello`\n"
    "- `edit notes.txt: hello -> goodbye`\n"
    "- `search TODO`\n"
    "- `run ls -la`\n\n"
    "Kill Cairn in the middle of a `run sleep 30` and resume the session to see crash recovery."
)

_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?:list|ls)(?: files)?(?: in)?\s*(?P<path>\S*)\s*$", re.I), "list_dir"),
    (re.compile(r"^(?:read|cat|show|open)\s+(?P<path>\S+)\s*$", re.I), "read_file"),
    (re.compile(r"^write\s+(?P<path>[^:\s]+)\s*:\s?(?P<content>.*)$", re.I | re.S), "write_file"),
    (re.compile(r"^edit\s+(?P<path>[^:\s]+)\s*:\s*(?P<old>.+?)\s*->\s*(?P<new>.*)$", re.I | re.S), "edit_file"),
    (re.compile(r"^(?:search|grep|find)\s+(?P<pattern>.+?)\s*$", re.I), "search_text"),
    (re.compile(r"^(?:run|exec|sh|\$)\s+(?P<command>.+?)\s*$", re.I | re.S), "run_command"),
]


def plan(prompt: str) -> tuple[str, dict[str, Any]] | None:
    """The tool call a prompt asks for, if any."""
    text = prompt.strip()
    for pattern, tool in _RULES:
        m = pattern.match(text)
        if not m:
            continue
        args = {k: v for k, v in m.groupdict().items()}
        if tool == "list_dir":
            args = {"path": args["path"] or "."}
        elif tool == "write_file" and not args["content"].endswith("\n"):
            args["content"] += "\n"
        return tool, args
    return None


def words(text: str) -> list[str]:
    """Stream in pieces of a couple of words, keeping whitespace, like a real model."""
    parts = re.findall(r"\S+\s*|\s+", text)
    return ["".join(parts[i : i + 2]) for i in range(0, len(parts), 2)]


class DemoProvider(NoServer):
    name = "demo"

    def __init__(self, model: str | None = None, delay: float = 0.02) -> None:
        self.model = model or "demo"
        self.delay = delay

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        last = request.messages[-1] if request.messages else {"role": "user", "content": ""}
        calls: list[RawToolCall] = []
        if last.get("role") == "tool":
            text = self._report(request.messages)
        else:
            wanted = plan(str(last.get("content") or ""))
            if wanted is None:
                text = HELP
            else:
                tool, args = wanted
                text = f"I'll use `{tool}` for that."
                calls.append(RawToolCall(f"call_{request.turn}_{request.step}_1", tool, json.dumps(args)))
        for i, piece in enumerate(words(text)):
            if i and self.delay:
                await anyio.sleep(self.delay)
            yield TextDelta(piece)
        yield StreamEnd(calls, "tool_calls" if calls else "stop")

    @staticmethod
    def _report(messages: list[dict[str, Any]]) -> str:
        results = []
        for m in reversed(messages):
            if m.get("role") != "tool":
                break
            results.append(str(m.get("content", "")))
        content = "\n\n".join(reversed(results)).strip()
        if len(content) > 2000:
            content = content[:2000] + "\n…"
        if not content:
            return "Done; the tool returned nothing."
        return f"Here is what came back:\n\n{fence(content)}"

    async def aclose(self) -> None:
        pass
