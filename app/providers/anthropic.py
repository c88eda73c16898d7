"""The `anthropic` provider: the Messages API with `stream: true` over httpx (SPEC §7 rev 2).

It is the OpenAI provider with another wire format: the transport (client, timeouts, retry classification, error
messages with secrets scrubbed, `Retry-After`) is inherited; what differs is written here:

- Request: `POST <base_url>/v1/messages` with `x-api-key` and `anthropic-version`; the system prompt goes in `system`;
  tools as `{name, description, input_schema}`; `max_tokens` is always sent (the API requires it); `thinking` is sent
  when a thinking budget is set (`thinking_budget`, or `reasoning_effort` low/medium/high mapped onto one).
- Conversation: the loop's conversation is OpenAI-shaped (`app/agent/transcript.py`); `to_anthropic()` turns it into
  Messages blocks. Roles alternate strictly (consecutive messages of one role are merged), the answers to an
  assistant's `tool_use` blocks are `tool_result` blocks at the start of the next user message, ids and tool names are
  made to fit the API's pattern (the same way on both sides), and arguments are sent back as objects.
- Thinking: streamed `thinking` deltas are `ReasoningDelta`s; each block's `signature` (and any `redacted_thinking`
  data) is kept in `StreamEnd.reasoning_meta` — `{"anthropic_thinking": [{"signature": …, "chars": n} |
  {"redacted": data}]}`, the characters saying how the stored reasoning text splits back into blocks — and is sent
  back, signed, before the text and tool_use blocks of that assistant message. Thinking without a signature is never
  sent (the API would refuse it). When thinking is on but the assistant message that the API checks (the last one with
  `tool_use`) has no signed thinking — an answer from another provider or cut by a crash — the request goes without
  `thinking` rather than being refused.
- Stream: `message_start` (input usage), `content_block_start/delta/stop` (text, `input_json_delta` for tool input,
  `thinking_delta`, `signature_delta`), `message_delta` (`stop_reason`, output usage), `message_stop`; `ping` is
  ignored; an `error` event ends the stream with that error (retryable for overload/rate-limit/api errors before any
  delta). `stop_reason` is normalised: `end_turn`/`stop_sequence` → stop, `tool_use` → tool_calls, `max_tokens` →
  length, `refusal` → content_filter.
"""

from __future__ import annotations

import json
import re
import uuid
from contextlib import aclosing
from typing import Any, AsyncGenerator, AsyncIterator

import httpx

from cairn.persistence.events import Usage

from .base import (
    ModelRequest,
    RawToolCall,
    ReasoningDelta,
    ServedWindow,
    ServerReportedError,
    StreamEnd,
    StreamItem,
    TextDelta,
    parse_json,
)
from .openai import DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT, OpenAIProvider
from .replies import count_or_none, error_detail, normalize_finish_reason, one_line_cut

DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
META_KEY = "anthropic_thinking"
EFFORT_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
STOP_REASONS = {"refusal": "content_filter", "pause_turn": "other"}
# in-stream error types worth sending the same request again (before any delta)
RETRYABLE_ERRORS = frozenset({"overloaded_error", "rate_limit_error", "api_error", "timeout_error"})
_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")


