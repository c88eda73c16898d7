"""Property test for crash repair (SPEC §4): whatever event a crash stops after, repair leaves a well-formed log.

Sessions are generated as the loop would write them (turns of steps; assistant messages asking for 0-3 tool calls;
approvals, denials, tool/call + tool/result, nested calls up to two levels deep), cut after a random event, repaired,
and checked.
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn.persistence.events import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    RecoveryVerdict,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    encode_event,
)
from cairn.persistence.repair import repair_interrupted_turn

TOOLS = [("read_file", "read_only"), ("write_file", "idempotent"), ("run_command", "side_effecting")]


@st.composite
def sessions(draw) -> list[AnyEvent]:
    events: list[AnyEvent] = []
    ids = itertools.count(1)

    def emit(event: AnyEvent) -> AnyEvent:
        event.seq = len(events)
        event.time = 1_000 + 7 * len(events)
        events.append(event)
        return event

    def run_call(turn: int, step: int, call_id: str, name: str, safety: str, parent: str | None, depth: int) -> None:
        call = emit(ToolCall(turn=turn, step=step, call_id=call_id, name=name, arguments={"n": call_id},
                             safety=safety, parent_call_id=parent))
        if depth < 2:
            for _ in range(draw(st.integers(0, 2 if depth == 0 else 1))):
                nested_name, nested_safety = draw(st.sampled_from(TOOLS))
                run_call(turn, step, f"{call_id}.{next(ids)}", nested_name, nested_safety, call_id, depth + 1)
        emit(ToolResult(turn=turn, step=step, call_id=call_id, is_error=draw(st.booleans()), content="out",
                        error_code=None, source_seq=call.seq))

    for turn in range(1, draw(st.integers(1, 3)) + 1):
        if turn > 1 and draw(st.booleans()):
            emit(RecoveryVerdict(call_id="old", verdict="unknown", note=""))
        emit(TurnStart(turn=turn))
        steps = draw(st.integers(1, 3))
        for step in range(1, steps + 1):
            emit(StepStart(turn=turn, step=step))
            if step == 1:
                emit(UserMessage(turn=turn, step=step, text=f"prompt {turn}"))
            emit(RequestHeader(turn=turn, step=step, provider="demo", model="m", params={}, tools=[],
                               message_count=step))
            for _ in range(draw(st.integers(0, 2))):
                emit(AssistantChunk(turn=turn, step=step, delta="."))
            n_calls = draw(st.integers(0, 3)) if step < steps else 0  # the last step answers in text
            calls = [
                ToolCallRequest(f"c{next(ids)}", draw(st.sampled_from(TOOLS))[0], {"k": 1}) for _ in range(n_calls)
            ]
            emit(AssistantMessage(turn=turn, step=step, text="", tool_calls=calls,
                                  interrupted=not calls and draw(st.booleans())))
            for request in calls:
                safety = dict(TOOLS)[request.name]
                approval = "not-asked" if safety == "read_only" else draw(
                    st.sampled_from(["not-asked", "allowed_once", "allowed_session", "denied", "cancelled"])
                )
                if approval != "not-asked":
                    emit(ApprovalAsked(turn=turn, step=step, call_id=request.call_id))
                    emit(ApprovalDecided(turn=turn, step=step, call_id=request.call_id, decision=approval))
                if approval in ("denied", "cancelled"):
                    emit(ToolResult(turn=turn, step=step, call_id=request.call_id, is_error=True, content="no",
                                    error_code="DENIED", source_seq=None))
                else:
                    run_call(turn, step, request.call_id, request.name, safety, None, 0)
            emit(StepEnd(turn=turn, step=step))
        emit(TurnEnd(turn=turn, reason=draw(st.sampled_from(["completed", "cancelled", "error"])), error=None))

    # any boundary, but often right after a tool/call (a call running when the crash came), the richest place to stop
    after_a_call = [i + 1 for i, e in enumerate(events) if isinstance(e, ToolCall)]
    anywhere = st.integers(0, len(events))
    cut = draw(st.one_of(anywhere, st.sampled_from(after_a_call)) if after_a_call else anywhere)
    return events[:cut]


def check_well_formed(log: list[AnyEvent]) -> None:
    assert [e.seq for e in log] == list(range(len(log)))

    results = Counter(e.call_id for e in log if isinstance(e, ToolResult))
    named = [c.call_id for e in log if isinstance(e, AssistantMessage) for c in e.tool_calls]
    recorded = {e.call_id: e for e in log if isinstance(e, ToolCall)}
    for call_id in [*named, *recorded]:
        assert results[call_id] == 1, f"{call_id} has {results[call_id]} results"
    assert set(results) <= set(named) | set(recorded)

    position = {e.call_id: i for i, e in enumerate(log) if isinstance(e, ToolResult)}
    for call in recorded.values():
        result = log[position[call.call_id]]
        assert result.source_seq in (None, call.seq)
        if call.parent_call_id is not None:  # a nested call closes before the call that made it
            assert position[call.call_id] < position[call.parent_call_id]

    open_turn = open_step = None
    for e in log:
        if isinstance(e, TurnStart):
            assert open_turn is None
            open_turn = e.turn
        elif isinstance(e, StepStart):
            assert open_turn == e.turn and open_step is None
            open_step = e.step
        elif isinstance(e, StepEnd):
            assert (open_turn, open_step) == (e.turn, e.step)
            open_step = None
        elif isinstance(e, TurnEnd):
            assert open_turn == e.turn and open_step is None
            open_turn = None
    assert open_turn is None  # every turn/start has its turn/end
    if any(isinstance(e, TurnStart) for e in log):
        last_turn_end = max(i for i, e in enumerate(log) if isinstance(e, TurnEnd))
        assert all(isinstance(e, RecoveryVerdict) for e in log[last_turn_end + 1 :])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions())
def test_repair_leaves_a_well_formed_log(log):
    repair = repair_interrupted_turn(log)
    repaired = log + repair

    check_well_formed(repaired)

    ends_inside_a_turn = any(isinstance(e, TurnStart) for e in log) and not any(
        isinstance(e, TurnEnd) for e in log[max(i for i, e in enumerate(log) if isinstance(e, TurnStart)) :]
    )
    if not ends_inside_a_turn:
        assert repair == []
        return
    # nothing after the closing turn/end; times are the last event's; results classified by what was recorded
    assert isinstance(repair[-1], TurnEnd) and repair[-1].reason == "interrupted"
    assert all(e.time == log[-1].time for e in repair)
    recorded = {e.call_id: e for e in log if isinstance(e, ToolCall)}
    for result in (e for e in repair if isinstance(e, ToolResult)):
        assert result.is_error
        if result.call_id in recorded:
            assert (result.error_code, result.source_seq) == (TOOL_OUTCOME_UNKNOWN, recorded[result.call_id].seq)
        else:
            assert (result.error_code, result.source_seq) == (TOOL_NOT_STARTED, None)
    # top-level results come in the model's order
    message = next(e for e in reversed(log) if isinstance(e, AssistantMessage)) if any(
        isinstance(e, AssistantMessage) for e in log) else None
    top_level = [r.call_id for r in repair if isinstance(r, ToolResult)
                 and (r.call_id not in recorded or recorded[r.call_id].parent_call_id is None)]
    if top_level:
        order = [c.call_id for c in message.tool_calls]
        assert top_level == [c for c in order if c in top_level]

    assert repair_interrupted_turn(repaired) == []  # idempotent
    assert [encode_event(e) for e in repair_interrupted_turn(log)] == [encode_event(e) for e in repair]


# -- repeated ids: repair pairs by position and source_seq, never by id alone ----------------------------------------


class _Truth:
    """What the generator knows about each call, so the check does not share repair's own pairing logic."""

    def __init__(self) -> None:
        self.answers: dict[int, list[dict]] = {}  # index of an assistant/message -> its calls, in the model's order
        self.nested: list[dict] = []  # {"seq", "parent_seq", "result_at"}


