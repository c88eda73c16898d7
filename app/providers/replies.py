"""What an OpenAI-compatible server (or Anthropic's) says besides the answer, read as Cairn records it: the finish
reason normalised, token usage, `Retry-After`, and the message and codes of an error body, cut to one line."""

from __future__ import annotations

import email.utils
import json
import math
import time
from typing import Any, Mapping

from cairn.persistence.events import Usage

from .base import parse_json

MAX_MESSAGE_CHARS = 300  # the part of an error message taken from the server
MAX_RETRY_AFTER = 60.0  # seconds; a server asking for longer is waited on for this long at most

FINISH_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "end": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_call": "tool_calls",
    "tool_use": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "model_length": "length",
    "content_filter": "content_filter",
    "safety": "content_filter",
}

def normalize_finish_reason(value: Any) -> str | None:
    """Map a server's word for why an answer ended onto stop | tool_calls | length | content_filter | other."""
    if value is None or value == "":
        return None
    return FINISH_REASONS.get(str(value).strip().lower(), "other")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def one_line_cut(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, or `Retry-After` as seconds or an HTTP date; either one
    as LiteLLM relays it, `llm_provider-…`), capped at MAX_RETRY_AFTER; None when it did not ask or the value makes no
    sense."""
    seconds: float | None = None
    # LiteLLM passes the upstream's headers on with an `llm_provider-` prefix: the same request from the same server
    ms = headers.get("retry-after-ms") or headers.get("llm_provider-retry-after-ms")
    if ms:
        try:
            seconds = float(ms) / 1000.0
        except ValueError:
            seconds = None
    value = headers.get("retry-after") or headers.get("llm_provider-retry-after")
    if seconds is None and value:
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None and when.tzinfo is not None:
                seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def count_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_usage(obj: Any) -> Usage | None:
    """An OpenAI `usage` object as a `Usage`; counts the server did not give stay None (DeepSeek's
    `prompt_cache_hit_tokens` stands in for `prompt_tokens_details.cached_tokens`)."""
    if not isinstance(obj, dict):
        return None
    prompt_details = obj.get("prompt_tokens_details")
    prompt_details = prompt_details if isinstance(prompt_details, dict) else {}
    completion_details = obj.get("completion_tokens_details")
    completion_details = completion_details if isinstance(completion_details, dict) else {}
    cached = count_or_none(prompt_details.get("cached_tokens"))
    if cached is None:
        cached = count_or_none(obj.get("prompt_cache_hit_tokens"))
    usage = Usage(
        input_tokens=count_or_none(obj.get("prompt_tokens")),
        output_tokens=count_or_none(obj.get("completion_tokens")),
        cached_tokens=cached,
        reasoning_tokens=count_or_none(completion_details.get("reasoning_tokens")),
    )
    if usage == Usage():
        return None
    return usage



def error_codes(text: str) -> tuple[str, ...]:
    """The identifiers an error body gives beside its message: the `code` and `type` that are words (OpenAI's
    `"code": "context_length_exceeded"`, llama.cpp's `"type": "exceed_context_size_error"`), not numbers."""
    try:
        data = parse_json(text)
    except ValueError:
        return ()
    if not isinstance(data, dict):
        return ()
    inner = data.get("error")
    error: dict[str, Any] = inner if isinstance(inner, dict) else data
    return tuple(v[:200] for v in (error.get("code"), error.get("type")) if isinstance(v, str) and v)


def error_detail(text: str) -> str:
    """The server's error message from an error body (`error.message`, `error` as text, `message`, `detail`), or the
    body's text itself."""
    text = text.strip()
    if not text:
        return ""
    try:
        data = parse_json(text)
    except ValueError:
        return text
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str) and message:
                return message
            return json.dumps(error, ensure_ascii=False)
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            value = data.get(key)
            if isinstance(value, str) and value:
                return value
    return text


def reasoning_text(part: dict[str, Any]) -> str:
    """A delta's or message's reasoning: `reasoning_content` (DeepSeek, vLLM, llama.cpp) wins over `reasoning`."""
    for key in ("reasoning_content", "reasoning"):
        value = part.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def is_json(text: str) -> bool:
    try:
        parse_json(text)
    except ValueError:
        return False
    return True
