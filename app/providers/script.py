"""The `script` provider (SPEC §7): replays a JSON file, one entry per model request, in order.

    {"responses": [{"text": "…", "tool_calls": [{"name": "run_command", "arguments": {"command": "…"}}]}, {"text": "…"}]}

Per response, optional: "chunks" (pieces to stream the text in), "delay_ms" (pause between pieces), and, to exercise
rev 2 behaviour without a server, "reasoning" (text streamed as reasoning before the answer), "finish_reason" (default
"tool_calls" when there are calls, else "stop"; "length" plays an answer cut off at the token limit) and "usage"
(`{"input_tokens": …, "output_tokens": …}`). A tool call's "arguments" may be a string, sent to the loop as-is (so a
script can exercise invalid JSON); "call_id" is optional (a string). When the list is exhausted it answers with a short
final text and no tool calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import anyio

from cairn.persistence.events import Usage

from .base import ModelRequest, NoServer, RawToolCall, ReasoningDelta, StreamEnd, StreamItem, TextDelta

EXHAUSTED_TEXT = "(The script has no more responses.)"
FINISH_REASONS = ("stop", "tool_calls", "length", "content_filter", "other")
USAGE_KEYS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


class ScriptError(ValueError):
    """The script file is missing or malformed; the message names the file and the problem."""


def split_text(text: str, pieces: int) -> list[str]:
    if pieces <= 1 or len(text) <= 1:
        return [text] if text else []
    size = -(-len(text) // pieces)
    return [text[i : i + size] for i in range(0, len(text), size)]


MAX_SCRIPT_BYTES = 256 * 1024 * 1024


def load_script(path: str | Path) -> list[dict[str, Any]]:
    from ..config.checks import ConfigError, read_regular_file

    try:  # a FIFO or device named as the script is refused, never opened for reading (it would block)
        raw = read_regular_file(path, "script file", MAX_SCRIPT_BYTES)
    except ConfigError as e:
        raise ScriptError(str(e)) from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise ScriptError(f"script file {path} is larger than {MAX_SCRIPT_BYTES >> 20} MiB; is it the right file?")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ScriptError(f"cannot read script file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ScriptError(f"script file {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ScriptError(f"script file {path} is not valid JSON: arrays or objects nested too deeply") from None
    responses = data.get("responses") if isinstance(data, dict) else None
    if not isinstance(responses, list):
        raise ScriptError(f'script file {path} must be an object with a "responses" list')
    for i, r in enumerate(responses):
        where = f"script file {path}: responses[{i}]"
        if not isinstance(r, dict):
            raise ScriptError(f"{where} must be an object")
        for key in ("text", "reasoning"):
            if not isinstance(r.get(key, ""), str):
                raise ScriptError(f'{where}: "{key}" must be a string')
        if r.get("finish_reason", "stop") not in FINISH_REASONS:
            raise ScriptError(f'{where}: "finish_reason" must be one of {", ".join(sorted(FINISH_REASONS))}')
        usage = r.get("usage", {})
        if not isinstance(usage, dict) or any(k not in USAGE_KEYS or not _count(v) for k, v in usage.items()):
            raise ScriptError(f'{where}: "usage" must be an object of token counts ({", ".join(USAGE_KEYS)})')
        for key in ("chunks", "delay_ms"):
            if key in r and (not isinstance(r[key], int) or isinstance(r[key], bool) or r[key] < 0):
                raise ScriptError(f'{where}: "{key}" must be a non-negative integer')
        calls = r.get("tool_calls", [])
        if not isinstance(calls, list):
            raise ScriptError(f'{where}: "tool_calls" must be a list')
        for j, c in enumerate(calls):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise ScriptError(f'{where}.tool_calls[{j}] must be an object with a "name" string')
            if not isinstance(c.get("call_id", ""), str):
                raise ScriptError(f'{where}.tool_calls[{j}]: "call_id" must be a string')
    return responses


class ScriptProvider(NoServer):
    name = "script"

    def __init__(self, path: str | Path, model: str | None = None) -> None:
        self.path = Path(path)
        self.model = model or "script"
        self.responses = load_script(path)
        self.requests_served = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        index = self.requests_served
        self.requests_served += 1
        entry: dict[str, Any] = self.responses[index] if index < len(self.responses) else {"text": EXHAUSTED_TEXT}
        delay = entry.get("delay_ms", 0) / 1000
        if entry.get("reasoning"):
            yield ReasoningDelta(entry["reasoning"])
        pieces = split_text(entry.get("text", ""), entry.get("chunks", 1))
        for i, piece in enumerate(pieces):
            if delay and i:
                await anyio.sleep(delay)
            yield TextDelta(piece)
        calls = []
        for i, c in enumerate(entry.get("tool_calls", [])):
            args = c.get("arguments", {})
            raw = args if isinstance(args, str) else json.dumps(args)
            calls.append(RawToolCall(c.get("call_id") or f"call_{request.turn}_{request.step}_{i + 1}", c["name"], raw))
        usage = Usage(**entry["usage"]) if entry.get("usage") else None
        yield StreamEnd(calls, entry.get("finish_reason") or ("tool_calls" if calls else "stop"), usage)

    async def aclose(self) -> None:
        pass
