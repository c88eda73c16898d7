"""Context compaction: keep a long session's requests inside the model's context window, without losing recovery facts.

Every request sends the derived conversation; an 80-turn session outgrows most context windows, and a server that
answers "context length exceeded" to every request makes the session as dead as a crash would. When the next request
would pass `COMPACT_AT` of the window (an estimate), or the server refuses one for its length, the loop asks the same
provider for a summary of everything up to a turn (or step) boundary and appends `context/compaction`. The derived
conversation is then: system, the summary, everything after `through_seq`. The log keeps every event; repair, `show`
and the resume screen work on the raw log as before.

What is never summarised away: every OUTCOME_UNKNOWN call and every operator verdict of the compacted part is carried
verbatim (tool, arguments, status, what the model was told, the verdict) beside the summary, and carried again by the
next compaction. A crash during compaction loses nothing: the log simply has no compaction yet, and the next request
compacts again.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping

from cairn.persistence.events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ContextCompaction,
    RecoveryEvidence,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
)

from ..providers.base import HTTPStatusError, ProviderError, ServerReportedError
from .token_estimate import messages_tokens, text_tokens, tools_tokens

DEFAULT_CONTEXT_WINDOW = 128_000
COMPACT_AT = 0.85  # of the window: leave room for the answer and for the estimate being rough
MIN_PIECE_TOKENS = 128  # a summary piece refused for length is halved down to this, then the compaction fails

# Context windows of known model families (tokens); the first matching prefix wins, anything else gets the default.
KNOWN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_000_000), ("gpt-5", 400_000), ("gpt-4o", 128_000), ("o1", 200_000), ("o3", 200_000),
    ("o4", 200_000), ("claude", 200_000), ("deepseek", 128_000), ("gemini", 1_000_000), ("gemma3", 32_000),
    ("gemma-3", 32_000), ("qwen2.5", 32_000), ("llama3", 128_000), ("llama-3", 128_000), ("mistral", 32_000),
)

# Words servers use when a request is too long for the model (OpenAI, Anthropic, llama.cpp, vLLM, LiteLLM).
OVERFLOW_WORDS = (
    "context_length_exceeded", "context length", "maximum context", "prompt is too long", "too many tokens",
    "exceeds the context", "context window", "n_ctx", "input is too long",
    # llama.cpp: {"type":"exceed_context_size_error","message":"request (19579 tokens) exceeds the available context
    # size (8192 tokens), try increasing it"}
    "exceed_context_size_error", "exceeds the available context size",
)

SUMMARY_SYSTEM = (
    "You are compacting the conversation of a coding agent so it can continue in a smaller context. Write a concise "
    "but complete summary for the agent itself: the user's goals and instructions, decisions made, files and commands "
    "involved with their outcomes, the current state of the work, and what remains to do. Keep exact names, paths, "
    "values and error messages. Do not invent anything. Answer with the summary only."
)
SUMMARY_HEADER = "[Cairn: summary of the earlier conversation, written when it outgrew the context window]"
SUMMARY_HEADER_ASKED = "[Cairn: summary of the earlier conversation, written because the operator asked (/compact)]"
CARRIED_HEADER = (
    "[Cairn recovery, carried verbatim: tool calls whose outcome is unknown after a crash or cancellation, and the "
    "operator's verdicts. Verify before repeating any of them.]"
)


class CompactionFailed(ProviderError):
    """The summary request failed or came back empty; the turn ends in error and the session stays continuable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "COMPACTION_FAILED")


def context_window_for(model: str | None, env: Mapping[str, str] | None = None) -> int:
    """CAIRN_CONTEXT_WINDOW when set (validated), else the model family's window, else 128k tokens."""
    configured = configured_window(env)
    if configured is not None:
        return configured
    name = (model or "").lower().rsplit("/", 1)[-1]
    return next((tokens for prefix, tokens in KNOWN_WINDOWS if name.startswith(prefix)), DEFAULT_CONTEXT_WINDOW)


def configured_window(env: Mapping[str, str] | None = None) -> int | None:
    """CAIRN_CONTEXT_WINDOW (validated), or None when it is not set."""
    env = os.environ if env is None else env
    raw = (env.get("CAIRN_CONTEXT_WINDOW") or "").strip()
    if not raw:
        return None
    from ..config.resolver import ConfigError

    if not raw.isdigit() or int(raw) < 1024:
        raise ConfigError(f"CAIRN_CONTEXT_WINDOW must be a whole number of tokens >= 1024, not {raw[:40]!r}")
    return int(raw)


def estimate_tokens(messages: list[dict[str, Any]], tools: Iterable[Any] = ()) -> int:
    """The size of a request in tokens, estimated by character class (token_estimate.py), tools' schemas included."""
    return messages_tokens(messages) + tools_tokens(tools) + 1


def is_context_overflow(error: ProviderError) -> bool:
    """Whether a provider error says the request was too long for the model's context."""
    refused = isinstance(error, HTTPStatusError) and error.status in (400, 413, 422)
    if not refused and not isinstance(error, ServerReportedError):
        return False
    return error.says(*OVERFLOW_WORDS)  # its message, or the code beside it (`context_length_exceeded`)


# where a refusal names the window: llama.cpp "available context size (8192 tokens)", OpenAI / vLLM "maximum context
# length is 8192 tokens", Anthropic-style "prompt is too long: 210000 tokens > 200000 maximum"
WINDOW_NAMED = (
    re.compile(r"available context size \((\d+) tokens\)"),
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"tokens > (\d+) maximum"),
)


