"""What the session inspector shows, without Textual: rows, marks, filters, search and jumps over a session's events.

Built to open 100k events in well under a second: opening makes one cheap pass over the events (turn starts and the
blocks repair wrote); everything a row shows (kind, barrier, times, summary) is computed only for the rows on screen.

Marks are derived from the log alone, so they say where the policy *places* a barrier (SPEC §2's order), not whether
one succeeded:

- pre-step after `user/message` (step 1) or `step/start` (later steps), pre-request after `request/header` and after
  each `request/retry` (a retried request passes the barrier again), pre-tool after a top-level `tool/call` and after
  an `operator/command` (the operator's `!command`, durable before it starts), turn-end after `turn/end`;
- repair: the events repair appended. Not yet written (a crashed session nobody resumed): `Inspection.repair`.
  Already written: a block of results / `step/end` / `turn/end interrupted` that `repair_interrupted_turn` reproduces
  byte for byte from the events before it (repair is deterministic, and only repair ends a turn `interrupted`);
- "the log ended here": the last event written before each crash (the event just before a repair block).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from cairn.persistence.events import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ContextEnvironment,
    ContextInstructions,
    ConversationRewind,
    IgnorableEvent,
    OperatorCommand,
    OperatorResult,
    ReasoningChunk,
    RecoveryEvidence,
    RecoveryVerdict,
    RequestHeader,
    SessionMode,
    RequestRetry,
    RewindEnd,
    RewindPlan,
    RewindStep,
    StepEnd,
    StepStart,
    ToolCall,
    ToolProgress,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    encode_event,
    event_type,
    to_builtins,
)
from cairn.persistence.repair import repair_interrupted_turn

from ..render import first_line, format_usage, result_status, summarize_arguments, superseded_verdicts

RECOVERED_CODES = (TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN)
KINDS = ("boundary", "prompt", "request", "tool", "result", "error", "recovery", "other")

# A display line is an event index (>= 0) or a separator: -1 - k, k indexing `View.separators`.
Separator = tuple[str, str]  # (what: "turn" | "crash" | "torn", text)


def kind_of(event: AnyEvent, repaired: bool = False) -> str:
    """The colour family of an event: request, tool, result, error, recovery (plus boundary, prompt, other)."""
    if repaired or isinstance(event, (RecoveryVerdict, RecoveryEvidence)):
        return "recovery"
    t = type(event)
    if isinstance(event, ToolResult):
        if event.error_code in RECOVERED_CODES:
            return "recovery"
        return "error" if event.is_error else "result"
    if isinstance(event, TurnEnd):
        reason = event.reason
        return "error" if reason == "error" else "recovery" if reason == "interrupted" else "boundary"
    if t in (TurnStart, StepStart, StepEnd):
        return "boundary"
    if t is UserMessage:
        return "prompt"
    if isinstance(event, AssistantMessage) and event.finish_reason in ("length", "content_filter"):
        return "error"
    if t is RequestRetry:
        return "error"
    if t in (RequestHeader, AssistantChunk, AssistantMessage, ReasoningChunk):
        return "request"
    if t in (ToolCall, ToolProgress, ApprovalAsked, ApprovalDecided, OperatorCommand):
        return "tool"
    if t is OperatorResult:
        return "result"
    return "other"


def format_delta(ms: int | None) -> str:
    """A gap between events in at most 6 characters: +0ms, +850ms, +1.2s, +42s, +3m04s, +42m, +2h05m."""
    if ms is None:
        return ""
    if ms < 0:
        return "-" + format_delta(-ms)[1:]
    if ms < 1000:
        return f"+{ms}ms"
    if ms < 10_000:
        return f"+{ms / 1000:.1f}s"
    s = ms // 1000
    if s < 60:
        return f"+{s}s"
    if s < 600:
        return f"+{s // 60}m{s % 60:02d}s"
    if s < 3600:
        return f"+{s // 60}m"
    if s < 36_000:
        return f"+{s // 3600}h{s % 3600 // 60:02d}m"
    if s < 360_000:
        return f"+{s // 3600}h"
    return f"+{s // 86400}d"


def summary_of(event: AnyEvent, width: int = 200) -> str:
    """One line saying what the event holds (raw: print it through safe_text)."""
    e: Any = event
    t = type(e)
    if t is TurnStart:
        return f"turn {e.turn} starts"
    if t is StepStart:
        return f"step {e.step} starts"
    if t is StepEnd:
        return f"step {e.step} ends"
    if t is UserMessage:
        return "> " + first_line(e.text, width)
    if t is RequestHeader:
        summary = f"{e.provider}/{e.model} · {e.message_count} messages · {len(e.tools)} tools"
        return summary if e.purpose == "turn" else f"{e.purpose} · {summary}"
    if t is RequestRetry:
        return f"attempt {e.attempt} after {e.reason}, waited {e.delay_ms / 1000:.1f} s"
    if t in (AssistantChunk, ReasoningChunk):
        prefix = "┆ " if t is ReasoningChunk else ""
        return prefix + json.dumps(e.delta, ensure_ascii=False)[1:-1][:width]
    if t is AssistantMessage:
        parts = [first_line(e.text, width) if e.text else ("(interrupted)" if e.interrupted else "(no text)")]
        if e.tool_calls:
            parts.append(f"→ {len(e.tool_calls)} call{'s' if len(e.tool_calls) != 1 else ''}: "
                         + ", ".join(c.name for c in e.tool_calls))
        if e.finish_reason not in (None, "stop", "tool_calls"):
            parts.append(f"finish: {e.finish_reason}")
        if e.usage is not None and format_usage(e.usage):
            parts.append(f"tokens {format_usage(e.usage)}")
        return " · ".join(parts)
    if t is ApprovalAsked:
        return "approval asked"
    if t is ApprovalDecided:
        return f"approval: {e.decision}" + (f" ({e.scope})" if e.scope else "")
    if t is ToolCall:
        nested = f" (nested in {e.parent_call_id})" if e.parent_call_id else ""
        return f"{e.name}({summarize_arguments(e.arguments, width)}) [{e.safety}]{nested}"
    if t is ToolProgress:
        return f"process started, pid {e.pid}"
    if t is ToolResult:
        content = e.content
        if e.error_code and content.startswith(e.error_code + ": "):
            content = content[len(e.error_code) + 2:]  # said once is enough
        return f"{result_status(e)} — {first_line(content, width)}"
    if t is RecoveryVerdict:
        return f"verdict: {e.verdict}" + (f" ({first_line(e.note, width)})" if e.note else "")
    if t is RecoveryEvidence:
        return f"evidence on {e.call_id}: {e.finding} — {first_line(e.detail, width)}"
    if t is ConversationRewind:
        restored = f" · files restored: {', '.join(e.files)}" if e.files else ""
        return f"conversation continues from before turn {e.to_turn}{restored}"
    if t is RewindPlan:
        commands = f" · commands ran in {', '.join(map(str, e.commands_in))}" if e.commands_in else ""
        what = " + conversation" if e.conversation else ""
        return f"rewind {e.rewind_id} to before turn {e.to_turn}: {len(e.files)} file(s){what}{commands}"
    if t is RewindStep:
        return f"rewind {e.rewind_id}: {e.path} {e.outcome}" + (f" ({first_line(e.detail, width)})" if e.detail else "")
    if t is RewindEnd:
        return f"rewind {e.rewind_id} {e.outcome}"
    if t is TurnEnd:
        error = f": {e.error.code} {first_line(e.error.message, width)}" if e.error else ""
        return f"turn {e.turn} {e.reason}{error}"
    if t is IgnorableEvent:
        return f"(ignorable) {', '.join(sorted(e.fields))}"
    if t is SessionMode:
        return f"approval mode: {e.mode}"
    if t is OperatorCommand:
        return "! " + first_line(e.command, width)
    if t is OperatorResult:
        status = "stopped" if e.exit_code is None else f"exit {e.exit_code}"
        return f"{status} — {first_line(e.output, width)}" if e.output else status
    if t is ContextInstructions:
        files = ", ".join(f.path for f in e.files) or "none"
        return f"instructions: {files}" + (f" · {first_line(e.notices[0], width)}" if e.notices else "")
    if t is ContextEnvironment:
        return "environment: " + " · ".join(line.strip("- ") for line in e.text.splitlines() if line.strip())[:width]
    return ""


def turn_step_of(event: AnyEvent) -> str:
    turn = getattr(event, "turn", None)
    if turn is None:
        return ""
    step = getattr(event, "step", None)
    return f"{turn}.{step}" if step is not None else str(turn)


def detail_json(event: AnyEvent) -> str:
    """The event's full JSON as stored, pretty-printed (raw: print it through safe_text)."""
    return json.dumps(to_builtins(event), indent=2, ensure_ascii=False)


