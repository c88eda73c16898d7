"""Crash repair (SPEC §4): from a log that ends inside a turn, the events that close it honestly.

A pure function of the loaded events, so the same log always repairs to the same bytes: every tool call of the open
step without a result gets one (NOT_STARTED when no `tool/call` was recorded, OUTCOME_UNKNOWN otherwise), then
`step/end` if a step is open, then `turn/end` with reason `interrupted`. New events continue `seq` and reuse the last
event's `time`.
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
    message: AssistantMessage | None = None
    calls: dict[str, ToolCall] = {}
    results: set[str] = set()
    for e in tail:
        if isinstance(e, StepStart):
            open_step, message, calls, results = e, None, {}, set()
        elif isinstance(e, StepEnd):
            open_step = None
        elif isinstance(e, AssistantMessage):
            message = e
        elif isinstance(e, ToolCall):
            calls[e.call_id] = e
        elif isinstance(e, ToolResult):
            results.add(e.call_id)

    last = events[-1]
    seq, time = last.seq + 1, last.time
    closing: list[AnyEvent] = []

    def add(event: AnyEvent) -> None:
        nonlocal seq
        event.seq, event.time = seq, time
        seq += 1
        closing.append(event)

    def close_nested(parent_id: str) -> None:
        """Nested calls it made (parent_call_id), at any depth, close before it does, innermost first."""
        for nested in calls.values():
            if nested.parent_call_id == parent_id and nested.call_id not in results:
                results.add(nested.call_id)  # before recursing, so a malformed parent cycle cannot loop forever
                close_nested(nested.call_id)
                add(_unknown(nested))

    if open_step is not None:
        t, s = open_step.turn, open_step.step
        if message is not None:
            for request in message.tool_calls:
                if request.call_id in results:
                    continue
                close_nested(request.call_id)
                call = calls.get(request.call_id)
                if call is None:
                    add(
                        ToolResult(
                            turn=t, step=s, call_id=request.call_id, is_error=True,
                            content=not_started_text(request.name), error_code=TOOL_NOT_STARTED, source_seq=None,
                        )
                    )
                else:
                    add(_unknown(call))
        add(StepEnd(turn=t, step=s))
    add(TurnEnd(turn=turn.turn, reason="interrupted", error=None))
    return closing


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