class AnthropicProvider(OpenAIProvider):
    """Anthropic Messages provider (streaming)."""

    name = "anthropic"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        thinking_budget: int | None = None,
        anthropic_version: str = ANTHROPIC_VERSION,
        api_key_header: str | None = None,
        **options: Any,
    ) -> None:
        options.pop("include_usage", None)  # the Messages API always reports usage
        super().__init__(model, base_url or DEFAULT_BASE_URL, api_key, timeout, max_tokens=max_tokens or
                         DEFAULT_MAX_TOKENS, api_key_header=api_key_header or "x-api-key", **options)
        self.anthropic_version = anthropic_version
        budget = thinking_budget
        if budget is None and self.reasoning_effort:
            budget = EFFORT_BUDGETS.get(self.reasoning_effort.lower())
        self.thinking_budget = budget

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={self._shown_url!r})"

    async def served_window(self) -> ServedWindow | None:
        """Anthropic-style endpoints are not asked for limits (the model family's window applies)."""
        return None

    @property
    def endpoint(self) -> str:
        """`<base_url>/v1/messages` (a base URL that already ends in /v1 or /v1/messages is taken as it is)."""
        base, sep, query = self.base_url.partition("?")
        base = base.rstrip("/")
        if not base.endswith("/messages"):
            base += "/messages" if base.endswith("/v1") else "/v1/messages"
        return base + sep + query

    def _headers(self) -> dict[str, str]:
        headers = super()._headers()
        headers["anthropic-version"] = self.anthropic_version
        return headers

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = to_anthropic(request.messages)
        body: dict[str, Any] = {"max_tokens": self.max_tokens if request.max_tokens is None else request.max_tokens}
        if self.thinking_budget and _thinking_can_be_on(messages):
            body["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        elif self.temperature is not None:  # the API refuses temperature/top_p changes while thinking
            body["temperature"] = self.temperature
        if self.top_p is not None and "thinking" not in body:
            body["top_p"] = self.top_p
        if request.tools:
            choice = _tool_choice(self.tool_choice, self.parallel_tool_calls)
            if choice is not None:
                body["tool_choice"] = choice
        body.update(self.params)
        body.update(self.extra_body)
        body.update(request.params or {})
        body["model"] = request.model or self.model
        if system:
            body["system"] = system
        body["messages"] = messages
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
        body["stream"] = True
        return body

    # ------------------------------------------------------------------ answers

    async def _sse(self, lines: AsyncIterator[str], state: Any) -> AsyncGenerator[StreamItem, None]:
        """The inherited SSE reader (it ignores `event:` lines; every data payload says its own `type`), with the
        final StreamEnd built from the Messages blocks."""
        state.anthropic = _Answer()
        async with aclosing(super()._sse(lines, state)) as items:
            async for item in items:
                yield state.anthropic.end(state) if isinstance(item, StreamEnd) else item

    def _handle_event(self, data: str, state: Any) -> list[StreamItem]:
        try:
            event = parse_json(data)
        except ValueError:
            raise self._malformed(f"a data line is not JSON: {one_line_cut(self._scrub(data), 120)}") from None
        if not isinstance(event, dict):
            raise self._malformed("an event is not a JSON object")
        answer: _Answer = state.anthropic
        kind = event.get("type")
        if kind == "error":
            error = _object(event.get("error"))
            detail = error.get("message") or error_detail(json.dumps(event)) or "unknown error"
            raise self._error(
                ServerReportedError,
                f"{self._shown_url} reported an error: {error.get('type', 'error')}: {one_line_cut(self._scrub(str(detail)))}",
                retryable=error.get("type") in RETRYABLE_ERRORS and not state.started,
            )
        if kind == "message_start":
            message = _object(event.get("message"))
            answer.add_usage(message.get("usage"))
            return []
        if kind == "message_delta":
            delta = _object(event.get("delta"))
            reason = delta.get("stop_reason")
            if reason:
                state.finish_reason = STOP_REASONS.get(reason) or normalize_finish_reason(reason)
            answer.add_usage(event.get("usage"))
            return []
        if kind == "content_block_start":
            block = event.get("content_block")
            if not isinstance(block, dict):
                raise self._malformed("content_block_start without a content_block")
            return answer.start(event.get("index"), block, state)
        if kind == "content_block_delta":
            given = event.get("delta")
            if not isinstance(given, dict):
                raise self._malformed("content_block_delta without a delta")
            return answer.delta(event.get("index"), given, state, self)
        return []  # ping, content_block_stop, message_stop, and event types added later

    async def _non_streaming(self, response: httpx.Response, state: Any) -> AsyncGenerator[StreamItem, None]:
        """A server that ignored `stream: true` and answered one message object."""
        raw = await response.aread()
        try:
            data = parse_json(raw)
        except ValueError:
            snippet = one_line_cut(self._scrub(raw.decode("utf-8", "replace")), 120)
            raise self._malformed(f"the answer is not JSON: {snippet}") from None
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            raise self._malformed("the answer is not a message with content")
        state.anthropic = answer = _Answer()
        answer.add_usage(data.get("usage"))
        for index, block in enumerate(data["content"]):
            if not isinstance(block, dict):
                continue
            block = dict(block)
            for item in answer.start(index, block, state):
                yield item
            if block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
                answer.blocks[index]["input_json"] = [json.dumps(block["input"], ensure_ascii=False)]
        reason = data.get("stop_reason")
        state.finish_reason = (STOP_REASONS.get(reason) or normalize_finish_reason(reason)) if reason else None
        yield answer.end(state)


class _Answer:
    """The content blocks of one streamed answer, by index."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, int] = {}

    def add_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                value = count_or_none(usage.get(key))
                if value is not None:
                    self.usage[key] = value

    def _index(self, index: Any) -> int:
        return index if isinstance(index, int) and not isinstance(index, bool) else max(self.blocks, default=-1) + 1

    def start(self, index: Any, block: dict[str, Any], state: Any) -> list[StreamItem]:
        slot = self.blocks[self._index(index)] = {"type": block.get("type"), "chars": 0, "input_json": []}
        kind = block.get("type")
        out: list[StreamItem] = []
        if kind == "text" and isinstance(block.get("text"), str) and block["text"]:
            out.append(TextDelta(block["text"]))
        elif kind == "thinking":
            slot["signature"] = block.get("signature") or ""
            if isinstance(block.get("thinking"), str) and block["thinking"]:
                slot["chars"] += len(block["thinking"])
                out.append(ReasoningDelta(block["thinking"]))
        elif kind == "redacted_thinking":
            slot["data"] = block.get("data")
        elif kind == "tool_use":
            slot["id"], slot["name"] = block.get("id") or "", block.get("name") or ""
            initial = block.get("input")
            slot["initial"] = json.dumps(initial, ensure_ascii=False) if isinstance(initial, dict) and initial else ""
        if out:
            state.started = True
        return out

    def delta(self, index: Any, delta: dict[str, Any], state: Any, provider: AnthropicProvider) -> list[StreamItem]:
        slot = self.blocks.get(index) if isinstance(index, int) else None
        if slot is None:
            raise provider._malformed(f"a delta for content block {index!r}, which never started")
        kind = delta.get("type")
        out: list[StreamItem] = []
        if kind == "text_delta" and isinstance(delta.get("text"), str) and delta["text"]:
            out.append(TextDelta(delta["text"]))
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str) and delta["thinking"]:
            slot["chars"] += len(delta["thinking"])
            out.append(ReasoningDelta(delta["thinking"]))
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            slot["signature"] = slot.get("signature", "") + delta["signature"]
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            slot["input_json"].append(delta["partial_json"])
        if out:
            state.started = True
        return out

    def end(self, state: Any) -> StreamEnd:
        calls: list[RawToolCall] = []
        thinking: list[dict[str, Any]] = []
        for index in sorted(self.blocks):
            slot = self.blocks[index]
            if slot["type"] == "tool_use":
                arguments = "".join(slot["input_json"]) or slot.get("initial") or "{}"
                call_id = slot["id"] or f"toolu_{uuid.uuid4().hex[:24]}"
                calls.append(RawToolCall(call_id=call_id, name=slot["name"], arguments=arguments))
            elif slot["type"] == "thinking":
                thinking.append({"signature": slot.get("signature") or "", "chars": slot["chars"]})
            elif slot["type"] == "redacted_thinking" and slot.get("data"):
                thinking.append({"redacted": slot["data"]})
        usage = None
        if self.usage:
            cached = self.usage.get("cache_read_input_tokens")
            uncached = self.usage.get("input_tokens")
            created = self.usage.get("cache_creation_input_tokens", 0)
            total_in = None if uncached is None else uncached + (cached or 0) + created
            usage = Usage(input_tokens=total_in, output_tokens=self.usage.get("output_tokens"), cached_tokens=cached)
        meta = {META_KEY: thinking} if thinking else None
        return StreamEnd(tool_calls=calls, finish_reason=state.finish_reason, usage=usage, reasoning_meta=meta)


# ---------------------------------------------------------------------------------------------- the conversation


def to_anthropic(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages) for the Messages API from the OpenAI-shaped conversation the transcript derives."""
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
    ids = _IdMap()

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            if role == "user":  # tool results first, as the API requires, then text
                merged = out[-1]["content"] + blocks
                out[-1]["content"] = [b for b in merged if b["type"] == "tool_result"] + [
                    b for b in merged if b["type"] != "tool_result"
                ]
            else:
                out[-1]["content"] += [b for b in blocks if b["type"] not in ("thinking", "redacted_thinking")]
            return
        out.append({"role": role, "content": blocks})

    for message in messages:
        role = message.get("role")
        content = _text_of(message.get("content"))
        if role == "system":
            if content:
                system_parts.append(content)
        elif role == "user":
            add("user", [{"type": "text", "text": content}] if content else [])
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": ids.get(message.get("tool_call_id")),
                      "content": content or "(no output)"}
            add("user", [result])
        elif role == "assistant":
            blocks = _thinking_blocks(message)
            if content:
                blocks.append({"type": "text", "text": content})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    arguments = parse_json(function.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                blocks.append({"type": "tool_use", "id": ids.get(call.get("id")),
                               "name": _safe_name(function.get("name")),
                               "input": arguments if isinstance(arguments, dict) else {}})
            if any(b["type"] != "thinking" and b["type"] != "redacted_thinking" for b in blocks):
                add("assistant", blocks)
    while out and out[0]["role"] != "user":  # the API wants the conversation to start with the user
        out.pop(0)
    return "\n\n".join(system_parts), out


def _object(value: Any) -> dict[str, Any]:
    """A JSON object from the server, or an empty one when it sent something else there."""
    return value if isinstance(value, dict) else {}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _thinking_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Signed thinking blocks rebuilt from the stored reasoning text and its `reasoning_meta`; nothing unsigned."""
    meta = message.get("reasoning_meta")
    parts = meta.get(META_KEY) if isinstance(meta, dict) else None
    text = message.get("reasoning_content") or ""
    if not isinstance(parts, list) or not isinstance(text, str):
        return []
    blocks: list[dict[str, Any]] = []
    position = 0
    for part in parts:
        if not isinstance(part, dict):
            continue
        if part.get("redacted"):
            blocks.append({"type": "redacted_thinking", "data": part["redacted"]})
            continue
        given = part.get("chars")
        chars = given if isinstance(given, int) else len(text) - position
        piece, position = text[position : position + chars], position + chars
        if part.get("signature") and piece:
            blocks.append({"type": "thinking", "thinking": piece, "signature": part["signature"]})
    return blocks


def _thinking_can_be_on(messages: list[dict[str, Any]]) -> bool:
    """With thinking on, the API requires the last assistant message that used tools to start with signed thinking
    (while its tool loop is open); when it does not, the request goes without thinking instead of being refused."""
    for message in reversed(messages):
        if message["role"] == "user" and any(b["type"] == "text" for b in message["content"]):
            return True  # the tool loop closed with a real prompt: earlier answers are not checked
        if message["role"] == "assistant" and any(b["type"] == "tool_use" for b in message["content"]):
            return message["content"][0]["type"] in ("thinking", "redacted_thinking")
    return True


def _tool_choice(choice: Any, parallel: bool | None) -> dict[str, Any] | None:
    if isinstance(choice, dict):
        result = dict(choice)
    elif choice in (None, "auto"):
        result = {"type": "auto"}
    elif choice == "required":
        result = {"type": "any"}
    elif choice == "none":
        result = {"type": "none"}
    else:
        result = {"type": "auto"}
    if parallel is False and result.get("type") != "none":
        result["disable_parallel_tool_use"] = True
    if choice is None and parallel is None:
        return None
    return result


def _safe_name(name: Any) -> str:
    name = _ID_BAD.sub("_", str(name or "")) or "unknown_tool"
    return name[:64]


class _IdMap:
    """Ids as the API accepts them (`[A-Za-z0-9_-]+`), the same on a tool_use and on its tool_result, unique."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}
        self.used: set[str] = set()

    def get(self, value: Any) -> str:
        raw = str(value or "")
        if raw in self.known:
            return self.known[raw]
        base = _ID_BAD.sub("_", raw) or "toolu_missing"
        safe, n = base, 1
        while safe in self.used:
            n += 1
            safe = f"{base}_{n}"
        self.known[raw] = safe
        self.used.add(safe)
        return safe
