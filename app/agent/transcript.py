"""Derive the model-visible conversation (OpenAI chat messages) from the session log, incrementally.

Fed every event once as it is appended (or loaded), so building a request is O(new events), never O(session).
What the model sees: user prompts, finished (or interrupted) assistant messages with their tool calls, the result of
every top-level call (repair's synthetic results included), operator verdicts on OUTCOME_UNKNOWN calls, and the
operator's own `!command`s with their output (operator_command.py).

The log keeps exactly what happened; this conversation is normalised so that the strictest servers accept it
(SPEC §7 "A session is always continuable"):
- consecutive user content (a prompt whose turn produced no answer, verdict notes, the next prompt) becomes one user
  message, parts joined by a blank line;
- an answer with neither text nor tool calls (empty, or interrupted before any text) is left out;
- results are paired with calls by `source_seq` (the `tool/call` they answer) or, when that is null (not started,
  denied, unknown tool, truncated), by position among the open calls with that id; a call without any result still
  gets a tool message, in the model's order, before the next non-tool message;
- arguments that are not a JSON object are sent as `{}` (the call's result already says what was wrong);
- an id already used earlier in the conversation (an old log from a provider that repeats ids) is renamed
  `<id>-dup`, `<id>-dup#2`, … like the loop does for new answers, and its result follows it;
- `reasoning_content` rides on the current turn's assistant messages with tool calls (DeepSeek thinking mode wants it
  back there), with `reasoning_meta` when the provider gave one (Anthropic's thinking signatures; the anthropic
  provider turns both into signed thinking blocks), and both are dropped from older turns;
- nested calls (with `parent_call_id`) stay inside their parent's result, and messages before the first user content
  (a log that starts mid-way) are dropped rather than inventing a prompt;
- a `context/compaction` replaces everything up to its `through_seq` with its summary (and the recovery facts it
  carries) as user content; the events after `through_seq` are derived again from the log (`source`) after it;
- a later `recovery/verdict` on a call supersedes the earlier one (SPEC §11 rev 4): the model is told only the current
  verdict, with its note. The earlier verdict's paragraph is taken out of the user message that held it (the verdict
  carried by a compaction's summary too), so the request carries exactly one recovery paragraph per call. The log
  keeps every verdict; which ones are superseded is derived from it (`render.superseded_verdicts`), not written:
  newest wins.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from cairn.persistence.events import (
    AnyEvent,
    AssistantMessage,
    ContextCompaction,
    ConversationRewind,
    OperatorCommand,
    OperatorResult,
    RecoveryEvidence,
    RecoveryVerdict,
    RewindEnd,
    RewindPlan,
    RewindStep,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)

from .mentions import user_content

VERDICT_WORDS = {
    "happened": "it DID take effect",
    "did_not_happen": "it did NOT take effect",
    "unknown": "it is still unknown whether it took effect",
}
NO_RESULT = (
    "No result was recorded for this call, so it is unknown whether it ran. Verify the current state before "
    "repeating it."
)
EMPTY_RESULT = "(no output)"
EMPTY_PROMPT = "(empty message)"


def verdict_text(event: RecoveryVerdict, shown: str, name: str) -> str:
    """The recovery paragraph the model is told for an operator's verdict (its note kept with it)."""
    note = f" Operator's note: {event.note}" if event.note else ""
    return (f"[Cairn recovery] The operator checked the interrupted call {shown} "
            f"(`{name}`): {VERDICT_WORDS[event.verdict]}.{note}")


def arguments_text(arguments: Any) -> str:
    """What the model gets back as its call's arguments: always a JSON object string."""
    return json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else "{}"


class _Slot:
    """One tool call of the open answer: its log id, the id the model sees, and its result once paired."""

    __slots__ = ("log_id", "shown_id", "recorded", "content")

    def __init__(self, log_id: str, shown_id: str) -> None:
        self.log_id = log_id
        self.shown_id = shown_id
        self.recorded = False  # a top-level tool/call was paired with it
        self.content: str | None = None