@dataclass
class Filter:
    """Space-separated terms; values of one key are alternatives, different keys must all hold.
    `type:tool` (a type or its prefix), `turn:3`, `call:ID` (part of a call id), `kind:error`; a bare word matches a
    type prefix or part of a call id."""

    types: list[str] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.types or self.turns or self.calls or self.kinds or self.words)


class FilterError(ValueError):
    pass


def parse_filter(text: str) -> Filter:
    """Raises FilterError with one readable line for a term it cannot use."""
    f = Filter()
    for term in text.split():
        key, sep, value = term.partition(":")
        if not sep:
            f.words.append(term.lower())
            continue
        if not value:
            raise FilterError(f"{term!r} needs a value after the colon")
        key = key.lower()
        if key == "type":
            f.types.append(value.lower())
        elif key == "turn":
            if not value.isdigit():
                raise FilterError(f"turn must be a number, not {value!r}")
            f.turns.append(int(value))
        elif key in ("call", "call_id"):
            f.calls.append(value)
        elif key == "kind":
            if value.lower() not in KINDS:
                raise FilterError(f"kind is one of {', '.join(KINDS)}; not {value!r}")
            f.kinds.append(value.lower())
        else:
            raise FilterError(f"unknown filter {key!r}: use type:, turn:, call: or kind:")
    return f


