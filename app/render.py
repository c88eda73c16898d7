"""Plain-text rendering of events for headless output (`cairn run` progress lines, `cairn show`)."""

from __future__ import annotations

import time
from typing import Iterable

from cairn.persistence.events import (
    AnyEvent,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ContextCompaction,
    ContextEnvironment,
    ContextInstructions,
    ConversationRewind,
    IgnorableEvent,
    OperatorCommand,
    OperatorResult,
    ReasoningChunk,
    RecoveryEvidence,
    RecoveryVerdict,
    RequestRetry,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    usage_totals,
)
from cairn.widgets.attachment_line import attachments_line
from cairn.widgets.terminal_text import summarize_arguments  # noqa: F401  (re-exported for the headless faces)

STATUS_WORDS = {
    None: "ok",
    "TOOL_NOT_STARTED": "NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN": "OUTCOME_UNKNOWN",
}


def shown_model(model: str | None, secrets: "tuple[str, ...] | list[str]" = ()) -> str:
    """A model name as it may be echoed (stderr, `cairn config`, `run --json`'s first line). The operator may have
    pasted a key into --model (`--model sk-…`) or a URL holding a token: configured secret values and anything shaped
    like a credential are masked with prompt history's rules (`history.redact`), and so is a URL's user part
    (`https://TOKEN@host`, which those rules keep)."""
    import re

    from .history import redact

    text = redact(model or "", tuple(secrets))
    return re.sub(r"(?<=://)[^/\s@]+(?=@)", "***", text)


def superseded_verdicts(events: Iterable[AnyEvent]) -> dict[int, int]:
    """The verdicts a later verdict on the same call supersedes: {seq of the earlier verdict: seq of the one after it}.
    The log keeps every verdict (append-only); the newest on a call is the current one, the one the model is told."""
    latest: dict[str, int] = {}
    superseded: dict[int, int] = {}
    for event in events:
        if isinstance(event, RecoveryVerdict):
            earlier = latest.get(event.call_id)
            if earlier is not None:
                superseded[earlier] = event.seq
            latest[event.call_id] = event.seq
    return superseded


def result_status(result: ToolResult) -> str:
    return STATUS_WORDS.get(result.error_code, result.error_code or "ok")


def first_line(text: str, limit: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def fence(content: str, info: str = "") -> str:
    """`content` as a Markdown code block whose fence is longer than any backtick run inside it, so a file that holds
    fences of its own (a README) can never close the block early."""
    import re

    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    marks = "`" * max(3, longest + 1)
    return f"{marks}{info}\n{content.rstrip(chr(10))}\n{marks}"


def format_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000))


def human_size(size: int) -> str:
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size}{unit}" if unit == "B" else f"{size:.0f}{unit}"
        size /= 1000  # type: ignore[assignment]
    return f"{size:.1f}GB"


USAGE_FIELDS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
USAGE_WORDS = {"input_tokens": "in", "output_tokens": "out", "cached_tokens": "cached", "reasoning_tokens": "reasoning"}


def format_usage(usage: Usage | dict) -> str:
    """Compact token counts, e.g. `in 1,204 · out 87 · cached 1,024`; unknown counts are left out."""
    get = usage.get if isinstance(usage, dict) else lambda name: getattr(usage, name)
    parts = [f"{USAGE_WORDS[name]} {get(name):,}" for name in USAGE_FIELDS if get(name) is not None]
    return " · ".join(parts)


def evidence_line(evidence: RecoveryEvidence) -> str:
    """How a recovered call's evidence reads under it (SPEC §9): `evidence: happened — notes.txt holds …`."""
    return f"evidence: {evidence.finding} — {evidence.detail}"


