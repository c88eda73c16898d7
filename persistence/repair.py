"""Crash repair (SPEC §4): from a log that ends inside a turn, the events that close it honestly.

A pure function of the loaded events, so the same log always repairs to the same bytes: every tool call of the open
step without a result gets one (NOT_STARTED when no `tool/call` was recorded, OUTCOME_UNKNOWN otherwise), then
`step/end` if a step is open, then `turn/end` with reason `interrupted`. New events continue `seq` and reuse the last
event's `time`.

Calls are paired with their `tool/call` and result by position and `source_seq`, never by id alone: an old log may hold
an id the model repeated within one answer or reused from an earlier one, and each of those calls is still one call.
"""

from __future__ import annotations

from .events import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    AssistantMessage,
    RecoveryVerdict,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
)

SAFETY_ADVICE = {
    "read_only": "It is read-only, so retrying it is safe.",
    "idempotent": "It is idempotent (running it again with the same arguments has the same effect), so retrying is safe.",
    "side_effecting": (
        "It is side-effecting: do NOT retry it blindly. First verify the external state (or ask the user) to learn "
        "whether it took effect."
    ),
}


def not_started_text(name: str) -> str:
    return (
        f"TOOL_NOT_STARTED: Cairn stopped (crash or kill) before this call to `{name}` began, so it did not run. "
        "Retry it if it is still needed."
    )


def outcome_unknown_text(name: str, safety: str) -> str:
    return (
        f"TOOL_OUTCOME_UNKNOWN: Cairn stopped (crash or kill) while this call to `{name}` was running, so it may or may "
        f"not have taken effect. {SAFETY_ADVICE.get(safety, SAFETY_ADVICE['side_effecting'])}"
    )


def repair_interrupted_turn(events: list[AnyEvent]) -> list[AnyEvent]:
    """The closing events for `events`, or [] when the log does not end inside a turn."""
    turn_start = None
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if isinstance(e, TurnEnd):
            return []
        if isinstance(e, TurnStart):
            turn_start = i
            break
    if turn_start is None:
        return []
    turn = events[turn_start]
    assert isinstance(turn, TurnStart)
    tail = events[turn_start:]

    open_step: StepStart | None = None
    slots: list[_Slot] = []  # the calls of the open step's answer, in the model's order
    recorded: dict[int, ToolCall] = {}  # seq -> every tool/call of the open step
    parent_of: dict[int, int | None] = {}  # seq of a nested tool/call -> seq of the call that made it
    answered: set[int] = set()  # seqs of the tool/calls that have a result
    for e in tail:
        if isinstance(e, StepStart):
            open_step, slots, recorded, parent_of, answered = e, [], {}, {}, set()
        elif isinstance(e, StepEnd):
            open_step = None
        elif isinstance(e, AssistantMessage):
            slots = [_Slot(request) for request in e.tool_calls]
        elif isinstance(e, ToolCall):
            recorded[e.seq] = e
            if e.parent_call_id is None:
                # the model's calls run in its order, so a recorded call is the first of its id not yet begun or answered
                slot = next((s for s in slots if s.request.call_id == e.call_id and s.call is None and not s.done), None)
                if slot is not None:
                    slot.call = e
            else:
                # a nested call is made by the running call of that id: the latest recorded one still without a result
                parent_of[e.seq] = next(
                    (seq for seq in reversed(recorded)
                     if seq != e.seq and recorded[seq].call_id == e.parent_call_id and seq not in answered),
                    None,
                )
        elif isinstance(e, ToolResult):
            if e.source_seq is not None and e.source_seq in recorded:
                answered.add(e.source_seq)
                slot = next((s for s in slots if s.call is not None and s.call.seq == e.source_seq), None)
            else:  # no tool/call behind it (not started, denied, unknown tool, truncated): first open call of that id
                open_ = [s for s in slots if s.request.call_id == e.call_id and not s.done]
                slot = next((s for s in open_ if s.call is None), open_[0] if open_ else None)
                if slot is not None and slot.call is not None:
                    answered.add(slot.call.seq)
            if slot is not None:
                slot.done = True

    last = events[-1]
    seq, time = last.seq + 1, last.time
    closing: list[AnyEvent] = []

    def add(event: AnyEvent) -> None:
        nonlocal seq
        event.seq, event.time = seq, time
        seq += 1
        closing.append(event)

    def close_nested(parent_seq: int) -> None:
        """Nested calls it made, at any depth, close before it does, innermost first."""
        for nested_seq, nested in recorded.items():
            if parent_of.get(nested_seq) == parent_seq and nested_seq not in answered:
                answered.add(nested_seq)  # before recursing, so a malformed parent cycle cannot loop forever
                close_nested(nested_seq)
                add(_unknown(nested))

    if open_step is not None:
        t, s = open_step.turn, open_step.step
        for slot in slots:
            if slot.done:
                continue
            if slot.call is None:
                request = slot.request
                add(
                    ToolResult(
                        turn=t, step=s, call_id=request.call_id, is_error=True,
                        content=not_started_text(request.name), error_code=TOOL_NOT_STARTED, source_seq=None,
                    )
                )
            else:
                answered.add(slot.call.seq)
                close_nested(slot.call.seq)
                add(_unknown(slot.call))
        add(StepEnd(turn=t, step=s))
    add(TurnEnd(turn=turn.turn, reason="interrupted", error=None))
    return closing


class _Slot:
    """One call the model asked for, paired by position with its tool/call and result (ids may repeat in old logs)."""

    __slots__ = ("request", "call", "done")

    def __init__(self, request: ToolCallRequest) -> None:
        self.request = request
        self.call: ToolCall | None = None
        self.done = False


def _unknown(call: ToolCall) -> ToolResult:
    return ToolResult(
        turn=call.turn, step=call.step, call_id=call.call_id, is_error=True,
        content=outcome_unknown_text(call.name, call.safety), error_code=TOOL_OUTCOME_UNKNOWN, source_seq=call.seq,
    )


def recovered_calls(events: list[AnyEvent]) -> list[ToolResult]:
    """Results that repair wrote for the most recent interrupted turn (what the resume screen lists)."""
    found: list[ToolResult] = []
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if isinstance(e, TurnStart):
            break
        if isinstance(e, ToolResult) and e.error_code in (TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN):
            found.append(e)
    found.reverse()
    return found


def calls_awaiting_verdict(events: list[AnyEvent]) -> list[ToolResult]:
    """OUTCOME_UNKNOWN results of the last interrupted turn that no `recovery/verdict` answers yet."""
    answered = {e.call_id for e in events if isinstance(e, RecoveryVerdict)}
    return [r for r in recovered_calls(events) if r.error_code == TOOL_OUTCOME_UNKNOWN and r.call_id not in answered]