def window_named_in(error: ProviderError) -> int | None:
    """The context size a length refusal names, if it names one (a server's own word beats a configured guess)."""
    text = str(error)
    for pattern in WINDOW_NAMED:
        found = pattern.search(text)
        if found and 256 <= int(found.group(1)) <= 100_000_000:
            return int(found.group(1))
    return None


def carried_facts(events: list[AnyEvent], through_seq: int) -> list[dict[str, Any]]:
    """The OUTCOME_UNKNOWN calls and verdicts among events[..through_seq], previous compactions' carried facts
    included, in the order they happened; a later verdict is attached to its call."""
    carried: dict[str, dict[str, Any]] = {}
    calls: dict[int, ToolCall] = {}
    for e in events:
        if e.seq > through_seq:
            break
        if isinstance(e, ContextCompaction):
            for fact in e.carried:
                carried[str(fact.get("call_id"))] = dict(fact)
        elif isinstance(e, ToolCall):
            calls[e.seq] = e
        elif isinstance(e, ToolResult) and e.error_code == TOOL_OUTCOME_UNKNOWN:
            call = calls.get(e.source_seq) if e.source_seq is not None else None
            if call is not None and call.parent_call_id is not None:
                continue  # a nested call: its parent's outcome is what the model saw
            carried[e.call_id] = {
                "call_id": e.call_id, "name": call.name if call else "", "arguments": call.arguments if call else None,
                "status": "OUTCOME_UNKNOWN", "told": e.content, "verdict": None, "note": "",
            }
        elif isinstance(e, RecoveryVerdict):
            fact = carried.setdefault(e.call_id, {"call_id": e.call_id, "name": "", "arguments": None,
                                                  "status": "OUTCOME_UNKNOWN", "told": "", "verdict": None, "note": ""})
            fact["verdict"], fact["note"] = e.verdict, e.note
        elif isinstance(e, RecoveryEvidence) and e.call_id in carried:
            carried[e.call_id]["evidence"] = f"{e.finding}: {e.detail}"
    return list(carried.values())


def summary_text(event: ContextCompaction) -> str:
    """The user content that stands for everything the compaction replaced."""
    parts = [SUMMARY_HEADER_ASKED if event.reason == "operator" else SUMMARY_HEADER, event.summary.strip()]
    if event.carried:
        lines = [CARRIED_HEADER]
        for fact in event.carried:
            arguments = json.dumps(fact.get("arguments"), ensure_ascii=False)
            line = f"- call {fact.get('call_id')} `{fact.get('name') or 'a tool'}` {arguments}: {fact.get('status')}."
            if fact.get("told"):
                line += f" You were told: {fact['told']}"
            if fact.get("evidence"):
                line += f" Cairn checked: {fact['evidence']}."
            if fact.get("verdict"):
                line += f" Operator's verdict: {fact['verdict']}."
                if fact.get("note"):
                    line += f" Note: {fact['note']}"
            lines.append(line)
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def summary_messages(lines: list[str], so_far: str = "") -> list[dict[str, Any]]:
    """One summary request over `lines`; with `so_far` (the summary of the part before them) it asks to continue it."""
    if so_far:
        ask = f"Here is the summary of the conversation so far:\n\n{so_far}\n\nContinue it with the rest:\n\n"
    else:
        ask = "Summarise this conversation:\n\n"
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": ask + "\n\n".join(lines)}]


def summary_pieces(messages: list[dict[str, Any]], budget_tokens: int) -> list[list[str]]:
    """The transcript cut into pieces of at most `budget_tokens` each (estimated), oldest first, so every summary
    request fits the window however long the history is (SPEC §7 rev 3); a text longer than a piece is split, never
    dropped."""
    limit = max(1, budget_tokens)
    pieces: list[list[str]] = [[]]
    size = 0
    for line in transcript_lines(messages):
        for part in split_text(line, limit):
            tokens = text_tokens(part) + 1
            if size + tokens > limit and pieces[-1]:
                pieces.append([])
                size = 0
            pieces[-1].append(part)
            size += tokens
    return pieces


def split_text(text: str, limit: int) -> list[str]:
    """`text` in consecutive parts of at most `limit` estimated tokens each (halved until they fit)."""
    if text_tokens(text) <= limit or len(text) < 2:
        return [text]
    middle = len(text) // 2
    return split_text(text[:middle], limit) + split_text(text[middle:], limit)


def halve_piece(piece: list[str], floor: int = MIN_PIECE_TOKENS) -> list[list[str]] | None:
    """A piece the server refused for its length, as two halves of about equal size (the estimate was wrong for this
    text, so the server is the judge); None when the piece is already at the floor: halving again would not help."""
    sizes = [text_tokens(line) + 1 for line in piece]
    total = sum(sizes)
    if total <= floor:
        return None
    if len(piece) == 1:
        middle = len(piece[0]) // 2
        return [[piece[0][:middle]], [piece[0][middle:]]] if middle else None
    running, cut = 0, 1
    for cut, size in enumerate(sizes[:-1], start=1):
        running += size
        if running >= total / 2:
            break
    return [piece[:cut], piece[cut:]]


def transcript_lines(messages: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            lines.append(f"[tool result {m.get('tool_call_id')}]\n{m.get('content')}")
            continue
        if m.get("content"):
            lines.append(f"[{role}]\n{m['content']}")
        for call in m.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"[{role} calls {function.get('name')} as {call.get('id')}] {function.get('arguments')}")
    return lines