def render_session(events: list[AnyEvent], repair_from: int | None = None) -> str:
    """A readable transcript. Events at index >= repair_from are marked as added by repair (not yet written).
    Reasoning is shown indented under `┆`, each answer's token usage after it, and the session's totals at the end.
    Evidence Cairn gathered about a recovered call (`recovery/evidence`, written after the repaired turn's end) is
    shown under that call's result. A verdict a later verdict on the same call supersedes (SPEC §11) is marked so,
    with the seq of the one after it (the model is told only the newest). The result still holds whatever the log
    holds: print it through `safe_text`."""
    out: list[str] = []
    names: dict[str, str] = {}
    evidence = {e.call_id: e for e in events if isinstance(e, RecoveryEvidence)}
    superseded = superseded_verdicts(events)
    ran = {e.turn for e in events if isinstance(e, OperatorResult)}  # operator commands with an outcome
    for i, e in enumerate(events):
        mark = "  [repair]" if repair_from is not None and i >= repair_from else ""
        if isinstance(e, TurnStart):
            out.append(f"── turn {e.turn} ──")
        elif isinstance(e, UserMessage):
            out.append(f"> {e.text}")
            if e.attachments:  # `@path` files sent with the prompt: named, never printed (their text is in the log)
                out.append(f"  {attachments_line(e.attachments)}")
        elif isinstance(e, AssistantMessage):
            flag = " (interrupted)" if e.interrupted else ""
            if e.reasoning:
                out.extend(f"  ┆ {line}" for line in e.reasoning.strip().splitlines())
            if e.text:
                out.append(e.text.rstrip() + flag)
            elif e.interrupted:
                out.append("(interrupted before any text)")
            for c in e.tool_calls:
                names[c.call_id] = c.name
            if e.finish_reason not in (None, "stop", "tool_calls"):
                out.append(f"  (answer ended: {e.finish_reason})")
            if e.usage is not None and format_usage(e.usage):
                out.append(f"  [tokens: {format_usage(e.usage)}]")
        elif isinstance(e, RequestRetry):
            out.append(f"  ↻ retry, attempt {e.attempt} after {e.reason} (waited {e.delay_ms / 1000:.1f} s)")
        elif isinstance(e, ToolCall):
            names[e.call_id] = e.name
            nested = f" (nested in {e.parent_call_id})" if e.parent_call_id else ""
            out.append(f"  → {e.name}({summarize_arguments(e.arguments)}) [{e.safety}] {e.call_id}{nested}")
        elif isinstance(e, ApprovalDecided):
            scope = f" ({e.scope})" if e.scope else ""
            out.append(f"  ? approval for {e.call_id}: {e.decision}{scope}")
        elif isinstance(e, ToolResult):
            name = names.get(e.call_id, "tool")
            out.append(f"  ← {name} {e.call_id}: {result_status(e)} — {first_line(e.content)}{mark}")
            if e.call_id in evidence:
                out.append(f"    {evidence_line(evidence[e.call_id])}")
        elif isinstance(e, RecoveryVerdict):
            note = f" ({e.note})" if e.note else ""
            later = superseded.get(e.seq)
            if later is not None:
                out.append(f"  ✓ verdict on {e.call_id}: {e.verdict}{note} [superseded by the verdict at seq {later}]")
            else:
                out.append(f"  ✓ verdict on {e.call_id}: {e.verdict}{note}")
        elif isinstance(e, TurnEnd):
            err = f": {e.error.code} {e.error.message}" if e.error else ""
            out.append(f"── turn {e.turn} {e.reason}{err} ──{mark}")
        elif isinstance(e, ContextCompaction):
            carried = f"; {len(e.carried)} recovery fact(s) carried verbatim" if e.carried else ""
            out.append(f"  ⋯ context compacted: events through seq {e.through_seq} summarised{carried}")
        elif isinstance(e, (ContextInstructions, ContextEnvironment)):  # what the system prompt told from here on
            from .agent.project_context import context_line

            out.append(f"  ≡ {context_line(e)}")
        elif isinstance(e, (OperatorCommand, OperatorResult)):
            out.append(operator_line(e, e.turn in ran))
        elif isinstance(e, ConversationRewind):
            restored = f"; files restored: {', '.join(e.files)}" if e.files else ""
            out.append(f"  ⟲ rewound: the conversation continues from before turn {e.to_turn}{restored}")
        elif isinstance(e, IgnorableEvent):
            out.append(f"  (ignored event {e.type})")
    # chunks of a step that never got its assistant/message (crash mid-stream) are still worth seeing
    thinking = _dangling_chunks(events, ReasoningChunk)
    if thinking:
        out.append(f"(partial reasoning before the crash: {thinking!r})")
    dangling = _dangling_chunks(events, AssistantChunk)
    if dangling:
        out.append(f"(partial answer before the crash: {dangling!r})")
    answers = sum(1 for e in events if isinstance(e, AssistantMessage) and e.usage is not None)
    if answers:
        totals = format_usage(usage_totals(events, USAGE_FIELDS))
        out.append(f"── session tokens: {totals} over {answers} answer{'s' if answers != 1 else ''} ──")
    return "\n".join(out)


def operator_line(event: OperatorCommand | OperatorResult, answered: bool = True) -> str:
    """How the operator's own `!command` and its result read in `cairn show` (a command without a result: Cairn
    stopped while it ran)."""
    if isinstance(event, OperatorCommand):
        unknown = "" if answered else "  — outcome unknown (Cairn stopped while it ran)"
        return f"  ! {event.command}  (the operator's shell command){unknown}"
    status = f"exit code {event.exit_code}" if event.exit_code is not None else "did not finish"
    return f"  ⇐ {status} — {first_line(event.output)}"


def _dangling_chunks(events: list[AnyEvent], kind: type[AssistantChunk | ReasoningChunk]) -> str:
    parts: list[str] = []
    for e in events:
        if isinstance(e, kind):
            parts.append(e.delta)
        elif isinstance(e, AssistantMessage):
            parts = []
    return "".join(parts)