class Transcript:
    def __init__(self, source: list[AnyEvent] | None = None) -> None:
        """`source`: the session's event list (by reference), read again only when a compaction is added."""
        self._source = source if source is not None else []
        self.messages: list[dict[str, Any]] = []
        self._user_parts: list[str] | None = None  # parts of messages[-1] while it is a user message
        self._slots: list[_Slot] = []  # calls of the latest answer, in the model's order
        self._emitted = 0  # how many of them already have their tool message
        self._by_seq: dict[int, _Slot] = {}  # seq of a top-level tool/call -> its slot
        self._nested: set[int] = set()  # seqs of the nested tool/calls made while answering the latest answer
        self._used_ids: set[str] = set()  # every tool-call id shown to the model so far
        self._reasoned: list[dict[str, Any]] = []  # this turn's messages carrying reasoning_content
        self._names: dict[str, str] = {}  # log call_id -> tool name, for verdict texts
        self._shown: dict[str, str] = {}  # log call_id -> the id the model saw (latest use)
        # log call_id -> where its current verdict's paragraph sits (message, its parts, index): a later verdict
        # takes it out (the model is told only the current verdict)
        self._verdict_at: dict[str, tuple[dict[str, Any], list[str], int]] = {}
        # the compaction whose summary is the first user content, and where it sits, while it carries verdicts
        self._summary: tuple[ContextCompaction, dict[str, Any], list[str], int] | None = None
        # the latest operator command's paragraph (outcome unknown until its result replaces it) and where it sits
        self._operator_at: tuple[OperatorCommand, dict[str, Any], list[str], int] | None = None

    def add(self, event: AnyEvent) -> None:
        if isinstance(event, ToolResult):
            self._add_result(event)
        elif isinstance(event, ToolCall):
            self._add_call(event)
        elif isinstance(event, AssistantMessage):
            self._add_answer(event)
        elif isinstance(event, UserMessage):  # the prompt, then its `@path` files (mentions.user_content)
            self._add_user(user_content(event.text, event.attachments))
        elif isinstance(event, RecoveryVerdict):
            self._add_verdict(event)
        elif isinstance(event, RecoveryEvidence):
            name = self._names.get(event.call_id, "a tool")
            shown = self._shown.get(event.call_id, event.call_id)
            self._add_user(f"[Cairn recovery] Cairn checked the interrupted call {shown} (`{name}`): {event.detail}.")
        elif isinstance(event, ConversationRewind):
            self._rewind(event)
        elif isinstance(event, RewindEnd) and event.outcome == "completed":
            self._tell_rewound_files(event)
        elif isinstance(event, TurnStart):
            self._close_answer()
            for message in self._reasoned:
                message.pop("reasoning_content", None)
                message.pop("reasoning_meta", None)
            self._reasoned.clear()
        elif isinstance(event, (StepEnd, StepStart, TurnEnd)):
            self._close_answer()
        elif isinstance(event, ContextCompaction):
            self._compact(event)
        elif isinstance(event, (OperatorCommand, OperatorResult)):
            self._add_operator(event)

    def extend(self, events: list[AnyEvent]) -> None:
        for event in events:
            self.add(event)

    def _compact(self, event: ContextCompaction) -> None:
        from .compaction import summary_text

        source = self._source
        self.__init__(source)  # type: ignore[misc]
        for fact in event.carried:
            self._names[str(fact.get("call_id"))] = str(fact.get("name") or "a tool")
        self._add_user(summary_text(event))
        if any(fact.get("verdict") for fact in event.carried):
            self._summary = (event, self.messages[-1], self._user_parts or [], len(self._user_parts or []) - 1)
        for e in source:
            if event.through_seq < e.seq < event.seq:
                self.add(e)

    def _rewind(self, event: ConversationRewind) -> None:
        """The conversation continues from before turn `to_turn`: rebuilt from the events before that turn began
        (earlier rewinds and compactions among them apply as they did); the log keeps everything. An undo
        (`undo_of`) rebuilds from everything before it, as if the undone rewind's conversation/rewind were not there."""
        source = self._source
        if event.undo_of is not None:
            span = [e.seq for e in source if isinstance(e, (RewindPlan, RewindEnd)) and e.rewind_id == event.undo_of]
            first, last = (min(span), max(span)) if span else (-1, -1)
            self.__init__(source)  # type: ignore[misc]
            for e in source:
                if e.seq >= event.seq:
                    break
                if not (isinstance(e, ConversationRewind) and first < e.seq < last):
                    self.add(e)
            return
        cut = next((e.seq for e in source if isinstance(e, TurnStart) and e.turn == event.to_turn), event.seq)
        self.__init__(source)  # type: ignore[misc]
        for e in source:
            if e.seq >= cut:
                break
            self.add(e)

    def _tell_rewound_files(self, event: RewindEnd) -> None:
        """Tell the model which files went back, so it does not assume its earlier edits are still there."""
        plan = next((e for e in reversed(self._source) if isinstance(e, RewindPlan) and e.rewind_id == event.rewind_id
                     and e.seq < event.seq), None)
        if plan is None:
            return
        restored = {e.path for e in self._source if isinstance(e, RewindStep) and e.rewind_id == event.rewind_id
                    and e.outcome == "done"}
        files = [f for f in plan.files if f.path in restored]
        if not files:
            return
        if plan.undo_of is not None:
            listed = ", ".join(f.path for f in files)
            self._add_user(f"[Cairn] The operator undid the last rewind: {listed} are back as they were before it; "
                           "read them again before relying on them.")
            return
        listed = ", ".join(f"{f.path} ({'restored' if f.restore_sha256 else 'deleted: it did not exist then'})"
                           for f in files)
        self._add_user(f"[Cairn] The operator rewound files to how they were before turn {plan.to_turn}: {listed}. "
                       "Changes made to them from that turn on are undone; read them again before relying on them.")

    def _add_operator(self, event: OperatorCommand | OperatorResult) -> None:
        """The operator's `!command` as user content: said at once with its outcome unknown (a crash may follow),
        then said again in place with its result."""
        from .operator_text import operator_text

        if isinstance(event, OperatorCommand):
            self._add_user(operator_text(event, None))
            parts = self._user_parts or []
            self._operator_at = (event, self.messages[-1], parts, len(parts) - 1)
        elif self._operator_at is not None and self._operator_at[0].turn == event.turn:
            command, message, parts, index = self._operator_at
            parts[index] = operator_text(command, event)
            self._set_user_content(message, parts)
            self._operator_at = None

    def _add_verdict(self, event: RecoveryVerdict) -> None:
        """The current verdict on a call: an earlier one's paragraph (or the verdict a compaction carried) is taken
        out of what the model is told, and this one is said where it was recorded."""
        earlier = self._verdict_at.pop(event.call_id, None)
        if earlier is not None:
            message, parts, index = earlier
            parts[index] = ""
            self._set_user_content(message, parts)
        if self._summary is not None:
            self._drop_carried_verdict(event.call_id)
        name = self._names.get(event.call_id, "a tool")
        shown = self._shown.get(event.call_id, event.call_id)
        self._add_user(verdict_text(event, shown, name))
        if self._user_parts is not None:
            self._verdict_at[event.call_id] = (self.messages[-1], self._user_parts, len(self._user_parts) - 1)

    def _drop_carried_verdict(self, call_id: str) -> None:
        """A verdict after a compaction supersedes the one its summary carried for that call: the summary is said
        again without it (the call itself stays carried, verbatim)."""
        assert self._summary is not None
        compaction, message, parts, index = self._summary
        if not any(str(f.get("call_id")) == call_id and f.get("verdict") for f in compaction.carried):
            return
        from .compaction import summary_text

        carried = [dict(f, verdict=None, note="") if str(f.get("call_id")) == call_id else f
                   for f in compaction.carried]
        compaction = msgspec.structs.replace(compaction, carried=carried)
        self._summary = (compaction, message, parts, index)
        if 0 <= index < len(parts):
            parts[index] = summary_text(compaction)
            self._set_user_content(message, parts)

    # -- messages ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _set_user_content(message: dict[str, Any], parts: list[str]) -> None:
        message["content"] = "\n\n".join(part for part in parts if part) or EMPTY_PROMPT

    def _append(self, message: dict[str, Any]) -> None:
        self._user_parts = None
        self.messages.append(message)

    def _add_user(self, text: str) -> None:
        self._close_answer()
        if self._user_parts is None:
            self._append({"role": "user", "content": ""})
            self._user_parts = []
        if text:
            self._user_parts.append(text)
        self._set_user_content(self.messages[-1], self._user_parts)

    def _add_answer(self, event: AssistantMessage) -> None:
        self._close_answer()
        if not self.messages:
            return  # the log starts mid-way: no prompt to answer, and none is invented
        if not event.text and not event.tool_calls:
            return
        last = self.messages[-1]
        if last["role"] == "assistant":  # two answers in a row: one message, so roles still alternate
            message = last
            if event.text:
                message["content"] = f"{message['content']}\n\n{event.text}" if message["content"] else event.text
        else:
            message = {"role": "assistant", "content": event.text or None}
            self._append(message)
        if not event.tool_calls:
            return
        calls = []
        for position, c in enumerate(event.tool_calls):
            base = c.call_id if isinstance(c.call_id, str) and c.call_id else f"call_{event.turn}_{event.step}_{position}"
            shown, n = base, 1
            while shown in self._used_ids:
                shown = f"{base}-dup" if n == 1 else f"{base}-dup#{n}"
                n += 1
            self._used_ids.add(shown)
            self._slots.append(_Slot(c.call_id, shown))
            self._names[c.call_id] = c.name
            self._shown[c.call_id] = shown
            calls.append(
                {"id": shown, "type": "function", "function": {"name": c.name, "arguments": arguments_text(c.arguments)}}
            )
        message["tool_calls"] = calls
        if event.reasoning:
            message["reasoning_content"] = event.reasoning
            if event.reasoning_meta:  # e.g. Anthropic thinking signatures, which must go back with the reasoning
                message["reasoning_meta"] = event.reasoning_meta
            self._reasoned.append(message)

    # -- pairing ----------------------------------------------------------------------------------------------------

    def _add_call(self, event: ToolCall) -> None:
        if event.parent_call_id is not None:
            self._nested.add(event.seq)  # nested: part of its parent's result, not of the conversation
            return
        for slot in self._slots:
            if slot.log_id == event.call_id and not slot.recorded and slot.content is None:
                slot.recorded = True
                self._by_seq[event.seq] = slot
                return

    def _add_result(self, event: ToolResult) -> None:
        if event.source_seq in self._nested:
            return
        slot: _Slot | None
        if event.source_seq is not None and event.source_seq in self._by_seq:
            slot = self._by_seq[event.source_seq]
        else:  # no tool/call behind it (not started, denied, unknown tool, truncated): the first open call of that id
            candidates = [s for s in self._slots if s.log_id == event.call_id and s.content is None]
            slot = next((s for s in candidates if not s.recorded), candidates[0] if candidates else None)
        if slot is None or slot.content is not None:
            return
        slot.content = event.content or EMPTY_RESULT
        while self._emitted < len(self._slots) and self._slots[self._emitted].content is not None:
            self._emit(self._slots[self._emitted])

    def _emit(self, slot: _Slot) -> None:
        self._append({"role": "tool", "tool_call_id": slot.shown_id, "content": slot.content or NO_RESULT})
        self._emitted += 1

    def _close_answer(self) -> None:
        """Every call of the latest answer gets its tool message before anything else is said."""
        if not self._slots:
            return
        while self._emitted < len(self._slots):
            self._emit(self._slots[self._emitted])
        self._slots, self._emitted, self._by_seq, self._nested = [], 0, {}, set()