@st.composite
def sessions_with_repeated_ids(draw) -> tuple[list[AnyEvent], _Truth]:
    """Like `sessions`, but ids come from a tiny pool, so a model repeats one within an answer and reuses earlier
    ones (as some servers and local models do); nested ids (`<parent>.<n>`) then collide too."""
    events: list[AnyEvent] = []
    truth = _Truth()
    fresh = itertools.count(1)

    def emit(event: AnyEvent) -> AnyEvent:
        event.seq, event.time = len(events), 1_000 + 3 * len(events)
        events.append(event)
        return event

    def run(turn: int, step: int, call_id: str, name: str, safety: str, parent: tuple[str, int] | None,
            depth: int) -> tuple[int, int]:
        call = emit(ToolCall(turn=turn, step=step, call_id=call_id, name=name, arguments={},
                             safety=safety, parent_call_id=parent[0] if parent else None))
        if depth < 2:
            for k in range(draw(st.integers(0, 1))):
                nested_name, nested_safety = draw(st.sampled_from(TOOLS))
                record = {"seq": None, "parent_seq": call.seq, "result_at": None}
                truth.nested.append(record)
                record["seq"], record["result_at"] = run(turn, step, f"{call_id}.{k + 1}", nested_name, nested_safety,
                                                         (call_id, call.seq), depth + 1)
        result = emit(ToolResult(turn=turn, step=step, call_id=call_id, is_error=False, content="out",
                                 error_code=None, source_seq=call.seq))
        return call.seq, result.seq

    for turn in range(1, draw(st.integers(1, 3)) + 1):
        emit(TurnStart(turn=turn))
        steps = draw(st.integers(1, 3))
        for step in range(1, steps + 1):
            emit(StepStart(turn=turn, step=step))
            if step == 1:
                emit(UserMessage(turn=turn, step=step, text="go"))
            n_calls = draw(st.integers(1, 3)) if step < steps else 0
            ids = [draw(st.sampled_from(["a", "a", "b", "a-dup", f"f{next(fresh)}"])) for _ in range(n_calls)]
            requests = [ToolCallRequest(i, draw(st.sampled_from(TOOLS))[0], {}) for i in ids]
            message = emit(AssistantMessage(turn=turn, step=step, text="", tool_calls=requests, interrupted=False))
            calls = truth.answers[message.seq] = []
            for request in requests:
                safety = dict(TOOLS)[request.name]
                record = {"call_id": request.call_id, "name": request.name, "call_seq": None, "result_at": None}
                calls.append(record)
                how = draw(st.sampled_from(["run", "run", "run", "denied", "unknown_tool"]))
                if how == "run" and safety != "read_only":
                    emit(ApprovalAsked(turn=turn, step=step, call_id=request.call_id))
                    emit(ApprovalDecided(turn=turn, step=step, call_id=request.call_id, decision="allowed_once"))
                if how == "run":
                    record["call_seq"], record["result_at"] = run(turn, step, request.call_id, request.name, safety,
                                                                  None, 0)
                else:
                    result = emit(ToolResult(turn=turn, step=step, call_id=request.call_id, is_error=True,
                                             content="no", error_code="DENIED" if how == "denied" else "UNKNOWN_TOOL",
                                             source_seq=None))
                    record["result_at"] = result.seq
            emit(StepEnd(turn=turn, step=step))
        emit(TurnEnd(turn=turn, reason="completed", error=None))

    after_a_call = [i + 1 for i, e in enumerate(events) if isinstance(e, ToolCall)]
    anywhere = st.integers(0, len(events))
    cut = draw(st.one_of(anywhere, st.sampled_from(after_a_call)) if after_a_call else anywhere)
    return events[:cut], truth


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions_with_repeated_ids())
def test_repair_gives_every_unanswered_call_exactly_one_result_even_when_ids_repeat(case):
    log, truth = case
    cut = len(log)
    repair = repair_interrupted_turn(log)
    repaired = log + repair
    assert [e.seq for e in repaired] == list(range(len(repaired)))

    # the open step (if the log ends inside a turn) and its answer, from what the generator wrote
    last_turn = max((i for i, e in enumerate(log) if isinstance(e, TurnStart)), default=None)
    if last_turn is None or any(isinstance(e, TurnEnd) for e in log[last_turn:]):
        assert repair == []
        return
    last_step = max((i for i, e in enumerate(log) if isinstance(e, StepStart) and i > last_turn), default=None)
    step_open = last_step is not None and not any(isinstance(e, StepEnd) for e in log[last_step:])
    answer_at = next((i for i in range(len(log) - 1, -1, -1) if isinstance(log[i], AssistantMessage)), None)
    calls = truth.answers[answer_at] if step_open and answer_at is not None and answer_at > last_step else []

    def missing(record: dict) -> bool:
        return record["result_at"] is None or record["result_at"] >= cut

    expected_top = [
        (r["call_id"], TOOL_OUTCOME_UNKNOWN, r["call_seq"]) if r["call_seq"] is not None and r["call_seq"] < cut
        else (r["call_id"], TOOL_NOT_STARTED, None)
        for r in calls if missing(r)
    ]
    top_seqs = {r["call_seq"] for r in calls if r["call_seq"] is not None}
    results = [e for e in repair if isinstance(e, ToolResult)]
    top = [r for r in results if r.source_seq is None or r.source_seq in top_seqs]
    assert [(r.call_id, r.error_code, r.source_seq) for r in top] == expected_top
    for r in top:
        if r.error_code == TOOL_OUTCOME_UNKNOWN:
            name = next(c["name"] for c in calls if c["call_seq"] == r.source_seq)
            assert r.content.startswith(f"TOOL_OUTCOME_UNKNOWN: Cairn stopped (crash or kill) while this call to `{name}`")

    # a nested call still running gets exactly one OUTCOME_UNKNOWN, before the result of the call that made it
    open_nested = [n for n in truth.nested if n["seq"] < cut and n["result_at"] >= cut]
    nested = [r for r in results if r not in top]
    assert sorted(r.source_seq for r in nested) == sorted(n["seq"] for n in open_nested)
    assert all(r.error_code == TOOL_OUTCOME_UNKNOWN for r in nested)
    where = {r.source_seq: i for i, r in enumerate(results)}
    for n in open_nested:
        assert where[n["seq"]] < where[n["parent_seq"]]

    assert isinstance(repair[-1], TurnEnd) and repair[-1].reason == "interrupted"
    assert repair_interrupted_turn(repaired) == []
    assert [encode_event(e) for e in repair_interrupted_turn(log)] == [encode_event(e) for e in repair]