@dataclass
class View:
    """The rows on screen after a filter: event indices, plus separator lines between them."""

    indices: list[int]
    lines: list[int]
    separators: list[Separator]
    rows: list[int]  # the line of each of `indices`

    def line_of(self, index: int) -> int:
        """The line of event `index`, or of the first shown event after it (the last line if none)."""
        p = bisect.bisect_left(self.indices, index)
        if p >= len(self.rows):
            return max(len(self.lines) - 1, 0)
        return self.rows[p]


class InspectorModel:
    """A session's events as the inspector shows them. `stored` is what is on disk; `pending` what repair would
    append (empty for a live session); `live_pid` the writer's pid when another process holds the session."""

    def __init__(self, session_id: str, stored: list[AnyEvent], pending: list[AnyEvent] | None = None,
                 live_pid: int | None = None, torn_bytes: int = 0, backend: str = "", cwd: str | None = None) -> None:
        self.session_id = session_id
        self.cwd = cwd  # the session's workspace: where repair's evidence (SPEC §9) is gathered when following
        self.backend = backend
        self.stored: list[AnyEvent] = list(stored)
        self.pending: list[AnyEvent] = list(pending or [])
        self.events: list[AnyEvent] = self.stored + self.pending
        self.live_pid = live_pid
        self.torn_bytes = torn_bytes
        self.following = False
        self.turn_starts: list[int] = []  # indices of turn/start events
        self.repair_blocks: list[tuple[int, int]] = []  # [start, end) of events repair wrote (or would write)
        self._evidence: dict[str, RecoveryEvidence] = {}
        self._evidence_seen = -1  # len(events) when _evidence was built (rebuilt lazily, only for recovered rows)
        self._superseded: dict[int, int] = {}  # seq of a verdict a later one on its call supersedes -> that one's seq
        self._superseded_seen = -1  # len(events) when _superseded was built (lazily, only for verdict rows)
        self._scan(0)

    @classmethod
    def from_inspection(cls, session_id: str, inspection: Any, backend: str = "") -> "InspectorModel":
        header = getattr(inspection, "header", None)
        return cls(session_id, inspection.events, inspection.repair, inspection.live_pid, inspection.torn_bytes, backend,
                   getattr(header, "cwd", None))

    # -- building ---------------------------------------------------------------------------------------------------

    def _scan(self, start: int) -> None:
        """Record turn starts and committed repair blocks from `start` on (one pass, type checks only)."""
        events = self.stored
        for i in range(start, len(events)):
            t = type(events[i])
            if t is TurnStart:
                self.turn_starts.append(i)
            elif t is TurnEnd and events[i].reason == "interrupted":  # type: ignore[union-attr]
                block = self._committed_repair(i)
                if block is not None:
                    self.repair_blocks.append(block)
            elif (t is RecoveryEvidence and self.repair_blocks and self.repair_blocks[-1][1] == i
                  and events[i].time == events[i - 1].time):  # evidence that arrived after its repair block (--follow)
                self.repair_blocks[-1] = (self.repair_blocks[-1][0], i + 1)
        self._pending_block()

    def _pending_block(self) -> None:
        self.repair_blocks = [b for b in self.repair_blocks if b[1] <= len(self.stored)]
        if self.pending:
            self.repair_blocks.append((len(self.stored), len(self.events)))

    def _committed_repair(self, end: int) -> tuple[int, int] | None:
        """The block of stored events ending at the `turn/end interrupted` at `end` that repair wrote, if it did."""
        events = self.stored
        last = events[end]
        j = end
        while j > 0:
            prev = events[j - 1]
            if prev.time != last.time or not (
                type(prev) is StepEnd or (type(prev) is ToolResult and prev.error_code in RECOVERED_CODES)
            ):
                break
            j -= 1
        t = bisect.bisect_right(self.turn_starts, j - 1) - 1
        start = self.turn_starts[t] if t >= 0 else 0
        while j <= end:  # the shortest tail that repair reproduces exactly
            expected = repair_interrupted_turn(events[start:j])
            if len(expected) == end + 1 - j and all(
                encode_event(a) == encode_event(b) for a, b in zip(expected, events[j:end + 1])
            ):
                return (j, self._evidence_after(end))
            j += 1
        return None

    def _evidence_after(self, end: int) -> int:
        """The end of a committed repair block: the evidence repair appended after the turn's end (SPEC §9, the same
        time as the turn's end) belongs to it."""
        events = self.stored
        k = end + 1
        while k < len(events) and type(events[k]) is RecoveryEvidence and events[k].time == events[end].time:
            k += 1
        return k

    def extend(self, new: Iterable[AnyEvent]) -> int:
        """Append events read while following; returns how many arrived."""
        new = list(new)
        if not new:
            return 0
        first = len(self.stored)
        self.stored.extend(new)
        self.pending = []
        self.events = self.stored + self.pending
        self._evidence_seen = -1
        self._scan(first)
        return len(new)

    def set_pending(self, pending: list[AnyEvent]) -> None:
        """What repair would append now (the writer went away inside a turn), or [] (it is live, or it closed)."""
        self.pending = list(pending)
        self.events = self.stored + self.pending
        self._evidence_seen = -1
        self._pending_block()

    def recompute_pending(self) -> None:
        if self.live_pid is not None:
            self.set_pending([])
        elif self.cwd is not None:  # as `store.inspect` would: repair's events, then the evidence it would record
            from cairn.persistence.store import repair_with_evidence

            self.set_pending(repair_with_evidence(self.stored, self.cwd))
        else:
            self.set_pending(repair_interrupted_turn(self.stored))

    # -- per row (only for rows on screen) -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.events)

    def is_repair(self, i: int) -> bool:
        k = bisect.bisect_right(self.repair_blocks, (i, 1 << 62)) - 1
        return k >= 0 and self.repair_blocks[k][0] <= i < self.repair_blocks[k][1]

    def is_pending(self, i: int) -> bool:
        return i >= len(self.stored)

    def crash_ends(self) -> list[int]:
        """Index of the last event written before each crash (the event just before a repair block)."""
        return [start - 1 for start, _ in self.repair_blocks if start > 0]

    def kind(self, i: int) -> str:
        return kind_of(self.events[i], self.is_repair(i))

    def barrier(self, i: int) -> str | None:
        """Which barrier the policy places right after event i (SPEC §2), if any; none after repair's events."""
        if self.is_repair(i):
            return None
        e: Any = self.events[i]
        t = type(e)
        if t is UserMessage:
            return "pre-step"
        if t is StepStart:  # step 1's barrier comes after its prompt
            nxt = self.events[i + 1] if i + 1 < len(self.events) else None
            return None if type(nxt) is UserMessage else "pre-step"
        if t in (RequestHeader, RequestRetry):
            return "pre-request"
        if t is ToolCall:
            return "pre-tool" if e.parent_call_id is None else None
        if t is OperatorCommand:  # the operator's own command is durable before it starts, like a tool body
            return "pre-tool"
        if t is TurnEnd:
            return "turn-end"
        return None

    def since_prev(self, i: int) -> int | None:
        return None if i == 0 else self.events[i].time - self.events[i - 1].time

    def turn_start_of(self, i: int) -> int | None:
        if getattr(self.events[i], "turn", None) is None:
            return None
        k = bisect.bisect_right(self.turn_starts, i) - 1
        return self.turn_starts[k] if k >= 0 else None

    def since_turn(self, i: int) -> int | None:
        start = self.turn_start_of(i)
        return None if start is None else self.events[i].time - self.events[start].time

    def type_of(self, i: int) -> str:
        return event_type(self.events[i])

    def call_id(self, i: int) -> str:
        return getattr(self.events[i], "call_id", None) or ""

    def turn_step(self, i: int) -> str:
        return turn_step_of(self.events[i])

    def summary(self, i: int, width: int = 200) -> str:
        """A recovered call's result names the evidence Cairn gathered about it (the `recovery/evidence` row itself
        comes after the repaired turn's end)."""
        e = self.events[i]
        text = summary_of(e, width)
        if type(e) is ToolResult and e.error_code in RECOVERED_CODES:
            found = self.evidence_for(e.call_id)
            if found is not None:
                text += f" · evidence: {found.finding}"
        elif type(e) is RecoveryVerdict:  # SPEC §11: a later verdict on the call supersedes this one
            later = self.superseded_by(e.seq)
            if later is not None:
                text += f" · superseded by seq {later}"
        return text

    def superseded_by(self, seq: int) -> int | None:
        """The seq of the verdict that supersedes the verdict at `seq` (a later one on the same call), if any."""
        if self._superseded_seen != len(self.events):
            self._superseded = superseded_verdicts(self.events)
            self._superseded_seen = len(self.events)
        return self._superseded.get(seq)

    def evidence_for(self, call_id: str) -> RecoveryEvidence | None:
        """The latest evidence recorded (or that repair would record) about `call_id`."""
        if self._evidence_seen != len(self.events):
            self._evidence = {e.call_id: e for e in self.events if type(e) is RecoveryEvidence}
            self._evidence_seen = len(self.events)
        return self._evidence.get(call_id)

    def detail(self, i: int) -> str:
        return detail_json(self.events[i])

    def is_error(self, i: int) -> bool:
        return self.kind(i) == "error"

    def is_recovered_call(self, i: int) -> bool:
        e = self.events[i]
        return type(e) is ToolResult and e.error_code in RECOVERED_CODES

    # -- views ------------------------------------------------------------------------------------------------------

    def matches(self, i: int, f: Filter) -> bool:
        e: Any = self.events[i]
        kind = event_type(e)
        if f.types and not any(kind == t or kind.startswith(t.rstrip("/") + "/") for t in f.types):
            return False
        if f.turns and getattr(e, "turn", None) not in f.turns:
            return False
        call = getattr(e, "call_id", None) or ""
        if f.calls and not any(c in call for c in f.calls):
            return False
        if f.kinds and self.kind(i) not in f.kinds:
            return False
        if f.words and not all(kind.startswith(w) or (call and w in call.lower()) for w in f.words):
            return False
        return True

    def view(self, f: Filter | None = None) -> View:
        if f is None or f.empty:
            indices = list(range(len(self.events)))
        else:
            indices = [i for i in range(len(self.events)) if self.matches(i, f)]
        return View(indices, *self._lines(indices))

    def _lines(self, indices: list[int]) -> tuple[list[int], list[Separator], list[int]]:
        """Separators go before the first shown row at or after each boundary: a turn's start, a crash."""
        marks: list[tuple[int, Separator]] = [
            (i, ("turn", f"turn {self.events[i].turn}")) for i in self.turn_starts  # type: ignore[union-attr]
        ]
        for start, _ in self.repair_blocks:
            pending = start >= len(self.stored)
            text = ("the log ended here (crash or kill) — repair would append these when the session is resumed"
                    if pending else "the log ended here (crash or kill) — repair appended these when it was resumed")
            marks.append((start, ("crash", text)))
        if self.torn_bytes and self.live_pid is None:
            marks.append((len(self.stored), ("torn", f"{self.torn_bytes} bytes of a torn last line are not shown "
                                                       "(resuming copies them aside and cuts them)")))
        marks.sort(key=lambda m: (m[0], m[1][0] != "torn", m[1][0] != "crash"))
        if not marks:
            return list(indices), [], list(range(len(indices)))
        lines: list[int] = []
        separators: list[Separator] = []
        rows: list[int] = []
        m = 0
        for i in indices:
            while m < len(marks) and marks[m][0] <= i:
                if marks[m][1][0] == "turn" and lines and lines[-1] < 0 and separators[-1][0] == "turn":
                    lines.pop()  # a turn none of whose events is shown: no rule for it
                    separators.pop()
                separators.append(marks[m][1])
                lines.append(-len(separators))
                m += 1
            rows.append(len(lines))
            lines.append(i)
        for position, separator in marks[m:]:
            if position >= len(self.events):  # after the last event: the torn tail of a log repair leaves alone
                separators.append(separator)
                lines.append(-len(separators))
        return lines, separators, rows

    # -- moving around ------------------------------------------------------------------------------------------------

    def next_where(self, indices: list[int], position: int, predicate, direction: int = 1) -> int | None:
        """Position in `indices` of the next row (after `position`, wrapping) for which predicate(event index) holds."""
        n = len(indices)
        for step in range(1, n + 1):
            p = (position + direction * step) % n
            if predicate(indices[p]):
                return p
        return None

    def search_predicate(self, text: str):
        needle = text.lower()

        def found(i: int) -> bool:
            return needle in encode_event(self.events[i]).decode("utf-8", "replace").lower() or needle in self.summary(
                i).lower()

        return found

    # -- state ------------------------------------------------------------------------------------------------------

    def open_turn(self) -> bool:
        for e in reversed(self.stored):
            if type(e) is TurnEnd:
                return False
            if type(e) is TurnStart:
                return True
        return False

    def state(self) -> str:
        """live (another process is in a turn), idle (it holds the session between turns), ended (no one holds it)."""
        if self.live_pid is not None:
            return "live" if self.open_turn() else "idle"
        return "ended"
